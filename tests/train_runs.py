"""``raycpt train``'s own path for tests that train through Ray: the job's checks, the command's run, then
:func:`raycpt.train.driver.launch.run_training` inside it with the test's extras (faults, an in-worker evaluation,
local mode). The steps are :mod:`raycpt.jobs.train`'s (the CLI's): nothing here opens a run another way."""

from __future__ import annotations

from raycpt.jobs import train as train_job
from raycpt.jobs.job import Options
from raycpt.runs import command_run
from raycpt.train.driver.launch import run_training


def train_command(cfg, *, resume: bool = False, **extras):
    options = Options(resume=resume, progress=False)
    plan = train_job.prepare(cfg, options)
    spec = train_job.run_spec(plan, options)
    with spec.around, command_run(spec.cfg, spec.command, resume=resume, run_name=spec.name, params=spec.params,
                                  on_open=spec.on_open) as run:
        return run_training(plan.cfg, run, resume=resume, progress=False, **extras)
