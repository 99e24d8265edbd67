"""THE trial-grid driver of ``sweep``, ``contribution`` and ``hybrid run``.

A job hands :func:`run_grid` a list of typed trial specs (frozen dataclasses with a ``name`` and a
``run(trial)`` method: the trial body); the driver does everything else, once:

- one nested *child* run per trial (:func:`raycpt.runs.run.open_child`, whose id the trial keeps in
  ``<trial>/trial.json``) under the job's run (:func:`raycpt.runs.run.command_run` owns that run, its end
  status and the children left RUNNING); the parent's records name the trials' folders, so ``raycpt runs sync``
  finds them;
- the Ray Tune grid: a placement group per trial (one bundle for the trial driver, one for the Ray
  Data tasks it launches), ``Tuner`` created or restored (``--resume`` finishes unfinished trials),
  results collected from the Tune ``ResultGrid``; or, for jobs whose trials place their own Ray work
  (``hybrid run``), the same trials one after the other in this process;
- progress (:class:`raycpt.report.progress.TrialsProgress`) and interruption: the command ends in one
  line that says "continue with --resume".

A trial's config crosses the Ray boundary once, as a plain dict in ``param_space``, and is validated
when rebuilt (:func:`raycpt.config.config_from_dict`); so is its spec (``dataclasses.asdict`` and back).
A finished trial (``<trial>/result.json``) is never redone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from unittest import mock

from raycpt.cluster import preflight
from raycpt.config import ExperimentConfig, config_from_dict, config_to_dict
from raycpt.data.corpus import heldout_blocks as corpus_heldout_blocks
from raycpt.errors import RaycptError
from raycpt.jobs.base_row import evaluation_words
from raycpt.models.shards import trust_checked
from raycpt.models.sources import resolve_model_path
from raycpt.progress import write_phase
from raycpt.report.progress import TrialsProgress
from raycpt.runs.folder import AttemptClock, assert_private_folder, memo, read_memo
from raycpt.runs.location import RunLocation, from_dict
from raycpt.runs.run import open_child
from raycpt.runtime import ray_starting
from raycpt.runs.lost import adopt_lost, mark_lost, store_or_lost, tracking_lost
from raycpt.data.run_store import packed_corpus
from raycpt.train.driver.failures import TRIAL_MAX_FAILURES, worker_death
from raycpt.train.driver.final_eval import final_evaluation
from raycpt.train.driver.launch import run_training
from raycpt.train.driver.publish import base_shards_ahead
from raycpt.train.worker.evaluation import EvalRequest

RESULT = "result.json"
SHARDS_CHECKED = "base_shards_checked"
"""The ``Grid.shared`` key of the base shards the driver verified (:func:`raycpt.train.driver.publish.base_shards_ahead`)."""


class GridIncomplete(RaycptError):
    """Some trials did not finish: failed (``status`` FAILED) or interrupted (KILLED, exit code 130)."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status
        self.exit_code = 130 if status == "KILLED" else 2


@dataclass
class Grid:
    """What a job asks of the driver: its trials (typed specs: frozen dataclasses with ``name`` and
    ``run(trial) -> dict``) and where and how they run."""

    command: str  # sweep, contribution, hybrid: the MLflow ``raycpt.command`` tag and the message prefix
    specs: list
    params: dict = field(default_factory=dict)  # parameters of the parent run (besides the config)
    shared: dict = field(default_factory=dict)  # JSON-able values every trial gets, e.g. the held-out blocks file
    folder: str = "trials"  # trials live in <run_dir>/<folder>/<name>
    meta_file: str = "trial.json"  # the file in a trial's folder that keeps its MLflow run id
    name_tag: str = "raycpt.trial"  # the child run's tag holding the trial name
    cpus: float = 1.0  # CPUs of the trial driver's bundle (Tune only)
    data_cpus: float = 0.0  # CPUs of a second bundle for the Ray Data tasks a trial launches (0 = none)
    resources: dict = field(default_factory=dict)  # extra Ray resources in the trial's bundle (sweep.trial_resources)
    max_concurrent: int = 1  # Tune trials running at once
    inline: bool = False  # run the trials one after the other in this process instead of as Tune trials
    max_steps: int = 0  # steps per trial, for the progress line
    model_path: Optional[str] = None  # set: pack the corpus once (tokenizer of this model) before any trial
    tune_name: str = "tune"  # the Tune experiment folder, <run_dir>/<tune_name> (a job's second grid: another name)


