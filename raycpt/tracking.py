"""MLflow: where the store lives, parent/child runs, and runs that always end.

The default store is SQLite in the run root, by absolute path, created by the driver
(:func:`ensure_store`) before any trial logs, so concurrent first writers never race on the schema
migration. :func:`mlflow_run` ends a run FINISHED, FAILED (exception) or KILLED (Ctrl-C), never
RUNNING. Inside Ray workers only rank 0 logs (the callers check the rank).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from raycpt.config import ExperimentConfig, TrackingConfig


def run_root(cfg: TrackingConfig) -> Path:
    return Path(cfg.run_root).expanduser().resolve()


def tracking_uri(cfg: TrackingConfig) -> str:
    """The MLflow URI: the configured one, else ``sqlite:////abs/run_root/mlflow.db``."""
    if cfg.uri:
        uri = cfg.uri
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
        return uri
    return f"sqlite:///{run_root(cfg) / 'mlflow.db'}"


def ensure_store(cfg: TrackingConfig) -> str:
    """Create the store and the experiment from the driver; return the experiment id."""
    import mlflow

    run_root(cfg).mkdir(parents=True, exist_ok=True)
    uri = tracking_uri(cfg)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient(uri)
    if client.get_experiment_by_name(cfg.experiment) is None and uri.startswith("sqlite:"):
        # artifacts next to the store, not in ./mlruns of whatever folder the command runs from
        art = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        try:
            client.create_experiment(cfg.experiment, artifact_location=art)
        except Exception:  # noqa: BLE001 - another process created it first
            pass
    exp = mlflow.set_experiment(cfg.experiment)
    return exp.experiment_id


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def log_config(cfg: ExperimentConfig) -> None:
    """Log the whole config as flat params (values truncated to MLflow's limit)."""
    import dataclasses

    import mlflow

    params = {k: str(v)[:500] for k, v in flatten(dataclasses.asdict(cfg)).items()}
    items = list(params.items())
    for i in range(0, len(items), 100):
        mlflow.log_params(dict(items[i:i + 100]))


def log_metrics(metrics: dict[str, float], step: Optional[int] = None) -> None:
    """Log finite numeric metrics; names are sanitised for MLflow (``/`` and ``.`` are kept)."""
    import mlflow

    clean = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            clean[k.replace(" ", "_").replace("(", "").replace(")", "")] = f
    if clean:
        mlflow.log_metrics(clean, step=step)


@contextlib.contextmanager
def mlflow_run(cfg: TrackingConfig, run_name: str | None = None, run_id: str | None = None,
               parent_run_id: str | None = None, tags: dict | None = None) -> Iterator[Any]:
    """Start (or continue, with ``run_id``) a run; nest it under ``parent_run_id`` if given.

    The run ends FINISHED on success, KILLED on KeyboardInterrupt/SystemExit from a signal,
    FAILED on any other exception, so nothing is left RUNNING.
    """
    import mlflow

    exp_id = ensure_store(cfg)
    kwargs: dict[str, Any] = {}
    if run_id:
        kwargs["run_id"] = run_id
    else:
        kwargs.update(run_name=run_name, experiment_id=exp_id)
    if parent_run_id:
        kwargs["nested"] = True
        kwargs["parent_run_id"] = parent_run_id
    client = mlflow.tracking.MlflowClient()
    run = mlflow.start_run(tags=tags, **kwargs)
    try:
        yield run
    except KeyboardInterrupt:
        client.set_terminated(run.info.run_id, status="KILLED")
        _pop_active(run.info.run_id)
        raise
    except BaseException:
        client.set_terminated(run.info.run_id, status="FAILED")
        _pop_active(run.info.run_id)
        raise
    else:
        mlflow.end_run(status="FINISHED")


def _pop_active(run_id: str) -> None:
    import mlflow

    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        mlflow.end_run(status=mlflow.get_run(run_id).info.status)


def end_stale_runs(cfg: TrackingConfig, status: str = "KILLED") -> int:
    """Mark runs left RUNNING by a killed driver as ``status``; return how many were fixed."""
    import mlflow

    ensure_store(cfg)
    client = mlflow.tracking.MlflowClient()
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is None:
        return 0
    n = 0
    for r in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
        client.set_terminated(r.info.run_id, status=status)
        n += 1
    return n
