"""``raycpt runs sync RUN_DIR``: replay a ``raycpt train`` run folder into an MLflow store, for a run whose tracking
server went away mid-run (its folder has everything: ``config.yaml``, ``state.json``, ``train_metrics.jsonl``,
``train_result.json``, ``loss_curve.png``, ``final_model/``).

The run ``state.json`` names is continued when the store has it (the steps it lacks a ``loss`` point for are
logged, none twice); else a new run is made in the config's experiment, with the config as
params and ``raycpt.synced_from`` naming the old id, and ``state.json`` then names the new run. The run ends
with the folder's status (finished -> FINISHED, failed -> FAILED, interrupted -> KILLED). Idempotent: a second
sync logs nothing new.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig

STEP_SKIP = ("step",)  # a step record's fields that are not metrics
STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED", "nonfinite": "FAILED"}


def _run_folder(rest) -> Path:
    from raycpt.errors import RaycptError

    if not rest:
        raise RaycptError("runs sync: name the run folder, e.g. raycpt runs sync RUNS/train-NAME-ID")
    run_dir = Path(rest[0]).expanduser().resolve()
    for need in ("config.yaml", "state.json"):
        if not (run_dir / need).is_file():
            raise RaycptError(f"runs sync: {run_dir} is not a raycpt run folder (it has no {need})")
    return run_dir


def _target_run(client, cfg: ExperimentConfig, run_dir: Path, state: dict, exp_id: str) -> tuple[str, bool]:
    """``(run id, created)``: the run ``state.json`` names when this store has it, else a new one."""
    from mlflow.exceptions import MlflowException

    from raycpt.tracking import flatten

    old = state.get("mlflow_run_id")
    if old:
        try:
            client.get_run(old)
            return old, False
        except MlflowException:
            pass
    command = state.get("command", "train")
    run = client.create_run(exp_id, run_name=f"{command}-{cfg.name}",
                            tags={"raycpt.command": command, "raycpt.run_dir": str(run_dir),
                                  **({"raycpt.synced_from": old} if old else {})})
    from mlflow.entities import Param

    params = [Param(k, str(v)[:500]) for k, v in flatten(dataclasses.asdict(cfg)).items()]
    for i in range(0, len(params), 100):
        client.log_batch(run.info.run_id, params=params[i:i + 100])
    return run.info.run_id, True


def step_metrics(records: list[dict], have: set) -> list[tuple[int, str, float]]:
    """``(step, key, value)`` of every finite numeric field of the step records whose step is not in ``have``
    (the steps the run has a ``loss`` point for: a gap in the middle, from a resumed attempt, is filled too)."""
    import math

    out = []
    for r in records:
        step = int(r["step"])
        if step in have:
            continue
        for k, v in r.items():
            if k in STEP_SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            out.append((step, k, float(v)))
    return out


def _log_steps(client, run_id: str, records: list[dict]) -> int:
    """The step records the run lacks (steps without a ``loss`` point); how many steps were logged."""
    import time

    from mlflow.entities import Metric

    rows = step_metrics(records, {m.step for m in client.get_metric_history(run_id, "loss")})
    ts = int(time.time() * 1000)
    metrics = [Metric(k, v, ts, step) for step, k, v in rows]
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    return len({step for step, _, _ in rows})


def _log_result(client, run_id: str, run_dir: Path) -> None:
    """``train_result.json``'s end metrics, the final model's folder and the loss curve, as the launcher logs them."""
    from mlflow.entities import Param, RunTag

    from raycpt.train.launch import _result_from_files, final_metrics

    if not (run_dir / "train_result.json").is_file():
        return
    res = _result_from_files(run_dir, {})
    have = client.get_run(run_id).data
    params = [] if "final_model_dir" in have.params else [Param("final_model_dir", str(res.final_model_dir))]
    client.log_batch(run_id, params=params, tags=[RunTag("raycpt.final_model_dir", str(res.final_model_dir))])
    for k, v in final_metrics(res).items():
        if k not in have.metrics:
            client.log_metric(run_id, k, float(v))
    png = run_dir / "loss_curve.png"
    if png.is_file() and "loss_curve.png" not in {f.path for f in client.list_artifacts(run_id)}:
        client.log_artifact(run_id, str(png))


def sync_run(cfg: ExperimentConfig, rest=(), tracking_uri: Optional[str] = None) -> str:
    """``raycpt runs sync RUN_DIR [--tracking-uri URI]``: the folder's params, step metrics, end metrics, tags and
    loss curve into the store (``URI``, else the one the run was made with); the one line said. ``cfg`` (the
    command line's config) is not used: the folder's ``config.yaml`` is the run's."""
    from mlflow.tracking import MlflowClient

    from raycpt.config import load_config
    from raycpt.report.train import read_step_records
    from raycpt.runs import read_state, write_state
    from raycpt.tracking import LOST_FILE, ensure_store, tracking_uri as uri_of
    from raycpt.train.loop import METRICS_FILE

    del cfg
    run_dir = _run_folder(rest)
    run_cfg = load_config(run_dir / "config.yaml")
    if tracking_uri:
        run_cfg.tracking.uri = tracking_uri
    state = read_state(run_dir)
    exp_id = ensure_store(run_cfg.tracking)  # one line for a store that does not answer
    uri = uri_of(run_cfg.tracking)
    client = MlflowClient(uri)
    run_id, created = _target_run(client, run_cfg, run_dir, state, exp_id)
    records = read_step_records(run_dir / METRICS_FILE)
    logged = _log_steps(client, run_id, records)
    _log_result(client, run_id, run_dir)
    status = STATUS.get(state.get("status", ""))
    if status is not None:
        client.set_terminated(run_id, status=status)
    moved = {"synced_from": state["mlflow_run_id"]} if created and state.get("mlflow_run_id") else {}
    write_state(run_dir, mlflow_run_id=run_id, tracking_lost=None, synced_to=uri, **moved)
    (run_dir / LOST_FILE).unlink(missing_ok=True)
    how = "a new run" if created else "its run"
    return (f"synced {run_dir} into {how} {run_id} at {uri}: {logged} step(s) of metrics added "
            f"({len(records)} in the folder), status {status or 'unchanged'}")
