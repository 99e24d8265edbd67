"""What the driver hands a training worker across Ray: ONE frozen value, :class:`WorkerSpec`.

The driver (:func:`raycpt.train.driver.launch.run_training`) builds it once; Ray pickles it into each worker's
``train_loop_config`` (``{"spec": spec}``, the one key Ray's API requires a dict for); the worker's recipe
(:class:`raycpt.train.worker.loop.TrainingRecipe`) reads its fields by name. Nothing is re-parsed on the way: the
config travels as the validated :class:`~raycpt.config.ExperimentConfig`, the plan as the :class:`LayerPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from raycpt.config import ExperimentConfig
from raycpt.strategies import LayerPlan
from raycpt.train.worker.evaluation import EvalRequest


@dataclass(frozen=True)
class StoreRef:
    """A packed token store the driver chose: its folder and the identity a checkpoint records (``--resume``
    compares it with the store it finds)."""

    path: str
    build_id: Optional[str] = None
    key: Optional[str] = None
    identity: Any = None

    @classmethod
    def of(cls, store) -> "StoreRef":
        """From a :class:`raycpt.data.store` store (``path``, ``build_id``, ``key``, ``identity``)."""
        return cls(str(store.path), store.build_id, store.key, store.identity)


@dataclass(frozen=True)
class TrackingTarget:
    """Where rank 0 logs: the MLflow store's URI, the run (None: records only, no live MLflow run) and the run
    folder whose ``records.jsonl`` keeps every record (:class:`raycpt.train.worker.metrics_log.MetricsLogger`)."""

    uri: str = ""
    run_id: Optional[str] = None
    records: Optional[str] = None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a training worker needs, typed."""

    cfg: ExperimentConfig
    """The validated experiment config (``train``, ``data``, ``eval`` sections are read)."""
    model_path: str
    """The resolved model folder (a checkpoint to resume overrides it)."""
    plan: LayerPlan
    """The layer plan: what trains."""
    run_dir: Optional[str] = None
    """The training folder (step records, ``train_status.json``); None: nothing written but checkpoints."""
    tracking: TrackingTarget = field(default_factory=TrackingTarget)
    resume_from: Optional[str] = None
    """A verified checkpoint folder to continue from (``--resume``)."""
    checkpoint_root: Optional[str] = None
    """Where this attempt's checkpoints land (Ray's run folder or the in-process session's)."""
    store: Optional[StoreRef] = None
    """The packed corpus (None: the session brings its own blocks, as the Ray-less test sessions do)."""
    replay: Optional[StoreRef] = None
    """The replay corpus's packed store (``data.replay.ratio > 0``)."""
    callbacks: tuple = ()
    """:class:`raycpt.train.worker.callbacks.StepCallback` objects, run on every rank."""
    evaluate: Optional[EvalRequest] = None
    """Evaluate the final weights in the worker (rank 0 writes ``eval_result.json``)."""
    faults: Mapping[str, Any] = field(default_factory=dict)
    """Fault injection (:class:`raycpt.train.worker.faults.FaultHooks`; ``RAYCPT_FAULTS`` merged by the driver)."""
    torch_threads: Optional[int] = None
    """CPU threads per worker (None: the node's cores shared among its workers)."""
    local_mode: bool = False
    """Train V2's local mode: the loop runs in the calling process (:class:`InProcessSession`)."""
    base_shards: Optional[str] = None
    """The base model's per-layer shards (``train.publish: reference``) the in-process session links from."""

    def data_position(self, step: int, epoch: int) -> dict:
        """What a checkpoint records of the data: micro-batches consumed and the packs they came from."""
        pos = {"micro_batches_consumed": step * self.cfg.train.grad_accum, "epoch": epoch,
               "store_build": self.store.build_id if self.store else None,
               "store_key": self.store.key if self.store else None,
               "store_identity": self.store.identity if self.store else None}
        if self.replay is not None:
            pos.update({k: v for k, v in (("replay_store_build", self.replay.build_id),
                                          ("replay_store_key", self.replay.key),
                                          ("replay_store_identity", self.replay.identity)) if v})
        return pos
