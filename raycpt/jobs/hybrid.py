"""``raycpt hybrid build`` and ``raycpt hybrid run``: the paper's hybrid case study (section 6).

:func:`build_hybrids` resolves every build of ``cfg.hybrid`` against its donors (configs only, so
a bad spec fails before anything is written), assembles each with
:func:`raycpt.models.hybrid.model.build_hybrid` and saves it (safetensors + the donor's tokenizer) with
its segment map (``segment_map.json``).

:func:`run_hybrid` does, for every build (``new_shallow`` and ``new_deep`` by default), in one run
folder, as a grid of :mod:`raycpt.jobs.grid` (:class:`HybridBuild` trials, run one after the other in this
process: each places its own Ray Train workers and trace actors) under one MLflow *parent* run with one
*child* run per build:

1. build and save the hybrid (``builds/<build>/initial``);
2. train it with Ray Train (:func:`raycpt.train.driver.launch.run_training`) on ``cfg.data`` with the plan
   its segments define - a ``layers`` plan listing the layers of the trainable segments
   (``plan.train_embeddings`` / ``train_final_norm`` / ``train_head`` are kept from the config);
3. evaluate it: its training worker evaluates the final weights (both modes) right after training;
4. trace it (:func:`raycpt.jobs.trace.run_trace`, nested under the build's child run);

then reports the paper's Table-4 layout (rows = builds, columns = categories + Average, cells
``Generate / Logit``) in the terminal, in ``hybrid_table.txt`` / ``.csv`` and in the parent run, with
each build's trace plots beside it (child run artifacts ``trace/``, parent ``trace/<build>/``) and
``hybrid_profiles.png`` (both builds' TP / LS profiles over their segment maps).

Resume (``--resume``): a build whose ``result.json`` exists is not redone; otherwise its saved
hybrid, its training run (from the last checkpoint) and its MLflow child run are reused.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig, HybridConfig
from raycpt.errors import RaycptError
from raycpt.evaluate import resolve_eval_tasks
from raycpt.evaluate.results import EvalResult
from raycpt.evaluate_prefetch import prefetch_hub_datasets
from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.jobs.grid import Grid, Trial, grid_params, run_grid, train_and_evaluate
from raycpt.jobs.job import NoRun, Options, RunSpec, Steps, run_job
from raycpt.jobs.trace import run_trace
from raycpt.models.hybrid.build import build_hybrid, param_counts, save_hybrid, segment_rows
from raycpt.models.hybrid.plans import plan_from_config
from raycpt.report.eval import render_table, table_text, write_results
from raycpt.report.hybrid import plot_profiles
from raycpt.runs.folder import open_run_dir, read_state, refuse_existing_outputs
from raycpt.runtime import ray_session
from raycpt.train.driver.preflight import full_plan, preflight

SEGMENT_MAP = "segment_map.json"


@dataclass
class BuiltHybrid:
    """A saved hybrid and its segment map."""

    build: str
    display: str
    folder: Path
    rows: list[dict]
    counts: dict
    trainable_layers: list[int]
    layer_kinds: list[str]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["folder"] = str(self.folder)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BuiltHybrid":
        return cls(**{**d, "folder": Path(d["folder"])})


def hybrid_section(cfg: ExperimentConfig) -> HybridConfig:
    """``cfg.hybrid``, or the defaults (donor = ``model.ref``, both shorthands, Mamba2) when absent."""
    return cfg.hybrid if cfg.hybrid is not None else HybridConfig()


def display_name(plan) -> str:
    """Paper-style name from the layer kinds in order, e.g. ``mamba2-llama`` (Nemotron-Qwen3)."""
    kinds: list[str] = []
    for s in plan.segments:
        if not kinds or kinds[-1] != s.kind:
            kinds.append(s.kind)
    return "-".join(kinds)


def plan_builds(cfg: ExperimentConfig, builds: Optional[list[str]] = None) -> list:
    """Resolve (and so validate) every requested build; no weights are loaded."""
    hcfg = hybrid_section(cfg)
    names = list(builds or hcfg.builds)
    for b in names:
        if b not in ("new_shallow", "new_deep", "custom"):
            raise RaycptError(f"hybrid build {b!r}: unknown; use new_shallow, new_deep or custom")
        if b == "custom" and not hcfg.segments:
            raise RaycptError("hybrid.segments=[]: the custom build needs at least one segment "
                              "({donor, layers: [start, end)} or {new: KIND, count: N})")
    return [plan_from_config(hcfg, b, cfg.model.ref, cfg.model) for b in dict.fromkeys(names)]


def build_one(plan, folder: Path, progress: bool = False) -> BuiltHybrid:
    """Assemble ``plan`` and save it to ``folder`` (reused when already there)."""
    folder = Path(folder)
    saved = folder / SEGMENT_MAP
    if saved.is_file() and (folder / "config.json").is_file():
        return BuiltHybrid.from_dict(json.loads(saved.read_text()))

    model, tok = build_hybrid(plan, progress=progress)
    built = BuiltHybrid(build=plan.name, display=display_name(plan), folder=folder, rows=segment_rows(model),
                        counts=param_counts(model), trainable_layers=list(model.config.trainable_layers),
                        layer_kinds=list(model.config.layer_kinds))
    save_hybrid(model, tok, folder)
    atomic_write_json(saved, built.to_dict())
    return built


def refuse_files_in_the_way(root: Path, folders) -> None:
    """One line, before anything is built, when ``--out`` or one of its build folders is a file: ``--overwrite``
    replaces a build folder, never a file of the user's."""
    for p in [root, *folders]:
        if p.exists() and not p.is_dir():
            raise RaycptError(f"--out: {p} is a file, not a folder: nothing was written; a build is a folder "
                              "(--overwrite replaces only folders): move the file or choose another --out")
    for parent in root.parents:
        if parent.exists() and not parent.is_dir():
            raise RaycptError(f"--out {root}: {parent} is a file, not a folder: nothing was written")


