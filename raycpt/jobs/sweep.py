"""The main job: trace, then a Ray Tune grid of layer allocations, each trained and evaluated.

``run_sweep(cfg, splits, strategies, resume)``:

1. validates the splits against the model's depth (before any Ray or MLflow work) and drops duplicates;
2. opens (or re-opens with ``resume``) the run folder and one MLflow *parent* run;
3. optionally runs the LayerTracer trace, giving S(b) for every split;
4. runs a Tune grid - ``full`` once plus every strategy at every split - where each trial is a
   function trainable that builds its own ``TorchTrainer`` (Train V2), trains, evaluates the final
   checkpoint in both modes and reports. Each trial logs into one nested *child* MLflow run whose id it
   keeps in ``trials/<name>/trial.json``, so a resumed trial continues the same run;
5. writes the summary (paper's Table-1 layout with deltas against ``full``, S(b) next to the realised
   gain, bar chart, overlaid loss curves) into the run folder and the parent run.

Resume: ``Tuner.restore`` finishes unfinished trials; a trial whose ``result.json`` exists is never
redone; an interrupted trial's TorchTrainer restarts from its last checkpoint (same storage path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from raycpt.config import ExperimentConfig, config_from_dict, config_to_dict
from raycpt.errors import RaycptError
from raycpt.report.progress import TrialsProgress
from raycpt.io import atomic_write_json
from raycpt.runs import open_run_dir, read_state, write_state

SPLIT_STRATEGIES = ("train_shallow", "train_deep")


# ------------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class TrialSpec:
    """One cell of the grid: a plan name, and for split plans the ratio and the layer boundary b."""

    name: str
    strategy: str
    split: Optional[float] = None
    b: Optional[int] = None
    overrides: tuple = ()
    """Extra dotted overrides for this trial (recipes), e.g. ("plan.pattern=01100",)."""


def split_index(ratio: float, num_layers: int) -> int:
    """b = round(r * N): shallow = layers [0, b). Delegates to the plan registry's rule."""
    from raycpt.strategies import split_index as _split_index

    return _split_index(ratio, num_layers)


def plan_grid(splits: list[float], strategies: list[str], num_layers: int, include_full: bool = True,
              recipes: Optional[dict[str, dict]] = None) -> list[TrialSpec]:
    """The trials of a sweep, validated against the model depth; duplicates dropped.

    Raises RaycptError (one line) for a split outside (0, 1), a split whose boundary leaves a side
    empty for this model, an unknown strategy, or an empty grid.
    """
    recipes = recipes or {}
    seen_ratio: list[float] = []
    for r in splits:
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise RaycptError(f"split {r!r} is not a number (expected ratios such as 0.33,0.5,0.66)")
        if not 0 < r < 1:
            raise RaycptError(f"split {r} is outside (0, 1): a split ratio r puts layers [0, round(r*N)) in the "
                              "shallow side")
        b = split_index(r, num_layers)
        if b <= 0 or b >= num_layers:
            raise RaycptError(f"split {r} gives b = round({r}*{num_layers}) = {b}, which leaves the "
                              f"{'shallow' if b <= 0 else 'deep'} side empty for this {num_layers}-layer model")
        if r not in seen_ratio:
            seen_ratio.append(float(r))
    specs: list[TrialSpec] = []
    if include_full:
        specs.append(TrialSpec(name="full", strategy="full"))
    for s in strategies:
        if s in SPLIT_STRATEGIES:
            seen_b: set[int] = set()
            for r in seen_ratio:
                b = split_index(r, num_layers)
                if b in seen_b:  # two ratios that round to the same boundary train the same plan
                    continue
                seen_b.add(b)
                specs.append(TrialSpec(name=f"{s}-r{r:g}", strategy=s, split=r, b=b))
        elif s in recipes:
            over = tuple(f"{k}={_yaml_value(v)}" for k, v in recipes[s].items())
            strategy = str(recipes[s].get("plan.name", recipes[s].get("name", s)))
            specs.append(TrialSpec(name=s, strategy=strategy, overrides=over))
        elif s == "full":
            if not include_full:
                specs.insert(0, TrialSpec(name="full", strategy="full"))
        else:
            allowed = ", ".join(list(SPLIT_STRATEGIES) + sorted(recipes) + ["full"])
            raise RaycptError(f"unknown sweep strategy {s!r}: use one of {allowed}")
    if not specs:
        raise RaycptError("the sweep has no trials: give --strategies or keep sweep.include_full")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):  # pragma: no cover - names are built unique above
        raise RaycptError(f"duplicate trial names: {names}")
    return specs


