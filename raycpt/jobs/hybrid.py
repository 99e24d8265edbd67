"""``raycpt hybrid build`` and ``raycpt hybrid run``: the paper's hybrid case study (section 6).

:func:`build_hybrids` resolves every build of ``cfg.hybrid`` against its donors (configs only, so
a bad spec fails before anything is written), assembles each with
:func:`raycpt.models.hybrid.build_hybrid` and saves it (safetensors + the donor's tokenizer) with
its segment map (``segment_map.json``).

:func:`run_hybrid` does, for every build (``new_shallow`` and ``new_deep`` by default), in one run
folder and under one MLflow *parent* run with one *child* run per build:

1. build and save the hybrid (``builds/<build>/initial``);
2. train it with Ray Train (:func:`raycpt.train.launch.run_training`) on ``cfg.data`` with the plan
   its segments define - a ``layers`` plan listing the layers of the trainable segments
   (``plan.train_embeddings`` / ``train_final_norm`` / ``train_head`` are kept from the config);
3. evaluate the trained model (:func:`raycpt.evaluate.evaluate_model`, both modes);
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
from raycpt.io import atomic_write_json
from raycpt.runs import open_run_dir, read_state, write_state

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
    from raycpt.models.hybrid import plan_from_config

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
    from raycpt.models.hybrid import build_hybrid, param_counts, save_hybrid, segment_rows

    model, tok = build_hybrid(plan, progress=progress)
    built = BuiltHybrid(build=plan.name, display=display_name(plan), folder=folder, rows=segment_rows(model),
                        counts=param_counts(model), trainable_layers=list(model.config.trainable_layers),
                        layer_kinds=list(model.config.layer_kinds))
    save_hybrid(model, tok, folder)
    atomic_write_json(saved, built.to_dict())
    return built


def build_hybrids(cfg: ExperimentConfig, builds: Optional[list[str]] = None, out: Optional[str] = None,
                  progress: bool = True) -> tuple[Path, list[BuiltHybrid]]:
    """``raycpt hybrid build``: write every build under ``out/<build>/`` (default: a new run folder)."""
    plans = plan_builds(cfg, builds)
    if out is None:
        root = open_run_dir(cfg, "hybrid-build")
    else:
        root = Path(out).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
    built = [build_one(p, root / p.name, progress=progress) for p in plans]
    return root, built


def segment_table(b: BuiltHybrid):
    """rich Table: segment, kind, layers, source, trainable, params."""
    from rich.table import Table

    t = Table(title=f"{b.display} ({b.build})  ->  {b.folder}")
    for col in ("segment", "kind", "layers", "source", "trainable", "params"):
        t.add_column(col, justify="right" if col == "params" else "left")
    for r in b.rows:
        tr = "-" if r["trainable"] is None else ("yes" if r["trainable"] else "frozen")
        t.add_row(str(r["segment"]), str(r["kind"]), str(r["layers"]), str(r["source"]), tr, f"{r['params']:,}")
    return t


def counts_line(b: BuiltHybrid) -> str:
    c = b.counts
    share = 100.0 * c["trainable_layers"] / c["total"] if c["total"] else 0.0
    return (f"{b.build}: {c['total']:,} parameters; trainable segments {c['trainable_layers']:,} ({share:.1f}%), "
            f"frozen segments {c['frozen_layers']:,}, embeddings/norm/head {c['other']:,}; "
            f"trainable layers {b.trainable_layers}")


def hybrid_train_config(cfg: ExperimentConfig, built: BuiltHybrid) -> ExperimentConfig:
    """``cfg`` with the built hybrid as the model and its segments' trainable flags as a ``layers`` plan."""
    plan = dataclasses.replace(cfg.plan, name="layers", layers=list(built.trainable_layers))
    model = dataclasses.replace(cfg.model, ref=str(built.folder))
    return dataclasses.replace(cfg, model=model, plan=plan)


# ------------------------------------------------------------------------------------------------ run

@dataclass
class HybridRunResult:
    run_dir: Path
    parent_run_id: str
    builds: list[dict]
    table: str
    wall_s: float
    paths: dict = field(default_factory=dict)


def _eval_result(d: dict):
    from raycpt.evaluate import EvalResult

    return EvalResult.from_dict(d)


