"""``raycpt runs sync RUN_DIR``: replay a ``raycpt train`` run folder into an MLflow store, for a run whose tracking
server went away mid-run (its folder has everything: ``config.yaml``, ``state.json``, ``train_metrics.jsonl``,
``train_result.json``, ``loss_curve.png``, ``final_model/``).

The run ``state.json`` names is continued when the store has it (the steps it lacks a ``loss`` point for are
logged, none twice); else a new run is made in the config's experiment, with the config as
params and ``raycpt.synced_from`` naming the old id, and ``state.json`` then names the new run. The run ends
with the folder's status (finished -> FINISHED, failed -> FAILED, interrupted -> KILLED). Idempotent: a second
sync logs nothing new.

A grid's folder (``raycpt sweep``, ``raycpt contribution``, ``raycpt hybrid run``; :data:`LAYOUTS`) syncs its parent
run and every trial's (:func:`sync_grid`, planned by the pure :func:`grid_sync_plan`): each trial's training folder
as above, then the trial's own end records computed from its files by the job's own functions (the ones its live
logging uses), a trace that ran with the server gone, then the parent's summary records and files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

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
    if read_state(run_dir).get("command") in LAYOUTS:
        return sync_grid(run_dir, tracking_uri)
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
    from raycpt.train.metrics_log import METRICS_FILE

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


# ------------------------------------------------------------------------------------- a grid's folder
@dataclass(frozen=True)
class GridLayout:
    """Where a grid command keeps its trials (:class:`raycpt.jobs.grid.Grid`'s ``folder``, ``meta_file``,
    ``name_tag``) and what its trial and parent runs get besides their training folders."""

    folder: str
    meta_file: str
    name_tag: str
    trial_log: Callable  # (client, run_id, trial folder, meta) -> None: the trial's own end records
    parent_log: Callable  # (client, run_id, run folder, state) -> None: the parent's summary records


def missing_points(metrics: dict, series: list, have: dict) -> list[tuple[str, int, float]]:
    """``(key, step, value)`` of what a run lacks: an end metric (logged at step 0) unless some point of its
    history has that value (a trial's ``tokens_per_s`` is also a step metric, ``wall_time_s`` its training run's
    own too), a series point ``(key, step, value)`` unless its history has that step with that value. ``metrics``
    are cleaned for MLflow (:func:`raycpt.tracking.clean_metrics`: finite numbers only); ``have`` maps a key to
    its history's ``(step, value)`` pairs."""
    from raycpt.tracking import clean_metrics

    out = [(k, 0, v) for k, v in clean_metrics(metrics).items() if v not in {x for _, x in have.get(k, ())}]
    for key, step, v in series:
        clean = clean_metrics({key: v})
        for k, x in clean.items():
            if (int(step), x) not in set(have.get(k, ())) and (k, int(step), x) not in out:
                out.append((k, int(step), x))
    return out


def _log_missing(client, run_id: str, metrics: dict, series: list = ()) -> int:
    """:func:`missing_points` into the run; how many points were logged."""
    from raycpt.tracking import clean_metrics, log_points

    keys = set(clean_metrics(metrics)) | set(clean_metrics({k: 0.0 for k, _, _ in series}))
    have = {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}
    return log_points(client, run_id, missing_points(metrics, list(series), have))


