"""Tests build a training worker's :class:`~raycpt.train.worker.spec.WorkerSpec` from a plain mapping (the shape
the loop config had before the spec existed): ``worker_spec({...})``. Every key must be one the spec knows, so a
test cannot hand the worker a setting it silently ignores."""

from __future__ import annotations

from typing import Mapping

from raycpt.config import ExperimentConfig, config_from_dict
from raycpt.strategies import LayerPlan
from raycpt.train.worker.spec import StoreRef, TrackingTarget, WorkerSpec

_PLAIN = {"model_path", "run_dir", "resume_from", "checkpoint_root", "evaluate", "torch_threads", "local_mode",
          "base_shards"}
_KNOWN = _PLAIN | {"cfg", "plan", "mlflow", "store", "store_build", "store_key", "store_identity", "replay_store",
                   "replay_store_build", "replay_store_key", "replay_store_identity", "callbacks", "faults"}


def worker_spec(d: Mapping) -> WorkerSpec:
    unknown = set(d) - _KNOWN
    if unknown:
        raise KeyError(f"not a worker setting: {sorted(unknown)}")
    cfg = d["cfg"] if isinstance(d["cfg"], ExperimentConfig) else config_from_dict(d["cfg"])
    plan = d["plan"] if isinstance(d["plan"], LayerPlan) else LayerPlan.from_dict(d["plan"])
    m = d.get("mlflow") or {}
    store = StoreRef(str(d["store"]), d.get("store_build"), d.get("store_key"), d.get("store_identity")) \
        if d.get("store") else None
    replay = StoreRef(str(d["replay_store"]), d.get("replay_store_build"), d.get("replay_store_key"),
                      d.get("replay_store_identity")) if d.get("replay_store") else None
    return WorkerSpec(cfg=cfg, plan=plan, tracking=TrackingTarget(m.get("uri", ""), m.get("run_id"), m.get("records")),
                      store=store, replay=replay, callbacks=tuple(d.get("callbacks") or ()),
                      faults=dict(d.get("faults") or {}), **{k: d[k] for k in _PLAIN if k in d})