@dataclass
class Trial:
    """What a trial body gets."""

    cfg: ExperimentConfig
    dir: Path
    run: Any
    """Its :class:`raycpt.runs.run.Run` (``run_id``, ``created``, ``elapsed``, ``meta``; ``log_*`` into its folder)."""
    parent_run_id: str
    shared: dict
    threads: Optional[int] = None
    """CPUs this trial reserved (torch threads of an evaluation in the trial process); None = inline."""
    console: Any = None
    clock: Any = None
    """Its :class:`raycpt.runs.folder.AttemptClock`: ``clock.elapsed`` sums every attempt, killed ones included."""

    @property
    def elapsed(self) -> float:
        """Seconds this trial has run over all its attempts."""
        return self.clock.elapsed if self.clock is not None else self.run.elapsed


def grid_params(specs, params: Optional[dict] = None) -> dict:
    """The parent run's parameters of a grid job: its trial names and the job's own ``params``."""
    return {"trials": ",".join(s.name for s in specs)[:500], **(params or {})}


# ------------------------------------------------------------------------------------- one trial
def spec_name(cls) -> str:
    """``module:QualName`` of a spec class: what crosses into Tune's ``param_space``. A class there does not
    survive ``Tuner.restore`` when the driver was killed before Tune saved the trial (its search generator's
    saved state gives it back as a tuple), a name does."""
    return f"{cls.__module__}:{cls.__qualname__}"


def spec_class(name):
    """The spec class :func:`spec_name` named (a class is returned as it is)."""
    if not isinstance(name, str):
        return name
    module, _, qual = name.partition(":")
    obj = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def run_trial(config: dict) -> dict:
    """One trial from its ``param_space`` entry (in a Tune trial, or inline): rebuild and validate the
    config and the spec, skip a finished trial, open its child run, run the body, keep its result."""
    cfg = config_from_dict(config["cfg"])
    spec = spec_class(config["spec_type"])(**config["spec"])
    tdir = Path(config["trials_root"]) / spec.name
    tdir.mkdir(parents=True, exist_ok=True)
    return memo(tdir / RESULT, lambda: _trial_body(config, cfg, spec, tdir))  # a finished trial is never redone


def _trial_body(config: dict, cfg: ExperimentConfig, spec, tdir: Path) -> dict:
    """The trial under its child run. A tracking server gone (before or during the trial) does not fail it: the
    trial runs locally and the job's folder gets the record (:data:`raycpt.runs.lost.LOST_FILE`), which the driver
    adopts (:func:`run_grid`); ``raycpt runs sync JOB_DIR`` replays it later."""
    trust_checked(config["shared"].get(SHARDS_CHECKED))  # the base shards the driver verified for this command
    job_dir = Path(config["trials_root"]).parent
    where = from_dict(config["location"])  # the command's, carried from the driver
    exp_id = store_or_lost(where, job_dir, config.get("started", 0.0))
    label = getattr(spec, "label", None) or spec.name
    child = open_child(cfg, config["command"], tdir, config["meta_file"], exp_id, config["parent_run_id"], label,
                       tags={"raycpt.command": config["command"], config["name_tag"]: spec.name},
                       meta={"spec": config["spec"]}, location=where)
    with child as run, AttemptClock(tdir / "attempts.json") as clock:
        trial = Trial(cfg=cfg, dir=tdir, run=run, parent_run_id=config["parent_run_id"], shared=config["shared"],
                      threads=config.get("threads"), console=config.get("console"), clock=clock)
        result = spec.run(trial)
    lost = tracking_lost()
    if lost:  # the driver's record (a trial process may be the only one that saw the server go)
        mark_lost(lost["uri"], lost.get("since_step"), lost.get("error", ""), job_dir)
    return result