def _log_params_missing(client, run_id: str, params: dict) -> None:
    """The params the run lacks (a value it has is never changed: MLflow refuses that)."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    new = [Param(k, str(v)[:500]) for k, v in params.items() if v is not None and k not in have]
    if new:
        client.log_batch(run_id, params=new)


def _log_files(client, run_id: str, base: Path, entries) -> None:
    """``(file, artifact folder)`` entries (a file relative to ``base``, or absolute) the run lacks."""
    listed: dict[str, set] = {}
    for path, folder in entries:
        f = Path(base) / path
        if not f.is_file():
            continue
        if folder not in listed:
            listed[folder] = {a.path for a in client.list_artifacts(run_id, folder or None)}
        if (f"{folder}/{f.name}" if folder else f.name) not in listed[folder]:
            client.log_artifact(run_id, str(f), artifact_path=folder or None)


def _read_json(path: Path):
    import json

    return json.loads(path.read_text()) if path.is_file() else None


def grid_sync_plan(state: dict, trials: dict[str, dict], folder: str = "trials",
                   trace: Optional[dict] = None) -> list[dict]:
    """What ``raycpt runs sync GRID_DIR`` (a sweep, a contribution scan, a hybrid run) replays, in order: the
    grid's own trace (``trace``: its ``trace/state.json``) when it was not recorded, every trial that began training
    or finished (``trials`` maps a trial name to ``{"meta": its trial.json, "train_state": its train/state.json or
    None, "finished": whether it has result.json, "trace_state": its trace/state.json or None}``), each followed
    by its trace when that was not recorded, then the parent run (``state``: the grid's state.json).

    A trial's run is the child run its meta names, else the one its training folder's state names, else None (a
    new run, nested under the parent, named by its spec's ``label`` or its name, made by the sync); it ends FINISHED
    when the trial finished, else with its training folder's status. ``folder`` is the trial's training folder,
    None for a trial that trains nothing (a scan's ``base``). A trace was not recorded when its state names no run
    or says ``tracking_lost``; its run nests under the grid's parent (``parent_trial`` None) or its trial's run. The
    parent ends with the grid's status."""
    parent_id = state.get("mlflow_run_id")
    items = [_trace_item("", "trace", trace, parent_id, None)] if _unrecorded(trace) else []
    for name in sorted(trials):
        t = trials[name]
        train, meta = t.get("train_state"), t.get("meta") or {}
        if train is None and not t.get("finished"):  # never began: nothing to replay
            continue
        run_id = meta.get("mlflow_run_id") or (train or {}).get("mlflow_run_id")
        status = "FINISHED" if t.get("finished") else STATUS.get(train.get("status", ""))
        items.append({"kind": "trial", "name": name, "label": (meta.get("spec") or {}).get("label") or name,
                      "dir": f"{folder}/{name}", "folder": None if train is None else f"{folder}/{name}/train",
                      "run_id": run_id, "parent_run_id": parent_id, "status": status})
        if _unrecorded(t.get("trace_state")):
            items.append(_trace_item(name, f"{folder}/{name}/trace", t["trace_state"], run_id, name))
    items.append({"kind": "parent", "name": "", "folder": ".", "run_id": parent_id, "parent_run_id": None,
                  "status": STATUS.get(state.get("status", ""))})
    return items


def sweep_sync_plan(state: dict, trials: dict[str, dict]) -> list[dict]:
    """A sweep folder's :func:`grid_sync_plan` (trials under ``trials/``, no trace)."""
    return grid_sync_plan(state, trials)


def _unrecorded(trace_state: Optional[dict]) -> bool:
    return trace_state is not None and bool(trace_state.get("tracking_lost") or not trace_state.get("mlflow_run_id"))


def _trace_item(name: str, folder: str, trace_state: dict, parent_run_id, parent_trial) -> dict:
    return {"kind": "trace", "name": name, "folder": folder, "run_id": trace_state.get("mlflow_run_id"),
            "parent_run_id": parent_run_id, "parent_trial": parent_trial,
            "status": STATUS.get(trace_state.get("status", ""))}


def _grid_trials(run_dir: Path, layout: GridLayout) -> dict[str, dict]:
    """:func:`grid_sync_plan`'s view of a grid folder's trials."""
    from raycpt.runs import read_state

    out = {}
    for tdir in sorted(p for p in (run_dir / layout.folder).glob("*") if p.is_dir()):
        out[tdir.name] = {"meta": _read_json(tdir / layout.meta_file) or {},
                          "train_state": read_state(tdir / "train") if (tdir / "train" / "state.json").is_file()
                          else None, "finished": (tdir / "result.json").is_file(),
                          "trace_state": read_state(tdir / "trace") if (tdir / "trace" / "state.json").is_file()
                          else None}
    return out


def sync_grid(run_dir: Path, tracking_uri: Optional[str] = None) -> str:
    """A grid's folder (a sweep, a contribution scan, a hybrid run): every trial's training folder into its child
    run (:func:`sync_folder`), the trial's own end records (:attr:`GridLayout.trial_log`), a trace not recorded
    (:func:`_sync_trace`), then the parent run (:attr:`GridLayout.parent_log`, its end status); the one line."""
    from raycpt.runs import read_state, write_state
    from raycpt.tracking import LOST_FILE

    state = read_state(run_dir)
    layout = LAYOUTS[state["command"]]
    run_cfg, exp_id, uri, client = _store(run_dir, tracking_uri)
    parent_id, parent_new = _target_run(client, run_cfg, run_dir, state, exp_id)
    if parent_new:
        state = {**state, "mlflow_run_id": parent_id}
    trace = read_state(run_dir / "trace") if (run_dir / "trace" / "state.json").is_file() else None
    plan = grid_sync_plan(state, _grid_trials(run_dir, layout), layout.folder, trace)
    steps = made = 0
    ids: dict[str, str] = {}
    for item in plan[:-1]:
        if item["kind"] == "trace":
            parent = ids.get(item["parent_trial"]) if item["parent_trial"] else parent_id
            _sync_trace(client, run_dir / item["folder"], {**item, "parent_run_id": parent}, exp_id, uri)
            continue
        s = _sync_trial(run_dir, item, tracking_uri, client, exp_id, state["command"], layout)
        ids[item["name"]] = s["run_id"]
        steps, made = steps + s["logged"], made + int(s["created"])
    layout.parent_log(client, parent_id, run_dir, state)
    if plan[-1]["status"] is not None:
        client.set_terminated(parent_id, status=plan[-1]["status"])
    write_state(run_dir, mlflow_run_id=parent_id, tracking_lost=None, synced_to=uri)
    (run_dir / LOST_FILE).unlink(missing_ok=True)
    trials = sum(i["kind"] == "trial" for i in plan)
    return (f"synced {run_dir} into {'a new' if parent_new else 'its'} run {parent_id} at {uri}: {trials} "
            f"trial(s) ({made} new run(s)), {steps} step(s) of metrics added, status {plan[-1]['status'] or 'unchanged'}")


sync_sweep = sync_grid


def _sync_trial(run_dir: Path, item: dict, tracking_uri: Optional[str], client, exp_id: str, command: str,
                layout: GridLayout) -> dict:
    """One trial of :func:`grid_sync_plan`: its training folder (or, for a trial that trains nothing, its child
    run), the tags of a run made here, the meta file that keeps its child run's id, its own end records."""
    from raycpt.io import atomic_write_json
    from raycpt.runs import write_state

    tdir = run_dir / item["dir"]
    if item["folder"] is not None:
        train = run_dir / item["folder"]
        if item["run_id"]:
            write_state(train, mlflow_run_id=item["run_id"])  # the child run the trial made (a trial made none: None)
        s = sync_folder(train, tracking_uri, parent={"run_id": item["parent_run_id"], "name": item["label"]},
                        status=item["status"])
    else:
        s = _child_run(client, exp_id, item)
    if s["created"]:  # the tags the trial's ChildRun gives its run
        client.set_tag(s["run_id"], "raycpt.command", command)
        client.set_tag(s["run_id"], layout.name_tag, item["name"])
    meta_path = tdir / layout.meta_file
    meta = _read_json(meta_path) or {}
    if meta.get("mlflow_run_id") != s["run_id"]:
        atomic_write_json(meta_path, {**meta, "mlflow_run_id": s["run_id"]})
    layout.trial_log(client, s["run_id"], tdir, meta)
    return s


def _child_run(client, exp_id: str, item: dict) -> dict:
    """The child run of a trial without a training folder (a scan's ``base``): the one it names when the store has
    it, else a new one nested under the parent; ended with the item's status."""
    from mlflow.exceptions import MlflowException

    run_id, created = item["run_id"], False
    if run_id:
        try:
            client.get_run(run_id)
        except MlflowException:
            run_id = None
    if not run_id:
        nest = {"mlflow.parentRunId": item["parent_run_id"]} if item["parent_run_id"] else {}
        run_id, created = client.create_run(exp_id, run_name=item["label"], tags=nest).info.run_id, True
    if item["status"] is not None:
        client.set_terminated(run_id, status=item["status"])
    return {"run_id": run_id, "created": created, "logged": 0}


def _sync_trace(client, tdir: Path, item: dict, exp_id: str, uri: str) -> None:
    """A trace folder whose run was not recorded (it ran, or finished, with the server gone): its run (made here
    when the store lacks it, nested under ``item["parent_run_id"]``), its params and metrics from ``summary.json``
    (:func:`raycpt.jobs.trace.trace_records`), its files, its end status."""
    from raycpt.config import load_config
    from raycpt.jobs.trace import trace_params, trace_records
    from raycpt.runs import read_state, write_state
    from raycpt.tracking import LOST_FILE

    cfg, state = load_config(tdir / "config.yaml"), read_state(tdir)
    run_id, _ = _target_run(client, cfg, tdir, state, exp_id,
                            parent={"run_id": item["parent_run_id"], "name": f"trace-{cfg.name}"})
    summary = _read_json(tdir / "summary.json")
    if summary is not None:
        _log_params_missing(client, run_id, trace_params(summary))
        series, metrics = trace_records(summary)
        _log_missing(client, run_id, metrics, series)
    _log_files(client, run_id, tdir, state.get("artifacts") or [])
    if item["status"] is not None:
        client.set_terminated(run_id, status=item["status"])
    write_state(tdir, mlflow_run_id=run_id, tracking_lost=None, synced_to=uri)
    (tdir / LOST_FILE).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------- what each grid's runs get
def _sweep_trial(client, run_id: str, tdir: Path, meta: dict) -> None:
    """A finished sweep trial's end metrics (:func:`raycpt.jobs.sweep.trial_metrics`) the run lacks."""
    from raycpt.jobs.sweep import trial_metrics

    result = _read_json(tdir / "result.json")
    if result is not None:
        _log_missing(client, run_id, trial_metrics(result))


def _sweep_parent(client, run_id: str, run_dir: Path, state: dict) -> None:
    """The sweep summary's files the parent run lacks, under ``summary/``."""
    _log_files(client, run_id, run_dir, [(f"summary/{f.name}", "summary") for f in sorted((run_dir / "summary")
                                                                                        .glob("*")) if f.is_file()])


def _scan_trial(client, run_id: str, tdir: Path, meta: dict) -> None:
    """A scan trial's params (from its spec) and end records (:func:`raycpt.jobs.contribution.scan_trial_records`)."""
    from raycpt.jobs.contribution import scan_params, scan_trial_records

    if meta.get("spec"):
        _log_params_missing(client, run_id, scan_params(meta["spec"]))
    result = _read_json(tdir / "result.json")
    if result is not None:
        _log_missing(client, run_id, *scan_trial_records(result))


def _scan_parent(client, run_id: str, run_dir: Path, state: dict) -> None:
    """The scan's summary records (:func:`raycpt.jobs.contribution.scan_summary_records`) and files."""
    from raycpt.jobs.contribution import scan_summary_records

    summary = _read_json(run_dir / "summary.json")
    if summary is not None:
        _log_missing(client, run_id, *scan_summary_records(summary, state.get("wall_s", float("nan"))))
    _log_files(client, run_id, run_dir, state.get("artifacts") or [])


def _hybrid_build(client, run_id: str, tdir: Path, meta: dict) -> None:
    """A build's params and segment map (unless logged), its end metrics and files
    (:func:`raycpt.jobs.hybrid.build_records`)."""
    from raycpt.jobs.hybrid import SEGMENT_MAP, build_params, build_records

    built = _read_json(tdir / "initial" / SEGMENT_MAP)
    if built is not None and not meta.get("params_logged"):
        _log_params_missing(client, run_id, build_params(built))
        _log_files(client, run_id, tdir, [(f"initial/{SEGMENT_MAP}", "")])
    result = _read_json(tdir / "result.json")
    if result is not None:
        metrics, files = build_records(result, [p for p in (tdir / "eval").glob("*") if p.is_file()])
        _log_missing(client, run_id, metrics)
        _log_files(client, run_id, tdir, files)


def _hybrid_parent(client, run_id: str, run_dir: Path, state: dict) -> None:
    """The hybrid run's metrics (:func:`raycpt.jobs.hybrid.hybrid_summary_metrics`) and files."""
    from raycpt.jobs.hybrid import hybrid_summary_metrics

    summary = _read_json(run_dir / "summary.json")
    if summary is not None:
        _log_missing(client, run_id, hybrid_summary_metrics(summary))
    _log_files(client, run_id, run_dir, state.get("artifacts") or [])


LAYOUTS = {
    "sweep": GridLayout("trials", "trial.json", "raycpt.trial", _sweep_trial, _sweep_parent),
    "contribution": GridLayout("trials", "trial.json", "raycpt.trial", _scan_trial, _scan_parent),
    "hybrid": GridLayout("builds", "build.json", "raycpt.build", _hybrid_build, _hybrid_parent),
}
"""The grid commands ``raycpt runs sync`` replays, by ``state.json``'s ``command``."""