def _run_build(cfg: ExperimentConfig, plan, run_dir: Path, parent_id: str, client, console, progress: bool) -> dict:
    """Build, train, evaluate and trace one build inside its own MLflow child run."""
    from raycpt.tracking import ChildRun, ensure_store

    bdir = run_dir / "builds" / plan.name
    bdir.mkdir(parents=True, exist_ok=True)
    result_path = bdir / "result.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    exp_id = ensure_store(cfg.tracking)
    name = f"{display_name(plan)} ({plan.name})"
    with ChildRun(client, bdir / "build.json", exp_id, parent_id, name,
                  tags={"raycpt.command": "hybrid", "raycpt.build": plan.name}, meta={"build": plan.name}) as run:
        return _build_body(cfg, plan, bdir, name, run, parent_id, console, progress)


def _build_body(cfg: ExperimentConfig, plan, bdir: Path, name: str, run, parent_id: str, console,
                progress: bool) -> dict:
    """One hybrid build inside its :class:`~raycpt.tracking.ChildRun`: build, train, evaluate, trace."""
    import mlflow

    from raycpt.jobs.trace import run_trace
    from raycpt.tracking import ensure_store, log_metrics
    from raycpt.train.launch import final_evaluation, run_training

    client, run_id, meta = run.client, run.run_id, run.meta
    result_path = bdir / "result.json"
    if console is not None:
        console.print(f"[bold]{name}[/bold]: build")
    built = build_one(plan, bdir / "initial", progress=progress)
    if not meta.get("params_logged"):
        client.log_param(run_id, "build", plan.name)
        client.log_param(run_id, "segments", " | ".join(
            f"{r['kind']} {r['layers']} {'train' if r['trainable'] else 'frozen'} <- {r['source']}"
            for r in built.rows if r["trainable"] is not None)[:500])
        client.log_param(run_id, "trainable_layers", ",".join(map(str, built.trainable_layers)))
        for k, v in built.counts.items():
            client.log_param(run_id, f"params_{k}", v)
        client.log_artifact(run_id, str(built.folder / SEGMENT_MAP))
        meta["params_logged"] = True
        run.save_meta()
    tcfg = hybrid_train_config(cfg, built)
    if console is not None:
        console.print(f"[bold]{name}[/bold]: train layers {built.trainable_layers} "
                      f"({cfg.train.max_steps} steps)")
    tdir = bdir / "train"
    # the training worker evaluates the final weights where they are (its GPU on a cluster)
    train = run_training(tcfg, run_dir=tdir, resume=(tdir / "state.json").exists(), parent_run_id=parent_id,
                         mlflow_run_id=run_id, name=name, progress=progress,
                         evaluate={"eval": dataclasses.asdict(cfg.eval), "out_dir": str(bdir / "eval"), "name": name})
    final = Path(train.final_model_dir)
    ev, _ = final_evaluation(final, cfg.eval, bdir / "eval", name)
    atomic_write_json(bdir / "eval_result.json", ev.to_dict())
    if console is not None:
        console.print(f"[bold]{name}[/bold]: trace")
    trace_cfg = dataclasses.replace(tcfg, model=dataclasses.replace(tcfg.model, ref=str(final)))
    tr = run_trace(trace_cfg, run_dir=bdir / "trace", parent_run_id=run_id, progress=progress)
    wall = run.elapsed
    result = {
        "build": plan.name, "display": display_name(plan), "name": name, "initial_dir": str(built.folder),
        "final_model_dir": str(final), "trainable_layers": built.trainable_layers,
        "layer_kinds": built.layer_kinds, "rows": built.rows, "counts": built.counts,
        "losses": list(map(float, train.losses)),
        "final_loss": float(train.losses[-1]) if train.losses else float("nan"),
        "eval": ev.to_dict(), "metrics": ev.metrics(),
        "trace": {"run_dir": str(tr.run_dir), "tp_norm": [float(x) for x in tr.tp_norm],
                  "ls_norm": [float(x) for x in tr.ls_norm], "recommended": tr.recommended,
                  "paths": {k: str(v) for k, v in tr.paths.items()}},
        "mlflow_run_id": run_id, "wall_s": wall,
    }
    ensure_store(cfg.tracking)
    with mlflow.start_run(run_id=run_id):
        log_metrics({**ev.metrics(), "final_loss": result["final_loss"], "hybrid_wall_s": wall})
        for key, p in tr.paths.items():
            if Path(p).suffix in (".png", ".md", ".csv"):
                mlflow.log_artifact(str(p), artifact_path="trace")
        for p in sorted((bdir / "eval").glob("*")):
            if p.is_file():
                mlflow.log_artifact(str(p), artifact_path="eval")
    atomic_write_json(result_path, result)
    return result