def _yaml_value(v: Any) -> str:
    import yaml

    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def trial_config(cfg: ExperimentConfig, spec: TrialSpec) -> ExperimentConfig:
    """The experiment config of one trial: the sweep config with the trial's plan applied."""
    from raycpt.config import apply_overrides

    data = config_to_dict(cfg)
    over = [f"plan.name={spec.strategy}"]
    if spec.split is not None:
        over.append(f"plan.split={spec.split}")
    over += list(spec.overrides)
    apply_overrides(data, over)
    return config_from_dict(data)


# ------------------------------------------------------------------------------------- one trial
def _trial_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / "trials" / name


def eval_cells(eval_result: Any) -> dict[str, float]:
    """Flatten an evaluation result into ``{task/category/mode: accuracy}``."""
    if hasattr(eval_result, "metrics"):
        m = eval_result.metrics
        return dict(m() if callable(m) else m)
    if isinstance(eval_result, dict):
        return dict(eval_result)
    raise TypeError(f"cannot read scores from {type(eval_result).__name__}")


def run_trial(config: dict) -> dict:
    """Train and evaluate one trial (runs inside a Tune trial; callable directly in tests)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from raycpt.tracking import ChildRun, ensure_store, log_metrics
    from raycpt.train.launch import run_training

    cfg = config_from_dict(config["cfg"])
    spec = TrialSpec(**{k: (tuple(v) if k == "overrides" else v) for k, v in config["spec"].items()})
    run_dir = Path(config["run_dir"])
    tdir = _trial_dir(run_dir, spec.name)
    tdir.mkdir(parents=True, exist_ok=True)
    result_path = tdir / "result.json"
    if result_path.is_file():  # finished before an interruption: never redo it
        return json.loads(result_path.read_text())

    exp_id = ensure_store(cfg.tracking)
    with ChildRun(MlflowClient(), tdir / "trial.json", exp_id, config["parent_run_id"], spec.name,
                  tags={"raycpt.command": "sweep", "raycpt.trial": spec.name},
                  meta={"spec": dataclasses.asdict(spec)}) as run:
        if run.created:
            for k, v in {"strategy": spec.strategy, "split": spec.split, "b": spec.b, "seed": cfg.train.seed,
                         "overrides": ",".join(spec.overrides)}.items():
                run.client.log_param(run.run_id, k, "" if v is None else v)
        tcfg = trial_config(cfg, spec)
        train_dir = tdir / "train"
        train = run_training(tcfg, run_dir=train_dir, resume=(train_dir / "state.json").exists() or
                             (train_dir / "ray").exists(), parent_run_id=config["parent_run_id"],
                             mlflow_run_id=run.run_id, name=spec.name,
                             evaluate={"eval": dataclasses.asdict(tcfg.eval), "out_dir": str(tdir / "eval"),
                                       "name": spec.name, "heldout_path": config.get("heldout_path")})
        ev, heldout = trial_evaluation(str(train.final_model_dir), tcfg, tdir / "eval", spec.name,
                                       config.get("heldout_path"))
        cells = ev.metrics()
        wall = run.elapsed
        result = {
            "name": spec.name, "strategy": spec.strategy, "split": spec.split, "b": spec.b,
            "trainable_params": int(train.trainable_params), "frozen_params": int(train.frozen_params),
            "tokens_per_s": float(train.tokens_per_s), "wall_s": wall, "losses": list(map(float, train.losses)),
            "final_loss": float(train.losses[-1]) if train.losses else float("nan"),
            "final_model_dir": str(train.final_model_dir), "scores": cells, "mlflow_run_id": run.run_id,
            "heldout_loss": heldout,
        }
        mlflow.set_tracking_uri(cfg.tracking.uri)
        with mlflow.start_run(run_id=run.run_id):
            log_metrics({**cells, "wall_time_s": wall, "tokens_per_s": result["tokens_per_s"],
                         "trainable_params": result["trainable_params"],
                         **({"heldout_loss": heldout} if heldout is not None else {})})
            mlflow.log_param("trainable_params", result["trainable_params"])
        atomic_write_json(result_path, result)
    return result


def trial_evaluation(model_dir: str, cfg: ExperimentConfig, out_dir: Path, name: str,
                     heldout_path: Optional[str] = None):
    """A trial's ``(EvalResult, held-out loss)``: its training worker's evaluation, or (FSDP) the same
    evaluation here with every CPU the trial reserved (:func:`raycpt.train.launch.final_evaluation`)."""
    from raycpt.train.launch import final_evaluation

    blocks = json.loads(Path(heldout_path).read_text()) if heldout_path else None
    return final_evaluation(model_dir, cfg.eval, out_dir, name, heldout_blocks=blocks,
                            threads=max(1, int(cfg.sweep.cpus_per_trial + cfg.sweep.data_cpus_per_trial)))


def _tune_trainable(config: dict) -> None:
    """Tune function trainable: one trial; reports the final metrics with a small checkpoint."""
    import tempfile

    from ray import tune

    result = run_trial(config)
    metrics = {k.replace("/", "_"): v for k, v in result["scores"].items()}
    metrics.update(final_loss=result["final_loss"], wall_s=result["wall_s"], done=1)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "result.json").write_text(json.dumps(result))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))


# ------------------------------------------------------------------------------------- the driver
@dataclass
class SweepResult:
    run_dir: Path
    parent_run_id: str
    trials: list[dict]
    summary: dict = field(default_factory=dict)
    trace: Any = None


def model_depth(cfg: ExperimentConfig) -> int:
    """Number of decoder layers of the configured model, read from its config (no weights loaded)."""
    from transformers import AutoConfig

    from raycpt.models.sources import resolve_model_path

    conf = AutoConfig.from_pretrained(resolve_model_path(cfg.model, progress=True))
    return int(getattr(conf, "num_hidden_layers", 0) or getattr(conf, "n_layer", 0))


def run_sweep(cfg: ExperimentConfig, splits: Optional[list[float]] = None, strategies: Optional[list[str]] = None,
              resume: bool = False, console=None) -> SweepResult:
    from mlflow.tracking import MlflowClient
    from ray import tune

    from raycpt.cluster import preflight, version_tags
    from raycpt.report.sweep import write_summary
    from raycpt.runtime import ray_session
    from raycpt.tracking import ensure_store, log_config

    t_start = time.time()
    if splits is not None:
        cfg.sweep.splits = list(splits)
    if strategies is not None:
        cfg.sweep.strategies = list(strategies)
    num_layers = model_depth(cfg)
    specs = plan_grid(cfg.sweep.splits, cfg.sweep.strategies, num_layers, cfg.sweep.include_full,
                      getattr(cfg.sweep, "recipes", None))
    uniq_splits = sorted({s.split for s in specs if s.split is not None})
    heldout = None
    if cfg.sweep.heldout_docs:
        if cfg.data.max_documents is None:
            raise RaycptError("sweep.heldout_docs needs data.max_documents: the held-out documents are the ones after "
                              "the first data.max_documents, which training never reads")
        from raycpt.data.corpus import heldout_blocks
        from raycpt.train.launch import resolve_model_path

        heldout = heldout_blocks(cfg.data, resolve_model_path(cfg), cfg.sweep.heldout_docs,
                                 setting="sweep.heldout_docs", raise_key="sweep.heldout_docs")

    run_dir = open_run_dir(cfg, "sweep", resume=resume)
    state = read_state(run_dir)
    heldout_path = None
    if heldout is not None:
        heldout_path = str(atomic_write_json(run_dir / "heldout_blocks.json", heldout))
    exp_id = ensure_store(cfg.tracking)
    client = MlflowClient()
    if state.get("parent_run_id"):
        parent_id = state["parent_run_id"]
        client.update_run(parent_id, status="RUNNING")
    else:
        parent = client.create_run(exp_id, run_name=f"sweep-{cfg.name}-{run_dir.name.rsplit('-', 1)[-1]}",
                                   tags={"raycpt.command": "sweep", "raycpt.run_dir": str(run_dir), **version_tags()})
        parent_id = parent.info.run_id
        write_state(run_dir, parent_run_id=parent_id, trials=[s.name for s in specs])
        import mlflow

        mlflow.set_tracking_uri(cfg.tracking.uri)
        with mlflow.start_run(run_id=parent_id):
            log_config(cfg)
            mlflow.log_param("num_layers", num_layers)
            mlflow.log_param("trials", ",".join(s.name for s in specs))
        client.update_run(parent_id, status="RUNNING")

    try:
        with ray_session(cfg.ray):
            preflight(cfg, cfg.sweep.max_concurrent_trials)  # shared storage on every node; SQLite warning
            trace = None
            if cfg.sweep.trace_first:
                trace = _trace_once(cfg, run_dir, uniq_splits, parent_id, state, console)
            bundles = [{"CPU": cfg.sweep.cpus_per_trial, **cfg.sweep.trial_resources}]
            if cfg.sweep.data_cpus_per_trial > 0:
                # Ray Data tasks also ask for a little "memory": the bundle must hold some or nothing fits
                bundles.append({"CPU": cfg.sweep.data_cpus_per_trial, "memory": 1 << 30})
            trainable = tune.with_resources(_tune_trainable, tune.PlacementGroupFactory(bundles))
            tune_path = run_dir / "tune"
            if resume and tune_path.exists() and tune.Tuner.can_restore(str(tune_path)):
                tuner = tune.Tuner.restore(str(tune_path), trainable=trainable, resume_unfinished=True,
                                           resume_errored=True)
            else:
                param_space = {
                    "spec": tune.grid_search([dataclasses.asdict(s) for s in specs]),
                    "cfg": config_to_dict(cfg), "run_dir": str(run_dir), "parent_run_id": parent_id,
                    "heldout_path": heldout_path,
                }
                tuner = tune.Tuner(
                    trainable, param_space=param_space,
                    # reuse_actors: later trials skip the imports and keep the lm-eval task manager
                    tune_config=tune.TuneConfig(max_concurrent_trials=cfg.sweep.max_concurrent_trials,
                                                reuse_actors=True,
                                                trial_dirname_creator=lambda t: t.config["spec"]["name"],
                                                trial_name_creator=lambda t: t.config["spec"]["name"]),
                    run_config=tune.RunConfig(name="tune", storage_path=str(run_dir), verbose=0,
                                              failure_config=tune.FailureConfig(max_failures=1)),
                )
            if console is not None:
                console.print(f"sweep: {len(specs)} trials ({', '.join(s.name for s in specs)}) -> {run_dir}")
            with _quiet_tune_output(), TrialsProgress(run_dir / "trials", [s.name for s in specs],
                                                      cfg.train.max_steps, console):
                tuner.fit()
        trials = []
        missing = []
        for s in specs:
            p = _trial_dir(run_dir, s.name) / "result.json"
            if p.is_file():
                trials.append(json.loads(p.read_text()))
            else:
                missing.append(s.name)
        if missing:
            errors = _trial_errors(run_dir)
            status = "FAILED" if errors else "KILLED"  # no error file: Tune stopped on Ctrl-C
            _end_children(run_dir, client, status)
            client.set_terminated(parent_id, status=status)
            raise RaycptError(f"sweep incomplete: trials {', '.join(missing)} did not finish"
                              + (f" ({errors})" if errors else "") + f"; continue with --resume ({run_dir})")
        summary = write_summary(run_dir, trials, trace=trace, num_layers=num_layers, parent_run_id=parent_id,
                                tracking=cfg.tracking)
        write_state(run_dir, done=True)
        client.log_metric(parent_id, "sweep_wall_time_s", time.time() - t_start)  # this invocation's wall time
        client.set_terminated(parent_id, status="FINISHED")
        return SweepResult(run_dir=run_dir, parent_run_id=parent_id, trials=trials, summary=summary, trace=trace)
    except KeyboardInterrupt:
        _end_children(run_dir, client, "KILLED")
        client.set_terminated(parent_id, status="KILLED")
        raise
    except BaseException:
        _end_children(run_dir, client, "FAILED")
        if client.get_run(parent_id).info.status == "RUNNING":
            client.set_terminated(parent_id, status="FAILED")
        raise


@contextlib.contextmanager
def _quiet_tune_output():
    """Tune's console reporter off (``verbose=0`` alone still prints its experiment box and paths):
    the sweep shows its own per-trial progress, and the Tune results stay under ``<run>/tune``."""
    old = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = old


def _end_children(run_dir: Path, client, status: str) -> None:
    """End every trial run still RUNNING (a trial actor killed by Tune never reaches its handlers).

    ``--resume`` sets them RUNNING again and continues them, so no run is duplicated."""
    for meta in Path(run_dir).glob("trials/*/trial.json"):
        try:
            run_id = json.loads(meta.read_text())["mlflow_run_id"]
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status=status)
        except Exception:  # noqa: BLE001 - best effort while already failing
            continue


def _trial_errors(run_dir: Path) -> str:
    """First line of each failed Tune trial's error file, for the one-line message."""
    out = []
    for p in sorted((Path(run_dir) / "tune").glob("*/error.txt")):
        lines = [ln for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            out.append(f"{p.parent.name}: {lines[-1][:200]}")
    return "; ".join(out)


def _trace_once(cfg, run_dir: Path, splits: list[float], parent_id: str, state: dict, console):
    """Run the trace once per sweep (skipped on resume when it already finished)."""
    from raycpt.jobs.trace import run_trace

    trace_dir = run_dir / "trace"
    done = trace_dir / "trace_result.json"
    if done.is_file():
        return json.loads(done.read_text())
    if cfg.sweep.trace_max_prompts is not None:
        cfg = config_from_dict({**config_to_dict(cfg), "trace": {**config_to_dict(cfg)["trace"],
                                                                 "max_prompts": cfg.sweep.trace_max_prompts}})
    res = run_trace(cfg, run_dir=trace_dir, splits=splits, parent_run_id=parent_id)
    out = {
        "recommended_split": getattr(res, "recommended_split", None),
        "split_scores": _split_scores(res),
        "artifacts": [str(p) for p in (getattr(res, "artifacts", None) or [])],
    }
    atomic_write_json(done, out)
    return out


def _split_scores(res) -> dict[str, float]:
    """{ratio: S(b)} from a TraceResult, whatever shape its table has."""
    rows = getattr(res, "split_table", None) or getattr(res, "table", None) or []
    out = {}
    for row in rows:
        row = row if isinstance(row, dict) else dataclasses.asdict(row)
        r = row.get("ratio", row.get("split"))
        s = row.get("score", row.get("S", row.get("S_b")))
        if r is not None and s is not None:
            out[f"{float(r):g}"] = float(s)
    return out