@dataclass
class BuildPlan:
    """What ``hybrid build`` checked: the config and every requested build's plan."""

    cfg: ExperimentConfig
    plans: list


def _plan_build(cfg: ExperimentConfig, options: Options) -> BuildPlan:
    return BuildPlan(cfg, plan_builds(cfg, options.get("builds")))


def _build(plan: BuildPlan, options: Options) -> tuple[Path, list[BuiltHybrid]]:
    """Write every build under ``--out``/<build>/ (default: a new run folder); an existing non-empty one is replaced
    only with ``--overwrite``."""
    cfg, plans, out, progress = plan.cfg, plan.plans, options.get("out"), options.progress
    if out is None:
        root = open_run_dir(cfg, "hybrid-build", options.located(cfg))
    else:
        root = Path(out).expanduser().resolve()
        refuse_files_in_the_way(root, [root / p.name for p in plans])
        refuse_existing_outputs([root / p.name for p in plans], bool(options.get("overwrite")), "--overwrite")
        root.mkdir(parents=True, exist_ok=True)
    built = [build_one(p, root / p.name, progress=progress) for p in plans]
    return root, built


HYBRID_BUILD = NoRun(_build, prepare=_plan_build)
"""``raycpt hybrid build``: a command that runs no experiment (its builds go into a folder, no MLflow run)."""


def build_hybrids(cfg: ExperimentConfig, builds: Optional[list[str]] = None, out: Optional[str] = None,
                  progress: bool = True, overwrite: bool = False) -> tuple[Path, list[BuiltHybrid]]:
    """``raycpt hybrid build``: write every build under ``out/<build>/`` (default: a new run folder).
    An existing non-empty ``out/<build>/`` is replaced only with ``overwrite``."""
    return run_job(HYBRID_BUILD, cfg, Options(progress=progress,
                                              values={"builds": builds, "out": out, "overwrite": overwrite}))


def hybrid_train_config(cfg: ExperimentConfig, built: BuiltHybrid) -> ExperimentConfig:
    """``cfg`` with the built hybrid as the model and its segments' trainable flags as a ``layers`` plan."""
    plan = dataclasses.replace(cfg.plan, name="layers", layers=list(built.trainable_layers))
    model = dataclasses.replace(cfg.model, ref=str(built.folder))
    return dataclasses.replace(cfg, model=model, plan=plan)


