"""THE shape of a command (torchtune's recipe protocol) and THE runner under every one of them.

A :class:`Job` has three steps, the same for every command::

    prepare(cfg, options) -> plan         every check a user can get wrong: no run folder, no MLflow run (one line)
    run_spec(plan, options) -> RunSpec    what its command run needs (command, run name, params, on_open, around);
                                          None: this invocation runs no experiment (no run folder, no MLflow run)
    execute(plan, run, options) -> result the work, inside the command's :class:`raycpt.runs.run.Run` (None without one)

:func:`run_job` does prepare -> run (:func:`raycpt.runs.run.command_run`) -> execute and returns the result; the CLI
renders it (:mod:`raycpt.report.render`). What a command line (or a library caller) gives a job besides the config
is one :class:`Options`. Most jobs are :class:`Steps` (their three functions); a command that runs no experiment
(``config show``, ``models pull``, ``ui``, ...) is a :class:`NoRun`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional, Protocol, runtime_checkable

from raycpt.config import ExperimentConfig
from raycpt.runs.location import RunLocation, checked, locate
from raycpt.runs.run import Run, command_run


@dataclass
class Options:
    """What a job is given besides the config: the same object from the CLI (one row's options) and from a library
    caller (``run_sweep(cfg, resume=..., console=...)``)."""

    console: Any = None
    """Where the job prints its progress and memory estimates (a rich Console); None: quiet."""
    resume: bool = False
    """``--resume``: continue the newest run of this command and config."""
    progress: bool = True
    """Progress bars on stderr."""
    config_path: Optional[str] = None
    """The CONFIG.yaml of the command line (None: the built-in default)."""
    rest: tuple = ()
    """The positional words that are neither CONFIG nor overrides (compare's BASE TUNED, models pull's REF)."""
    run_dir: Optional[Path] = None
    """The run folder to use instead of a new one (a sweep's ``trace/``)."""
    parent: Optional[Run] = None
    """The run the command's run nests under (a sweep's run for its trace)."""
    values: dict = field(default_factory=dict)
    """The row's keyword options that set no config key (``--sweep``, ``--checkpoints``, ``--out``, ...)."""
    location: Optional[RunLocation] = None
    """Where the command's runs live, resolved once (the command line makes it as it loads the config, its store
    checked; a nested command gets its parent's); None: made by :meth:`located` when first needed."""

    def get(self, name: str, default=None):
        """The keyword option ``name`` (``default`` when not given)."""
        value = self.values.get(name)
        return default if value is None else value

    def located(self, cfg: ExperimentConfig, check: bool = True) -> RunLocation:
        """:attr:`location`, made from ``cfg.tracking`` the first time a job needs it when the caller gave none (a
        library caller); with ``check``, its store checked (once: :func:`raycpt.runs.location.checked`). A job's
        ``prepare`` reads paths without ``check``: a library caller's store is checked as its run opens."""
        if self.location is None:
            self.location = locate(cfg.tracking, check=check)
        elif check:
            self.location = checked(self.location)
        return self.location


@dataclass
class RunSpec:
    """What a job's command run needs: :func:`raycpt.runs.run.command_run`'s arguments besides the options' resume,
    run_dir and parent, and the context that wraps the run while it opens (``around``: a grid's Ray starts and its
    base shards are written then, issue 28)."""

    cfg: ExperimentConfig
    """The config the run folder saves (the plan's effective one)."""
    command: str
    """The run folder's prefix and the MLflow ``raycpt.command`` tag (``sweep``, ``hybrid``, ...)."""
    name: Optional[str] = None
    """The MLflow run name (None: the folder's name)."""
    params: Optional[dict] = None
    """The job's own params, logged once with the config."""
    on_open: Optional[Callable[[Path], None]] = None
    """May refuse the opened folder (one line) before anything is logged (``train --resume``)."""
    around: ContextManager = field(default_factory=contextlib.nullcontext)
    """Entered before the run opens, left after it ends."""


@runtime_checkable
class Job(Protocol):
    """One command's work in three steps (see the module docstring)."""

    def prepare(self, cfg: ExperimentConfig, options: Options) -> Any: ...

    def run_spec(self, plan: Any, options: Options) -> Optional[RunSpec]: ...

    def execute(self, plan: Any, run: Optional[Run], options: Options) -> Any: ...


def no_run(plan: Any, options: Options) -> None:
    """The ``run_spec`` of a job that runs no experiment."""
    return None


def loaded(cfg: ExperimentConfig, options: Options) -> ExperimentConfig:
    """The ``prepare`` of a job whose only check is the config loading: the config is the plan."""
    return cfg


@dataclass(eq=False)
class Steps:
    """A :class:`Job` made of its three functions."""

    prepare: Callable[[ExperimentConfig, Options], Any]
    execute: Callable[[Any, Optional[Run], Options], Any]
    run_spec: Callable[[Any, Options], Optional[RunSpec]] = no_run


@dataclass(eq=False)
class NoRun:
    """The :class:`Job` of a command that runs no experiment: no run folder of its own, no MLflow run.
    ``work(plan, options)`` is all of it, after ``prepare`` (default: the loaded config is the plan)."""

    work: Callable[[Any, Options], Any]
    prepare: Callable[[ExperimentConfig, Options], Any] = loaded

    def run_spec(self, plan: Any, options: Options) -> None:
        return None

    def execute(self, plan: Any, run: None, options: Options) -> Any:
        return self.work(plan, options)


def run_job(job: Job, cfg: ExperimentConfig, options: Optional[Options] = None) -> Any:
    """THE path of every command: ``prepare`` (no run folder yet) -> the command's run (:func:`raycpt.runs.run.command_run`
    inside the spec's ``around``; ``options.run_dir`` / ``options.parent`` for a command nested in another) ->
    ``execute`` in it; returns the result (the CLI renders it)."""
    options = options if options is not None else Options()
    plan = job.prepare(cfg, options)
    spec = job.run_spec(plan, options)
    if spec is None:
        return job.execute(plan, None, options)
    with spec.around, command_run(spec.cfg, spec.command, options.located(spec.cfg), resume=options.resume,
                                  run_dir=options.run_dir, parent=options.parent, run_name=spec.name,
                                  params=spec.params, on_open=spec.on_open,
                                  accept_damage=bool(options.get("accept_damage"))) as run:
        return job.execute(plan, run, options)
