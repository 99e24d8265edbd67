"""Training report: per-step records from ``train_metrics.jsonl`` and the loss-curve plot."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

from raycpt.report.figures import save_figure


def read_step_records(path: Path) -> list[dict]:
    """Per-step records, one per step in step order; a step recorded twice (repeated after a restart
    from an older checkpoint) keeps its last record."""
    p = Path(path)
    if not p.is_file():
        return []
    by_step: dict[int, dict] = {}
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: ignore it
                continue
            if "event" in rec or "timing" in rec or "step" not in rec:
                continue
            by_step[int(rec["step"])] = rec
    return [by_step[s] for s in sorted(by_step)]


def read_events(path: Path) -> list[dict]:
    """Lifecycle records (start, resume, finished, nonfinite) in file order."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "event" in rec:
            out.append(rec)
    return out


def plot_loss_curve(steps: list[int], losses: list[float], out: Path, title: Optional[str] = None,
                    curves: Optional[dict[str, tuple[list[int], list[float]]]] = None) -> Path:
    """Loss against step as PNG (written aside, then renamed). ``curves`` overlays more named runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    series = dict(curves or {})
    if steps:
        series = {title or "loss": (steps, losses), **series}
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, label=label, linewidth=1.4, marker="." if len(xs) <= 60 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (cross-entropy, nats per token)")
    if title:
        ax.set_title(f"Training loss per optimizer step: {title}", fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out, format="png")  # the figure's own dpi (110), no tight box


def plot_drift(history: list[dict], out: Path) -> Optional[Path]:
    """Heatmaps (layer x step) of the weight change and of 1 - CKA (``DriftCallback``'s history);
    None when the history holds no per-layer weight change."""
    import numpy as np

    keys = sorted({k for h in history for k in h if re.fullmatch(r"drift\.dW\.L\d+", k)},
                  key=lambda k: int(k.rsplit("L", 1)[1]))  # by layer index, however the names are padded
    if not keys:
        return None
    steps = [h["step"] for h in history]
    dw = np.array([[h.get(k, np.nan) for h in history] for k in keys])
    ck = np.array([[h.get(k.replace(".dW.", ".cka."), np.nan) for h in history] for k in keys])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, mat, title, unit in ((axes[0], dw, "||W - W_start||_F per layer", "Frobenius norm (weight units)"),
                                 (axes[1], 1 - ck, "1 - CKA(start, now) on the probe batch",
                                  "1 - linear CKA (0 = unchanged)")):
        im = ax.imshow(mat, aspect="auto", origin="lower", cmap="viridis",
                       extent=(min(steps) - 0.5, max(steps) + 0.5, -0.5, len(keys) - 0.5))
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("decoder layer index (0-based)")
        ax.set_yticks(range(len(keys)), [str(int(k.rsplit("L", 1)[1])) for k in keys],
                      fontsize=7 if len(keys) <= 32 else 5)
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, label=unit)
    return save_figure(fig, out, dpi=110, bbox_inches="tight")  # as compare's figures