# ------------------------------------------------------------------------------------------------ run
@dataclass(frozen=True)
class HybridBuild:
    """One build of ``hybrid run`` (a grid trial): ``name`` = the build, ``label`` = its paper-style name."""

    name: str
    label: str

    def run(self, trial: Trial) -> dict:
        """Build, train, evaluate and trace this build inside its child run."""
        plan, console, progress = plan_builds(trial.cfg, [self.name])[0], trial.console, trial.shared["progress"]
        say = console.print if console is not None else (lambda *a, **k: None)
        say(f"[bold]{self.label}[/bold]: build")
        built = build_one(plan, trial.dir / "initial", progress=progress)
        _log_build_params(trial.run, built)
        tcfg = hybrid_train_config(trial.cfg, built)
        say(f"[bold]{self.label}[/bold]: train layers {built.trainable_layers} ({tcfg.train.max_steps} steps)")
        train, ev, _ = train_and_evaluate(trial, tcfg, self.label, progress=progress)
        final = Path(train.final_model_dir)
        atomic_write_json(trial.dir / "eval_result.json", ev.to_dict())
        say(f"[bold]{self.label}[/bold]: trace")
        trace_cfg = dataclasses.replace(tcfg, model=dataclasses.replace(tcfg.model, ref=str(final)))
        tr = run_trace(trace_cfg, run_dir=trial.dir / "trace", parent=trial.run, progress=progress)
        result = {
            "build": plan.name, "display": display_name(plan), "name": self.label, "initial_dir": str(built.folder),
            "final_model_dir": str(final), "trainable_layers": built.trainable_layers,
            "layer_kinds": built.layer_kinds, "rows": built.rows, "counts": built.counts,
            "losses": list(map(float, train.losses)),
            "final_loss": float(train.losses[-1]) if train.losses else float("nan"),
            "eval": ev.to_dict(), "metrics": ev.metrics(),
            "trace": {"run_dir": str(tr.run_dir), "tp_norm": [float(x) for x in tr.tp_norm],
                      "ls_norm": [float(x) for x in tr.ls_norm], "recommended": tr.recommended,
                      "paths": {k: str(v) for k, v in tr.paths.items()}},
            "mlflow_run_id": trial.run.run_id, "wall_s": trial.run.elapsed,
        }
        _log_build(trial, result)
        return result


def build_params(built: dict) -> dict:
    """A build's child-run parameters, from its ``segment_map.json`` (a :class:`BuiltHybrid` as a dict): the
    build, its segments in words, its trainable layers and its parameter counts."""
    segments = " | ".join(f"{r['kind']} {r['layers']} {'train' if r['trainable'] else 'frozen'} <- {r['source']}"
                          for r in built["rows"] if r["trainable"] is not None)
    return {"build": built["build"], "segments": segments[:500],
            "trainable_layers": ",".join(map(str, built["trainable_layers"])),
            **{f"params_{k}": v for k, v in built["counts"].items()}}


def _log_build_params(run, built: BuiltHybrid) -> None:
    """The build's segments and counts as child run parameters and its segment map, once over every attempt."""
    if run.meta.get("params_logged"):
        return
    run.log_params(build_params(built.to_dict()))
    run.log_artifact(built.folder / SEGMENT_MAP)
    run.meta["params_logged"] = True
    run.save_meta()


def build_records(result: dict, eval_files: list) -> tuple[dict, list[tuple[str, str]]]:
    """What a build's child run gets at its end, from its ``result.json`` and the files of its ``eval/`` folder
    (``raycpt runs sync`` logs the same): ``(metrics, artifacts)``, the evaluation cells, the final loss and the
    build's wall time; ``(file, artifact folder)`` for the trace's plots and tables (``trace/``) and the
    evaluation's files (``eval/``)."""
    metrics = {**result["metrics"], "final_loss": result["final_loss"], "hybrid_wall_s": result["wall_s"]}
    files = [(str(p), "trace") for p in result["trace"]["paths"].values() if Path(p).suffix in (".png", ".md", ".csv")]
    return metrics, files + [(str(p), "eval") for p in sorted(map(str, eval_files))]


def _log_build(trial: Trial, result: dict) -> None:
    metrics, files = build_records(result, [p for p in (trial.dir / "eval").glob("*") if p.is_file()])
    trial.run.log_metrics(metrics)
    for path, folder in files:
        trial.run.log_artifact(path, folder)


@dataclass
class HybridRunResult:
    run_dir: Path
    parent_run_id: str
    builds: list[dict]
    table: str
    wall_s: float
    paths: dict = field(default_factory=dict)