def tune_trainable(config: dict) -> None:
    """The Tune function trainable of every grid: one trial; reports its result."""
    from ray import tune

    tune.report({"done": 1, "result": run_trial(config)})


# ------------------------------------------------------------------------------------- the driver
def warm_imports() -> None:
    """Import what a grid command's driver needs once Ray is up: Ray Tune, and matplotlib (Agg) and scipy.stats
    for the report (about 1.1 s here, measured). A grid job passes it as :func:`raycpt.runtime.ray_session`'s
    ``meanwhile``: it runs while the job's Ray is still starting, where the driver would otherwise wait."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import ray.tune  # noqa: F401
    import scipy.stats  # noqa: F401


@contextlib.contextmanager
def ahead_of_trials(plan, where: RunLocation):
    """The :class:`raycpt.jobs.job.RunSpec` ``around`` of a grid command (sweep, contribution): its checks passed,
    so Ray starts and the base shards are written while the MLflow run opens (issue 28); inside, ``plan.shards_ready()``
    waits for the shards and returns the verified folders (:func:`raycpt.train.driver.publish.base_shards_ahead`,
    under ``where``, the command's location)."""
    with ray_starting(plan.cfg.ray), base_shards_ahead(plan.cfg, plan.model_path, where.base_shards) as ready:
        plan.shards_ready = ready
        yield


def no_shards() -> dict:
    """``shards_ready`` of a plan outside :func:`ahead_of_trials`: no base shards verified ahead."""
    return {}


def run_grid(parent, grid: Grid, resume: bool = False, console=None) -> dict[str, dict]:
    """Run every trial of ``grid`` under ``parent`` (the job's :class:`raycpt.runs.run.Run`; Ray must be up,
    unless ``grid.inline``) and return ``{name: result}`` in spec order.

    Raises :class:`GridIncomplete` (one line ending in "continue with --resume") when a trial did not
    finish; :func:`raycpt.runs.run.command_run` then ends the unfinished children and itself KILLED or FAILED."""
    cfg, run_dir = parent.cfg, parent.run_dir
    names = [s.name for s in grid.specs]
    space = {"cfg": config_to_dict(cfg), "spec_type": spec_name(type(grid.specs[0])),
             "trials_root": str(run_dir / grid.folder),
             "parent_run_id": parent.run_id, "shared": grid.shared, "command": grid.command,
             "meta_file": grid.meta_file, "name_tag": grid.name_tag, "started": time.time(),
             "location": parent.location.as_dict()}
    if console is not None:
        console.print(f"{grid.command}: {len(names)} trials ({', '.join(names)}) -> {run_dir}")
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    parent.note_children([(run_dir / grid.folder / n, grid.meta_file) for n in names])  # where the sync finds them
    preflight(parent.location, grid.max_concurrent)  # shared storage on every node; the SQLite-with-concurrency warning
    if grid.model_path is not None:
        # pack once; every trial then reads the store
        packed_corpus(cfg, grid.model_path, parent.location.root, quiet=console is None)
    interrupted = False
    try:
        if grid.inline:
            for s in grid.specs:
                _inline_trial({**space, "spec": dataclasses.asdict(s), "console": console}, results, errors)
        else:
            results, errors = _fit(run_dir, grid, space, resume, console)
    except KeyboardInterrupt:  # Ctrl-C: the unfinished trials end KILLED, and one line says how to go on
        interrupted = True
    except Exception as e:  # noqa: BLE001 - a worker death that escaped Tune: the unfinished trials failed
        cause = worker_death(e)
        if cause is None:
            raise
        results = {**_finished(run_dir / grid.folder, names), **results}
        errors = {n: cause for n in names if n not in results}
    adopt_lost(run_dir, space["started"])  # a trial found the tracking server gone: the rest of the job is local
    results, missing = unfinished(run_dir / grid.folder, names, results)
    if interrupted and not missing:  # stopped after its last trial: the command still ends interrupted, and says so
        raise GridIncomplete(f"{grid.command} interrupted after all {len(names)} trials finished (none to run again); "
                             f"continue with --resume ({run_dir}): {resume_command(grid.command)}", "KILLED")
    if missing:
        status = "FAILED" if errors else "KILLED"  # no trial error: Tune (or the user) stopped the grid
        why = f" ({'; '.join(f'{n}: {e}' for n, e in errors.items())})" if errors else ""
        raise GridIncomplete(f"{grid.command} {'interrupted' if status == 'KILLED' else 'incomplete'}: "
                             f"{', '.join(missing)} did not finish{why}; continue with --resume ({run_dir}): "
                             f"{resume_command(grid.command)}", status)
    return {n: results[n] for n in names}


def resume_command(command: str) -> str:
    """The command line that continues this one: the console script's own arguments plus ``--resume`` (a library
    caller: ``raycpt <command> <its config> --resume``)."""
    if Path(sys.argv[0]).name in ("raycpt", "__main__.py") and command in sys.argv[1:]:
        args = [a for a in sys.argv[1:] if a != "--resume"]
        return shlex.join(["raycpt", *args, "--resume"])
    return f"raycpt {command} <its config> --resume"


def _inline_trial(config: dict, results: dict, errors: dict) -> None:
    """One inline trial, retried up to :data:`TRIAL_MAX_FAILURES` times when its work's process dies (Ray's memory
    monitor, a SIGKILL: :func:`raycpt.train.driver.failures.worker_death`), then recorded as that trial's failure so
    the grid goes on; any other error ends the grid as before."""
    name = config["spec"]["name"]
    for attempt in range(TRIAL_MAX_FAILURES + 1):
        try:
            results[name] = run_trial(config)
            return
        except Exception as e:  # noqa: BLE001 - only a worker death is the trial's failure; the rest is raised
            cause = worker_death(e)
            if cause is None:
                raise
            errors[name] = f"{cause}, {attempt + 1} attempt(s)"


def unfinished(trials_root: Path, names: list[str], results: dict) -> tuple[dict, list[str]]:
    """``(results, missing)``: the grid's results, those the driver collected and every trial whose ``result.json`` is
    on disk (a trial that finished is known by its file, whatever the driver saw before it stopped: an interrupt
    during Tune's wind-down leaves it nothing), and the names of the trials that did not finish, in grid order."""
    results = {**_finished(trials_root, [n for n in names if n not in results]), **results}
    return results, [n for n in names if n not in results]


def _finished(trials_root: Path, names: list[str]) -> dict:
    """The trials whose ``result.json`` is on disk and verifies (what finished before the grid's driver lost Tune;
    :func:`raycpt.runs.folder.read_memo`, the check :func:`run_trial`'s memo makes before it skips a trial)."""
    out = {}
    for n in names:
        doc = read_memo(trials_root / n / RESULT) if (trials_root / n / RESULT).exists() else None
        if doc is not None:
            out[n] = doc
    return out


def _fit(run_dir: Path, grid: Grid, space: dict, resume: bool, console) -> tuple[dict, dict]:
    """Create (or restore) the Tuner, fit it with the progress bar, collect the ``ResultGrid``."""
    from ray import tune

    bundles = [{"CPU": grid.cpus, **grid.resources}]
    if grid.data_cpus > 0:  # Ray Data tasks also ask for a little "memory": the bundle must hold some
        bundles.append({"CPU": grid.data_cpus, "memory": 1 << 30})
    trainable = tune.with_resources(tune_trainable, tune.PlacementGroupFactory(bundles))
    tune_path = run_dir / grid.tune_name
    if resume and tune_path.exists() and tune.Tuner.can_restore(str(assert_private_folder(tune_path))):
        tuner = tune.Tuner.restore(str(tune_path), trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        threads = max(1, int(grid.cpus + grid.data_cpus))
        param_space = {**space, "threads": threads,
                       "spec": tune.grid_search([dataclasses.asdict(s) for s in grid.specs])}
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            # reuse_actors: later trials skip the imports and keep the lm-eval task manager
            tune_config=tune.TuneConfig(max_concurrent_trials=grid.max_concurrent, reuse_actors=True,
                                        trial_dirname_creator=lambda t: t.config["spec"]["name"],
                                        trial_name_creator=lambda t: t.config["spec"]["name"]),
            run_config=tune.RunConfig(name=grid.tune_name, storage_path=str(run_dir), verbose=0,
                                      failure_config=tune.FailureConfig(max_failures=TRIAL_MAX_FAILURES)))
    # Tune's console reporter off (verbose=0 alone still prints its experiment box and paths): the grid shows
    # its own per-trial progress, and the Tune results stay under <run>/tune
    progress = TrialsProgress(run_dir / grid.folder, [s.name for s in grid.specs], grid.max_steps, console)
    with mock.patch.dict(os.environ, {"RAY_AIR_NEW_OUTPUT": "0"}), progress:
        result_grid = tuner.fit()
    results, errors = {}, {}
    for r in result_grid:
        name = r.config["spec"]["name"]
        if r.metrics and r.metrics.get("done"):
            results[name] = r.metrics["result"]
        elif r.error is not None:
            lines = [ln for ln in str(r.error).splitlines() if ln.strip()]
            death = worker_death(r.error)
            errors[name] = f"{death}, {TRIAL_MAX_FAILURES + 1} attempt(s)" if death else \
                lines[-1][:200] if lines else type(r.error).__name__
    return results, errors


# ------------------------------------------------------------------------------------- trial helpers
def train_and_evaluate(trial: Trial, tcfg: ExperimentConfig, name: str, progress: bool = False):
    """Train ``tcfg`` in the trial's ``train/`` folder under its child run; the training worker evaluates
    the final weights (its GPU on a cluster). ``(TrainResult, EvalResult, held-out loss or None)``."""
    req = EvalRequest(out_dir=str(trial.dir / "eval"), name=name, heldout_path=trial.shared.get("heldout_path"),
                      validation_path=trial.shared.get("validation_path"),
                      general_path=trial.shared.get("general_path"))
    tdir = trial.dir / "train"
    write_phase(trial.dir, "starting", evaluation=evaluation_words(tcfg, trial.shared))  # the line's evaluating words
    train = run_training(tcfg, trial.run, run_dir=tdir,
                         resume=(tdir / "state.json").exists() or (tdir / "ray").exists(), name=name,
                         progress=progress, evaluate=req, in_process=trial.threads is not None)
    ev, heldout = final_evaluation(train.final_model_dir, tcfg.eval, req, threads=trial.threads)
    return train, ev, heldout


def model_layers(cfg: ExperimentConfig) -> tuple[str, int]:
    """(resolved model folder, number of decoder layers), read from its config (no weights loaded)."""
    from transformers import AutoConfig

    path = resolve_model_path(cfg.model, progress=True)
    conf = AutoConfig.from_pretrained(path)
    n = int(getattr(conf, "num_hidden_layers", 0) or getattr(conf, "n_layer", 0) or 0)
    if n < 1:
        raise RaycptError(f"model {cfg.model.ref}: cannot read its number of decoder layers")
    return path, n


def heldout_blocks(cfg: ExperimentConfig, model_path: str, num_docs: int, setting: str, raise_key: str):
    """The held-out token blocks (documents after the first ``data.max_documents``, never trained on)."""
    if cfg.data.max_documents is None:
        raise RaycptError(f"{setting} needs data.max_documents: the held-out documents are the ones after the "
                          "first data.max_documents, which training never reads")
    return corpus_heldout_blocks(cfg.data, model_path, num_docs, setting=setting, raise_key=raise_key)
