"""Drift during training (``train.drift_every = N``): which layers move while a plan trains.

Every N optimizer steps, rank 0 logs per decoder layer, against the *starting* model (the model the
run began from, also after a resume):

* ``drift.dW.L{i}`` - ``||W_i(now) - W_i(start)||_F`` over all parameters of layer i;
* ``drift.rel_dW.L{i}`` - the same divided by ``||W_i(start)||_F``;
* ``drift.cka.L{i}`` - linear CKA between the layer's residual stream now and at the start, on a
  fixed probe batch (the shipped WordNet glosses, `builtin:wordnet-glosses`, the same tokens every time; massive-activation tokens, norm
  > 10x the median, left out as in ``raycpt compare``);

as MLflow metric series (step = training step), plus ``drift.dW.mean`` / ``drift.cka.min``. At the
end of training it writes ``drift.json`` and ``drift.png`` (two layer x step heatmaps) into the run
folder and logs them as artifacts.

It plugs into the training loop's extension point (:func:`raycpt.train.loop.register_step_callback`);
the factory runs on the driver (it tokenises the probe batch there), the callback on every worker,
and only rank 0 computes and logs (a forward of the unwrapped model outside DDP: no collective op).
With FSDP the unwrapped model holds only shards, so drift is skipped with a note.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from raycpt.diagnostics.prompts import gloss_texts
from raycpt.diagnostics.similarity import layer_l2_change, linear_cka, massive_rows
from raycpt.train.loop import LoopState, StepCallback, register_step_callback

PROBE_PROMPTS = 8
PROBE_TOKENS = 32


def probe_ids(tokenizer, texts: list[str], max_len: int = PROBE_TOKENS) -> list[list[int]]:
    """Token ids of the probe texts, cut to ``max_len`` and then to a common length (no padding needed)."""
    seqs = [tokenizer(t, add_special_tokens=True)["input_ids"][:max_len] for t in texts]
    seqs = [s for s in seqs if len(s) >= 4]
    if not seqs:
        return []
    width = min(len(s) for s in seqs)
    return [list(s[:width]) for s in seqs]


@torch.no_grad()
def layer_states(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Residual stream after every decoder block, as ``(tokens, d)`` float32 CPU matrices (BOS dropped)."""
    from raycpt.models.stack import LayerStack

    stack = LayerStack(model)
    was_training = model.training
    model.eval()
    try:
        tr = stack.trace(ids.to(next(model.parameters()).device))
    finally:
        model.train(was_training)
    return [h[:, 1:].reshape(-1, h.shape[-1]).float().cpu() for h in tr.hidden[1:]]


def layer_params(model) -> list[dict[str, torch.Tensor]]:
    """A float32 CPU copy of every decoder layer's parameters (name -> tensor)."""
    from raycpt.models.stack import LayerStack

    return [{n: p.detach().float().cpu().clone() for n, p in layer.named_parameters()}
            for layer in LayerStack(model).layers]


def drift_metrics(start_params, start_states, model, ids: torch.Tensor) -> dict[str, float]:
    """The drift metrics of ``model`` against the saved start (see the module docstring)."""
    from raycpt.models.stack import LayerStack

    stack = LayerStack(model)
    out: dict[str, float] = {}
    dws, ckas = [], []
    now = layer_states(model, ids) if start_states else []
    for i, layer in enumerate(stack.layers):
        dw = layer_l2_change(start_params[i], layer)
        ref = math.sqrt(sum(float((t.double() ** 2).sum()) for t in start_params[i].values()))
        out[f"drift.dW.L{i:02d}"] = dw
        out[f"drift.rel_dW.L{i:02d}"] = dw / ref if ref > 0 else float("nan")
        dws.append(dw)
        if start_states:
            keep = ~(massive_rows(start_states[i].numpy()) | massive_rows(now[i].numpy()))
            c = linear_cka(start_states[i][keep], now[i][keep])
            out[f"drift.cka.L{i:02d}"] = c
            ckas.append(c)
    out["drift.dW.mean"] = float(np.mean(dws)) if dws else float("nan")
    if ckas:
        out["drift.cka.min"] = float(np.nanmin(ckas))
    return out


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
        if state.cfg.train.distributed == "fsdp" and state.world_size > 1:
            self._skip = "drift skipped: with FSDP the unwrapped model holds only parameter shards"
            state.log({"drift.skipped": 1.0})
            return
        from raycpt.models.sources import load_model

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
        from raycpt.runs import atomic_write_json

        path = atomic_write_json(Path(state.run_dir) / "drift.json", self._history)
        png = plot_drift(self._history, Path(state.run_dir) / "drift.png")
        lg = state.logger
        if lg is not None and lg.client is not None:
            for p in (path, png):
                if p is not None:
                    try:
                        lg.client.log_artifact(lg.run_id, str(p))
                    except Exception:  # noqa: BLE001 - an artifact store hiccup must not fail the training run
                        pass


def plot_drift(history: list[dict], out: Path) -> Optional[Path]:
    """Heatmaps (layer x step) of the weight change and of 1 - CKA."""
    import re

    from raycpt.report.compare import _plt, save_figure

    keys = sorted({k for h in history for k in h if re.fullmatch(r"drift\.dW\.L\d+", k)})
    if not keys:
        return None
    steps = [h["step"] for h in history]
    dw = np.array([[h.get(k, np.nan) for h in history] for k in keys])
    ck = np.array([[h.get(k.replace(".dW.", ".cka."), np.nan) for h in history] for k in keys])
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mat, title in ((axes[0], dw, "||W - W_start||_F per layer"),
                           (axes[1], 1 - ck, "1 - CKA(start, now) on the probe batch")):
        im = ax.imshow(mat, aspect="auto", origin="lower", cmap="viridis",
                       extent=(min(steps) - 0.5, max(steps) + 0.5, -0.5, len(keys) - 0.5))
        ax.set_xlabel("training step")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax)
    return save_figure(fig, out)


def _probe_texts(n: int) -> list[str]:
    return gloss_texts(n)  # the shipped asset: the same texts on every machine


@register_step_callback
def drift_factory(cfg) -> Optional[DriftCallback]:
    """``train.drift_every > 0`` -> a :class:`DriftCallback` (runs on the driver: tokenises the probe)."""
    if not cfg.train.drift_every:
        return None
    from transformers import AutoTokenizer

    from raycpt.train.launch import resolve_model_path

    path = resolve_model_path(cfg)
    tok = AutoTokenizer.from_pretrained(path)
    return DriftCallback(cfg.train.drift_every, path, probe_ids(tok, _probe_texts(PROBE_PROMPTS)))