def prepare(cfg: ExperimentConfig, options: Options) -> BuildPlan:
    """Every check of a hybrid run, with no Ray and no MLflow: the builds' specs, the eval tasks, the memory (every
    user error about the spec surfaces here, before any run exists)."""
    console = options.console
    plans = plan_builds(cfg)
    resolve_eval_tasks(cfg.eval)
    # the hybrids do not exist yet and each build sets its own layers plan: check the donor's full plan
    # (cfg.plan's empty ``layers`` list would "train nothing")
    preflight(cfg, console, plans=[full_plan(cfg)])
    prefetch_hub_datasets(cfg.eval, console=console)  # hub eval data once, on the driver; the trials read it offline
    return BuildPlan(cfg, plans)


def _builds(plans: list) -> list:
    return [HybridBuild(p.name, f"{display_name(p)} ({p.name})") for p in plans]


def run_spec(plan: BuildPlan, options: Options) -> RunSpec:
    return RunSpec(plan.cfg, "hybrid", params=grid_params(_builds(plan.plans)))


def execute(plan: BuildPlan, run, options: Options) -> HybridRunResult:
    """Build, train, evaluate and trace every build (inline grid trials), then the Table-4 files."""
    cfg, plans, resume, console, progress = plan.cfg, plan.plans, options.resume, options.console, options.progress
    t0, run_dir = time.time(), run.run_dir
    state = read_state(run_dir)
    grid = Grid("hybrid", _builds(plans), shared={"progress": progress}, folder="builds", meta_file="build.json",
                name_tag="raycpt.build", inline=True)
    with ray_session(cfg.ray):
        results = list(run_grid(run, grid, resume=resume, console=console).values())
    evals = [EvalResult.from_dict(r["eval"]) for r in results]
    paths = write_results(evals, run_dir, stem="hybrid")
    text = table_text(evals)
    paths["table"] = atomic_write_text(run_dir / "hybrid_table.txt", text)
    paths["profiles"] = plot_profiles(results, run_dir / "hybrid_profiles.png")
    wall = time.time() - t0 + float(state.get("wall_s", 0.0) if resume else 0.0)
    summary = {"run_dir": str(run_dir), "parent_run_id": run.run_id, "wall_s": wall,
               "builds": [{k: r[k] for k in ("build", "name", "final_model_dir", "trainable_layers", "counts",
                                             "final_loss", "metrics", "wall_s", "mlflow_run_id")}
                          for r in results]}
    atomic_write_json(run_dir / "summary.json", summary)
    files = hybrid_artifacts([*paths.values(), run_dir / "summary.json"], results)
    run.state(wall_s=wall)
    _log_run(run, summary, files)
    run.state(done=True, wall_s=wall)
    if console is not None:
        for t in render_table(evals):
            console.print(t)
    return HybridRunResult(run_dir=run_dir, parent_run_id=run.run_id, builds=results, table=text, wall_s=wall,
                           paths={k: str(v) for k, v in paths.items()})


HYBRID_RUN = Steps(prepare, execute, run_spec)


def run_hybrid(cfg: ExperimentConfig, resume: bool = False, console=None, progress: bool = True) -> HybridRunResult:
    """``raycpt hybrid run``: :func:`prepare`, then :func:`execute` in the command's run."""
    return run_job(HYBRID_RUN, cfg, Options(console=console, resume=resume, progress=progress))


def hybrid_summary_metrics(summary: dict) -> dict:
    """The parent run's metrics, from the run's ``summary.json``: every build's evaluation cells and final loss
    (``<build>/<key>``) and the wall time."""
    out = {f"{b['build']}/{k}": v for b in summary["builds"] for k, v in b["metrics"].items()}
    out.update({f"{b['build']}/final_loss": b["final_loss"] for b in summary["builds"]})
    return {**out, "wall_time_s": summary["wall_s"]}


def hybrid_artifacts(files: list, results: list[dict]) -> list[tuple[str, str]]:
    """``(file, artifact folder)`` of the parent run: the table files and the summary (at the top), every build's
    trace plots (``trace/<build>``)."""
    out = [(str(p), "") for p in files]
    return out + [(str(p), f"trace/{r['build']}") for r in results for p in r["trace"]["paths"].values()
                  if Path(p).suffix == ".png"]


def _log_run(parent, summary: dict, files: list[tuple[str, str]]) -> None:
    parent.log_metrics(hybrid_summary_metrics(summary))
    for path, folder in files:
        if Path(path).is_file():
            parent.log_artifact(path, folder or None)
