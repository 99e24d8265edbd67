"""The worker's metrics logger: rank 0's JSONL file in the run folder and its MLflow points."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional

from raycpt.tracking import mark_lost, tracking_lost, unreachable
from raycpt.train.background import BackgroundCalls
from raycpt.train.checkpoint import json_safe
from raycpt.train.sysmetrics import StepSystemMetrics

METRICS_FILE = "train_metrics.jsonl"


class MetricsLogger:
    """Rank 0's sink: a JSONL file in the run folder (the driver's progress bar tails it) + MLflow.

    Metric and param writes (a SQLite write or an HTTP round trip each) run on one background thread,
    in order (:class:`raycpt.train.background.BackgroundCalls`), so a step never waits for the store;
    :meth:`close` (end of the loop) waits for what is queued."""

    def __init__(self, run_dir: Optional[Path], mlflow_cfg: Optional[dict]):
        self.path = Path(run_dir) / METRICS_FILE if run_dir else None
        self.client = None
        self.run_id = None
        self.logged_through = 0
        self._queue: Optional[BackgroundCalls] = None
        if mlflow_cfg and mlflow_cfg.get("run_id"):
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=mlflow_cfg["uri"])
            self.run_id = mlflow_cfg["run_id"]
            self.uri = mlflow_cfg["uri"]
            # a resumed attempt re-runs the steps after its checkpoint: MLflow keeps one point per step
            history = self._guarded(self.client.get_metric_history, 1, self.run_id, "loss") or []
            self.logged_through = max((m.step for m in history), default=0)
            self.system = StepSystemMetrics()  # CPU / memory / GPU of this step window, logged with the step

    def _guarded(self, fn, step: Optional[int], *args, **kwargs):
        """``fn(...)`` unless the tracking server was found gone; the first call that finds it gone (it does not
        answer) records that with the step whose record did not arrive (``tracking_lost.json`` in the run folder,
        :func:`raycpt.tracking.mark_lost`): later calls are skipped, training goes on, the driver says so."""
        if tracking_lost():
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only a server that does not answer is swallowed
            if not unreachable(e):
                raise
            mark_lost(self.uri, step, str(e), self.path.parent if self.path is not None else None)
            return None

    def event(self, record: dict) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
                f.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is None or step <= self.logged_through:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step) for k, v in {**metrics, **self.system.sample()}.items()
              if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if ms:
            self._submit(self._guarded, self.client.log_batch, step, self.run_id, metrics=ms)

    def params(self, params: dict[str, Any]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        # a resumed run re-logs the same params: that error is logged and ignored (never fails training)
        self._submit(self._guarded, self.client.log_batch, None, self.run_id,
                     params=[Param(k, str(v)[:500]) for k, v in params.items()])

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
        if self.client is not None:
            self._submit(self._guarded, self.client.log_text, None, self.run_id, text, artifact_file)

    def artifact(self, path) -> None:
        if self.client is None:
            return
        self.close()  # metrics first, then the artifact (end of training)
        try:
            self._guarded(self.client.log_artifact, None, self.run_id, str(path))
        except Exception:  # noqa: BLE001 - an artifact store hiccup must not fail the training run
            pass