def run_hybrid(cfg: ExperimentConfig, resume: bool = False, console=None, progress: bool = True) -> HybridRunResult:
    """``raycpt hybrid run``: build, train, evaluate and trace every build; the Table-4 report."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from raycpt.cluster import preflight, version_tags
    from raycpt.evaluate import resolve_tasks
    from raycpt.report.eval import render_table, table_text, write_results
    from raycpt.report.hybrid import plot_profiles
    from raycpt.runtime import ray_session
    from raycpt.tracking import ensure_store, log_config, log_metrics

    t0 = time.time()
    plans = plan_builds(cfg)  # every user error about the spec surfaces here, before any run exists
    resolve_tasks(cfg.eval.tasks)
    run_dir = open_run_dir(cfg, "hybrid", resume=resume)
    state = read_state(run_dir)
    exp_id = ensure_store(cfg.tracking)
    client = MlflowClient()
    if state.get("parent_run_id"):
        parent_id = state["parent_run_id"]
        client.update_run(parent_id, status="RUNNING")
    else:
        parent_id = client.create_run(exp_id, run_name=f"hybrid-{cfg.name}-{run_dir.name.rsplit('-', 1)[-1]}",
                                      tags={"raycpt.command": "hybrid", "raycpt.run_dir": str(run_dir),
                                            **version_tags()}).info.run_id
        write_state(run_dir, command="hybrid", parent_run_id=parent_id, builds=[p.name for p in plans])
        with mlflow.start_run(run_id=parent_id):
            log_config(cfg)
            mlflow.log_param("builds", ",".join(p.name for p in plans))
        client.update_run(parent_id, status="RUNNING")
    if console is not None:
        console.print(f"hybrid run: {', '.join(f'{display_name(p)} ({p.name})' for p in plans)} -> {run_dir}")
    try:
        results = []
        with ray_session(cfg.ray):
            preflight(cfg)  # shared storage on every node
            for plan in plans:
                results.append(_run_build(cfg, plan, run_dir, parent_id, client, console, progress))
        evals = [_eval_result(r["eval"]) for r in results]
        paths = write_results(evals, run_dir, stem="hybrid")
        text = table_text(evals)
        table_path = run_dir / "hybrid_table.txt"
        from raycpt.io import atomic_write_text

        atomic_write_text(table_path, text)
        paths["table"] = table_path
        paths["profiles"] = plot_profiles(results, run_dir / "hybrid_profiles.png")
        wall = time.time() - t0 + float(state.get("wall_s", 0.0) if resume else 0.0)
        summary = {"run_dir": str(run_dir), "parent_run_id": parent_id, "wall_s": wall,
                   "builds": [{k: r[k] for k in ("build", "name", "final_model_dir", "trainable_layers", "counts",
                                                 "final_loss", "metrics", "wall_s", "mlflow_run_id")}
                              for r in results]}
        atomic_write_json(run_dir / "summary.json", summary)
        with mlflow.start_run(run_id=parent_id):
            log_metrics({f"{r['build']}/{k}": v for r in results for k, v in r["metrics"].items()})
            log_metrics({f"{r['build']}/final_loss": r["final_loss"] for r in results})
            log_metrics({"wall_time_s": wall})
            for p in [*paths.values(), run_dir / "summary.json"]:
                if Path(p).is_file():
                    mlflow.log_artifact(str(p))
            for r in results:
                for key, p in r["trace"]["paths"].items():
                    if Path(p).suffix == ".png" and Path(p).is_file():
                        mlflow.log_artifact(p, artifact_path=f"trace/{r['build']}")
        write_state(run_dir, done=True, wall_s=wall)
        client.set_terminated(parent_id, status="FINISHED")
        if console is not None:
            for t in render_table(evals):
                console.print(t)
        return HybridRunResult(run_dir=run_dir, parent_run_id=parent_id, builds=results, table=text, wall_s=wall,
                               paths={k: str(v) for k, v in paths.items()})
    except KeyboardInterrupt:
        client.set_terminated(parent_id, status="KILLED")
        raise
    except BaseException:
        client.set_terminated(parent_id, status="FAILED")
        raise
