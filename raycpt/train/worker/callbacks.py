"""Per-step hooks of the training loop: :class:`StepCallback`, what it sees (:class:`LoopState`), the
factory registry the launcher asks (:func:`callbacks_for`), and the callbacks raycpt ships.

A callback runs on every rank every ``callback.every`` optimizer steps and may return extra metrics.
Callbacks travel to the workers inside the loop config, so they must be picklable. A factory
``factory(cfg, model_path) -> StepCallback | None`` runs on the driver with the model folder the run
starts from (already resolved), registered with :func:`register_step_callback`.

Shipped: :class:`DriftCallback` (``train.drift_every = N``): which layers move while a plan trains.
Every N steps, rank 0 logs per decoder layer, against the *starting* model (the model the run began
from, also after a resume), the metrics of :func:`raycpt.diagnostics.drift.drift_metrics`
(``drift.dW.L{i}``, ``drift.rel_dW.L{i}``, ``drift.cka.L{i}``, ``drift.dW.mean``, ``drift.cka.min``)
as MLflow metric series (step = training step). At the end of training it writes ``drift.json`` and
``drift.png`` (two layer x step heatmaps) into the run folder and logs them as artifacts. The factory
tokenises the fixed probe batch on the driver; only rank 0 computes (a forward of the unwrapped model
outside DDP: no collective op). With FSDP the unwrapped model holds only shards, so drift is skipped
with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from raycpt.diagnostics.drift import PROBE_PROMPTS, drift_metrics, layer_params, layer_states, probe_ids, probe_texts
from raycpt.io import atomic_write_json
from raycpt.models.sources import load_model
from raycpt.report.train import plot_drift
from raycpt.strategies import LayerPlan
from raycpt.train.worker.parallel import uses_fsdp


@dataclass
class LoopState:
    """What a :class:`StepCallback` sees. ``model`` is the plain (unwrapped) model; ``logger`` the
    rank-0 metrics sink of the loop (``raycpt.train.worker.metrics_log.MetricsLogger``; None on other ranks)."""

    step: int
    max_steps: int
    model: Any
    wrapped: Any
    plan: LayerPlan
    rank: int
    world_size: int
    device: torch.device
    cfg: Any
    run_dir: Optional[Path]
    metrics: dict = field(default_factory=dict)
    logger: Optional[Any] = None

    def log(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        """Log extra metrics (rank 0 only writes; safe to call on every rank)."""
        if self.rank == 0 and self.logger is not None:
            self.logger.log(metrics, self.step if step is None else step)

    def log_artifact(self, path: Optional[Path]) -> None:
        """Attach a file to the run's MLflow run (rank 0 only; a store hiccup never fails training)."""
        if self.rank == 0 and self.logger is not None and path is not None:
            self.logger.artifact(path)


class StepCallback:
    """Runs on every rank. ``every`` = call ``on_step_end`` every N optimizer steps (0 = never).

    Keep callbacks picklable (they travel to the workers in the loop config). Collective ops are
    allowed (every rank calls the hook at the same step)."""

    every: int = 0

    def on_train_start(self, state: LoopState) -> None:  # noqa: D401
        pass

    def on_step_end(self, state: LoopState) -> Optional[dict[str, float]]:
        return None

    def on_train_end(self, state: LoopState) -> None:
        pass


CallbackFactory = Callable[[Any, str], Optional[StepCallback]]
CALLBACK_FACTORIES: list[CallbackFactory] = []


def register_step_callback(factory: CallbackFactory) -> CallbackFactory:
    """Register ``factory(cfg, model_path) -> StepCallback | None``; :func:`callbacks_for` calls every factory."""
    CALLBACK_FACTORIES.append(factory)
    return factory


def callbacks_for(cfg, model_path: str) -> list[StepCallback]:
    """The callbacks a config asks for (e.g. ``train.drift_every > 0`` -> a :class:`DriftCallback`);
    ``model_path`` is the resolved folder the run starts from."""
    out = []
    for f in CALLBACK_FACTORIES:
        cb = f(cfg, model_path)
        if cb is not None:
            out.append(cb)
    return out


# ------------------------------------------------------------------------------------ drift

class DriftCallback(StepCallback):
    """Logs weight change and probe CKA per layer every ``every`` steps (rank 0)."""

    def __init__(self, every: int, model_path: str, probe: list[list[int]]):
        self.every = int(every)
        self.model_path = model_path
        self.probe = probe
        self._start_params = None
        self._start_states = None
        self._ids = None
        self._history: list[dict] = []
        self._skip: Optional[str] = None

    def on_train_start(self, state: LoopState) -> None:
        if state.rank != 0:
            return
        if uses_fsdp(state.cfg.train.distributed, state.world_size):
            self._skip = "drift skipped: with FSDP the unwrapped model holds only parameter shards"
            state.log({"drift.skipped": 1.0})
            return

        start, _ = load_model(self.model_path, dtype="float32", device="cpu")  # the run's starting weights
        self._start_params = layer_params(start)
        self._ids = torch.tensor(self.probe, dtype=torch.long) if self.probe else None
        self._start_states = layer_states(start, self._ids) if self._ids is not None else None
        del start
        if state.step == 0:
            self._record(state, drift_metrics(self._start_params, self._start_states, state.model, self._ids)
                         if self._ids is not None else {})

    def _record(self, state: LoopState, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        state.log(metrics)
        self._history.append({"step": state.step, **metrics})

    def on_step_end(self, state: LoopState) -> Optional[dict[str, float]]:
        if state.rank != 0 or self._skip or self._start_params is None:
            return None
        m = drift_metrics(self._start_params, self._start_states, state.model, self._ids)
        self._record(state, m)
        return None

    def on_train_end(self, state: LoopState) -> None:
        if state.rank != 0 or not self._history or state.run_dir is None:
            return

        path = atomic_write_json(Path(state.run_dir) / "drift.json", self._history)
        png = plot_drift(self._history, Path(state.run_dir) / "drift.png")
        for p in (path, png):
            state.log_artifact(p)


@register_step_callback
def drift_factory(cfg, model_path: str) -> Optional[DriftCallback]:
    """``train.drift_every > 0`` -> a :class:`DriftCallback` (runs on the driver: tokenises the probe)."""
    if not cfg.train.drift_every:
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return DriftCallback(cfg.train.drift_every, model_path, probe_ids(tok, probe_texts(PROBE_PROMPTS)))
