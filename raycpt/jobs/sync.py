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


def _target_run(client, cfg: ExperimentConfig, run_dir: Path, state: dict, exp_id: str,
                parent: Optional[dict] = None) -> tuple[str, bool]:
    """``(run id, created)``: the run ``state.json`` names when this store has it, else a new one (nested under
    ``parent["run_id"]``, named ``parent["name"]``, when given: a sweep trial's)."""
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
    nest = {"mlflow.parentRunId": parent["run_id"]} if parent and parent.get("run_id") else {}
    run = client.create_run(exp_id, run_name=(parent or {}).get("name") or f"{command}-{cfg.name}",
                            tags={"raycpt.command": command, "raycpt.run_dir": str(run_dir), **nest,
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
    command line's config) is not used: the folder's ``config.yaml`` is the run's. A sweep's folder syncs its
    parent run and every trial's run (:func:`sync_sweep`)."""
    from raycpt.runs import read_state

    del cfg
    run_dir = _run_folder(rest)
    if read_state(run_dir).get("command") == "sweep":
        return sync_sweep(run_dir, tracking_uri)
    s = sync_folder(run_dir, tracking_uri)
    how = "a new run" if s["created"] else "its run"
    return (f"synced {run_dir} into {how} {s['run_id']} at {s['uri']}: {s['logged']} step(s) of metrics added "
            f"({s['records']} in the folder), status {s['status'] or 'unchanged'}")


def _store(run_dir: Path, tracking_uri: Optional[str]):
    """``(the folder's config, experiment id, uri, client)`` of the store a folder syncs into."""
    from mlflow.tracking import MlflowClient

    from raycpt.config import load_config
    from raycpt.tracking import ensure_store, tracking_uri as uri_of

    run_cfg = load_config(run_dir / "config.yaml")
    if tracking_uri:
        run_cfg.tracking.uri = tracking_uri
    exp_id = ensure_store(run_cfg.tracking)  # one line for a store that does not answer
    uri = uri_of(run_cfg.tracking)
    return run_cfg, exp_id, uri, MlflowClient(uri)


def sync_folder(run_dir: Path, tracking_uri: Optional[str] = None, parent: Optional[dict] = None,
                status: Optional[str] = None) -> dict:
    """One training run folder into the store (see the module docstring); ``parent`` (``run_id``, ``name``)
    nests a run made here; ``status`` overrides the folder's. ``{run_id, created, logged, records, status, uri}``."""
    from raycpt.report.train import read_step_records
    from raycpt.runs import read_state, write_state
    from raycpt.tracking import LOST_FILE
    from raycpt.train.loop import METRICS_FILE

    run_cfg, exp_id, uri, client = _store(run_dir, tracking_uri)
    state = read_state(run_dir)
    run_id, created = _target_run(client, run_cfg, run_dir, state, exp_id, parent)
    records = read_step_records(run_dir / METRICS_FILE)
    logged = _log_steps(client, run_id, records)
    _log_result(client, run_id, run_dir)
    status = status or STATUS.get(state.get("status", ""))
    if status is not None:
        client.set_terminated(run_id, status=status)
    moved = {"synced_from": state["mlflow_run_id"]} if created and state.get("mlflow_run_id") else {}
    write_state(run_dir, mlflow_run_id=run_id, tracking_lost=None, synced_to=uri, **moved)
    (run_dir / LOST_FILE).unlink(missing_ok=True)
    return {"run_id": run_id, "created": created, "logged": logged, "records": len(records), "status": status,
            "uri": uri}


# ------------------------------------------------------------------------------------- a sweep's folder
def sweep_sync_plan(state: dict, trials: dict[str, dict]) -> list[dict]:
    """What ``raycpt runs sync SWEEP_DIR`` replays, in order: every trial that began training (``trials`` maps a
    trial name to ``{"meta": its trial.json, "train_state": its train/state.json or None, "finished": whether it
    has result.json}``), then the parent run (``state``: the sweep's state.json).

    A trial's run is the child run its ``trial.json`` names, else the one its training folder's state names, else
    None (a new run, nested under the parent, made by the sync); it ends FINISHED when the trial finished, else
    with its training folder's status. The parent ends with the sweep's status."""
    parent_id = state.get("mlflow_run_id")
    items = []
    for name in sorted(trials):
        t = trials[name]
        train = t.get("train_state")
        if train is None:  # never began training: nothing to replay
            continue
        run_id = (t.get("meta") or {}).get("mlflow_run_id") or train.get("mlflow_run_id")
        status = "FINISHED" if t.get("finished") else STATUS.get(train.get("status", ""))
        items.append({"kind": "trial", "name": name, "folder": f"trials/{name}/train", "run_id": run_id,
                      "parent_run_id": parent_id, "status": status})
    items.append({"kind": "parent", "name": "", "folder": ".", "run_id": parent_id, "parent_run_id": None,
                  "status": STATUS.get(state.get("status", ""))})
    return items


def _sweep_trials(run_dir: Path) -> dict[str, dict]:
    """:func:`sweep_sync_plan`'s view of a sweep folder's ``trials/``."""
    import json

    from raycpt.runs import read_state

    out = {}
    for tdir in sorted(p for p in (run_dir / "trials").glob("*") if p.is_dir()):
        meta = tdir / "trial.json"
        out[tdir.name] = {"meta": json.loads(meta.read_text()) if meta.is_file() else {},
                          "train_state": read_state(tdir / "train") if (tdir / "train" / "state.json").is_file()
                          else None, "finished": (tdir / "result.json").is_file()}
    return out


def sync_sweep(run_dir: Path, tracking_uri: Optional[str] = None) -> str:
    """A sweep's folder: every trial's training folder into its child run (:func:`sync_folder`; the trial's own
    end metrics from ``result.json``), then the parent run (the summary files, its end status); the one line."""
    from raycpt.runs import read_state, write_state
    from raycpt.tracking import LOST_FILE

    state = read_state(run_dir)
    run_cfg, exp_id, uri, client = _store(run_dir, tracking_uri)
    parent_id, parent_new = _target_run(client, run_cfg, run_dir, state, exp_id)
    if parent_new:
        state = {**state, "mlflow_run_id": parent_id}
    plan = sweep_sync_plan(state, _sweep_trials(run_dir))
    steps = made = 0
    for item in plan[:-1]:
        s = _sync_trial(run_dir, item, tracking_uri, client)
        steps, made = steps + s["logged"], made + int(s["created"])
    _log_summary_files(client, parent_id, run_dir)
    if plan[-1]["status"] is not None:
        client.set_terminated(parent_id, status=plan[-1]["status"])
    write_state(run_dir, mlflow_run_id=parent_id, tracking_lost=None, synced_to=uri)
    (run_dir / LOST_FILE).unlink(missing_ok=True)
    return (f"synced {run_dir} into {'a new' if parent_new else 'its'} run {parent_id} at {uri}: {len(plan) - 1} "
            f"trial(s) ({made} new run(s)), {steps} step(s) of metrics added, status {plan[-1]['status'] or 'unchanged'}")


def _sync_trial(run_dir: Path, item: dict, tracking_uri: Optional[str], client) -> dict:
    """One trial of :func:`sweep_sync_plan`: its training folder, then its ``result.json`` metrics and the
    ``trial.json`` that keeps its child run's id."""
    import json

    from raycpt.io import atomic_write_json
    from raycpt.runs import write_state

    tdir = run_dir / item["folder"]
    if item["run_id"]:
        write_state(tdir, mlflow_run_id=item["run_id"])  # the child run the trial made (a trial made none: None)
    s = sync_folder(tdir, tracking_uri, parent={"run_id": item["parent_run_id"], "name": item["name"]},
                    status=item["status"])
    meta_path = tdir.parent / "trial.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("mlflow_run_id") != s["run_id"]:
        atomic_write_json(meta_path, {**meta, "mlflow_run_id": s["run_id"]})
    _log_trial_metrics(client, s["run_id"], tdir.parent / "result.json")
    return s


def _log_trial_metrics(client, run_id: str, result_file: Path) -> None:
    """A finished trial's end metrics (:func:`raycpt.jobs.sweep.trial_metrics`) the run lacks."""
    import json

    from raycpt.jobs.sweep import trial_metrics
    from raycpt.tracking import clean_metrics

    if not result_file.is_file():
        return
    for k, v in clean_metrics(trial_metrics(json.loads(result_file.read_text()))).items():
        # a point of that value, not the latest: tokens_per_s is also a step metric (the last step's is MLflow's
        # latest), wall_time_s also the training run's own
        if not any(m.value == v for m in client.get_metric_history(run_id, k)):
            client.log_metric(run_id, k, v)


def _log_summary_files(client, run_id: str, run_dir: Path) -> None:
    """The sweep summary's files the parent run lacks, under ``summary/``."""
    have = {f.path for f in client.list_artifacts(run_id, "summary")}
    for f in sorted((run_dir / "summary").glob("*")):
        if f.is_file() and f"summary/{f.name}" not in have:
            client.log_artifact(run_id, str(f), artifact_path="summary")
