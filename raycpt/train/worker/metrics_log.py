"""The worker's metrics logger: rank 0's step records in the training folder and its run's records, projected
into MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from raycpt.tracking import append_record, call_unless_lost, clean_metrics, project, read_records
from raycpt.train.worker.background import BackgroundCalls
from raycpt.train.ckpt.checkpoint import json_safe
from raycpt.train.worker.sysmetrics import StepSystemMetrics

METRICS_FILE = "train_metrics.jsonl"


class MetricsLogger:
    """Rank 0's sink: the step records (a JSONL file in the training folder, which the driver's progress bar tails)
    and the run's records (:data:`raycpt.tracking.RECORDS` in the run's folder, ``target.records``), each
    projected into MLflow (:func:`raycpt.tracking.project`) while the server answers.

    The MLflow calls (a SQLite write or an HTTP round trip each) run on one background thread, in order
    (:class:`raycpt.train.worker.background.BackgroundCalls`), so a step never waits for the store; :meth:`close` (end of
    the loop) waits for what is queued."""

    def __init__(self, run_dir: Optional[Path], target=None):
        """``target``: a :class:`raycpt.train.worker.spec.TrackingTarget` (None: no records, no MLflow)."""
        self.path = Path(run_dir) / METRICS_FILE if run_dir else None
        self.records = Path(target.records) if target is not None and target.records else None
        self.client, self.run_id, self.uri = None, getattr(target, "run_id", None), getattr(target, "uri", "") or ""
        self._queue: Optional[BackgroundCalls] = None
        # a resumed attempt re-runs the steps after its checkpoint: the run keeps one point per step
        self.logged_through = max((int(r.get("step") or 0) for r in read_records(self.records)
                                   if "loss" in r.get("metrics", {})), default=0) if self.records else 0
        self.system = StepSystemMetrics()  # CPU / memory / GPU of this step window, recorded with the step
        if self.run_id:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=self.uri)

    def _guarded(self, fn, step: Optional[int], *args, **kwargs):
        """``fn(...)`` unless the tracking server was found gone (:func:`raycpt.tracking.call_unless_lost`: the
        first call that finds it gone records that with this step in the run folder; training goes on)."""
        return call_unless_lost(fn, args, kwargs, self.uri, step, self.path.parent if self.path is not None else None)

    def _record(self, rec: dict, step: Optional[int] = None, wait: bool = False) -> None:
        """One record into the run's folder, then (queued, or at once with ``wait``) into its MLflow run."""
        if self.records is None:
            return
        append_record(self.records, rec)
        if self.client is None:
            return
        if wait:
            self.close()  # what was queued first
            try:
                self._guarded(project, step, self.client, self.run_id, rec, self.records)
            except Exception:  # noqa: BLE001 - an artifact store hiccup must not fail the training run
                pass
        else:
            self._submit(self._guarded, project, step, self.client, self.run_id, rec, self.records)

    def event(self, record: dict) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
                f.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.records is None or step <= self.logged_through:
            return
        clean = clean_metrics({**metrics, **self.system.sample()})
        if clean:
            self._record({"metrics": clean, "step": int(step)}, step)

    def params(self, params: dict[str, Any]) -> None:
        # a resumed run re-logs the same params: the value the run has is kept (never fails training)
        self._record({"params": {k: str(v)[:500] for k, v in params.items()}})

    def _submit(self, fn, *args, **kwargs) -> None:
        if self._queue is None:
            self._queue = BackgroundCalls()
        self._queue.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Wait until every queued MLflow call has run (then the thread ends)."""
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def text(self, text: str, artifact_file: str) -> None:
        """A text artifact of the run (queued like the metrics)."""
        self._record({"text": text, "file": artifact_file})

    def artifact(self, path) -> None:
        """A file of the run (end of training: after every queued metric)."""
        self._record({"artifact": str(Path(path).resolve()), "dir": None}, wait=True)
