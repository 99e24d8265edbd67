"""Plots and tables of ``raycpt compare`` and ``raycpt contribution`` (matplotlib Agg, PNG, atomic writes).

Inputs are plain lists of per-layer dicts (the job's table rows), so these functions are testable
without any model or Ray.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.report.figures import save_figure

# (key in the table, title, y label, per-model?) - per-model metrics have ``<key>_base`` / ``<key>_tuned``
COMPARE_PANELS = [
    ("cka", "Linear CKA of base and tuned hidden states", "linear CKA (0-1, 1 = same)", False),
    ("cosine", "Mean cosine similarity of base and tuned hidden states", "cosine similarity (-1 to 1)", False),
    ("mean_shift", "Mean shift ||mu_base - mu_tuned||", "L2 distance (hidden-state units)", False),
    ("wc_attn", "Weight change, attention Q/K/V/O", "Frobenius norm of W_tuned - W_base (weight units)", False),
    ("wc_mlp", "Weight change, MLP", "Frobenius norm of W_tuned - W_base (weight units)", False),
    ("prompt_entropy", "Prompt entropy (alpha-Renyi, / log T)", "entropy / log T (0-1)", True),
    ("dataset_entropy", "Dataset entropy (mean-pooled, / log n)", "entropy / log n (0-1)", True),
    ("effective_rank", "Effective rank (Roy & Vetterli)", "effective rank (dimensions)", True),
    ("probe_accuracy", "Layer-wise probe: logit-lens next-token accuracy", "accuracy (fraction of tokens)", True),
]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FIGURE = {"dpi": 110, "bbox_inches": "tight"}  # how these figures are saved (report.figures.save_figure)
DEPTH = "relative depth (layer index + 0.5) / N, layer index 0-based"


def _depth(rows: Sequence[dict]) -> list[float]:
    n = len(rows)
    return [(r["layer"] + 0.5) / n for r in rows]


def plot_compare(rows: Sequence[dict], out_dir: Path, base_label: str = "base", tuned_label: str = "tuned",
                 title: str = "") -> list[Path]:
    """One PNG per metric against relative depth (both models where the metric is per model), plus a grid."""
    plt = _plt()
    out_dir = Path(out_dir)
    x = _depth(rows)
    paths = []
    avail = [p for p in COMPARE_PANELS if (f"{p[0]}_base" in rows[0] if p[3] else p[0] in rows[0])]
    cols = 3
    grid_rows = math.ceil(len(avail) / cols)
    gfig, gaxes = plt.subplots(grid_rows, cols, figsize=(5 * cols, 3.4 * grid_rows), squeeze=False)
    for i, (key, ttl, ylab, per_model) in enumerate(avail):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for a in (ax, gaxes[i // cols][i % cols]):
            if per_model:
                a.plot(x, [r[f"{key}_base"] for r in rows], "o-", ms=3, label=base_label)
                a.plot(x, [r[f"{key}_tuned"] for r in rows], "s-", ms=3, label=tuned_label)
                a.legend(fontsize=7)
            else:
                a.plot(x, [r[key] for r in rows], "o-", ms=3, color="C2", label=f"{base_label} vs {tuned_label}")
                a.legend(fontsize=7)
            a.set_title(ttl, fontsize=9)
            a.set_xlabel(DEPTH, fontsize=8)
            a.set_ylabel(ylab, fontsize=8)
            a.set_xlim(0, 1)
            a.grid(alpha=0.3)
        paths.append(save_figure(fig, out_dir / f"{key}.png", **FIGURE))
    for j in range(len(avail), grid_rows * cols):
        gaxes[j // cols][j % cols].axis("off")
    if title:
        gfig.suptitle(title, fontsize=10)
    gfig.tight_layout()
    paths.append(save_figure(gfig, out_dir / "compare_grid.png", **FIGURE))
    return paths


def plot_swaps(swaps: Sequence[dict], base_score: float, tuned_score: float, out_path: Path,
               metric: str = "score") -> Path:
    """Layer swap: score of base with block j from tuned, and of tuned with block j from base (scores in percent;
    the y label names the score: the swaps' ``score_key``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    blocks = sorted({s["block"] for s in swaps})
    labels = []
    for b in blocks:
        lay = next(s["layers"] for s in swaps if s["block"] == b)
        labels.append(f"{lay[0]}-{lay[-1]}")
    for direction, style in (("base<-tuned", "o-"), ("tuned<-base", "s--")):
        ys = [next((s[metric] for s in swaps if s["block"] == b and s["direction"] == direction), float("nan"))
              for b in blocks]
        ax.plot(blocks, ys, style, label=direction.replace("<-", " with block from "))
    ax.axhline(base_score, color="grey", ls=":", label=f"base, no swap ({base_score:.3f})")
    ax.axhline(tuned_score, color="black", ls="-.", label=f"tuned, no swap ({tuned_score:.3f})")
    ax.set_xticks(blocks)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlabel("swapped block (layer indices, 0-based)")
    ax.set_ylabel(f"{swaps[0].get('score_key', metric) if swaps else metric} (%)")
    ax.set_title("Layer swap: each model's score with one block from the other\n"
                 "(the inverted U: middle blocks carry the gain)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_figure(fig, out_path, **FIGURE)


def plot_contribution(contrib: dict[int, float], num_layers: int, out_path: Path,
                      band: tuple[float, float] = (0.4, 0.6), title: str = "") -> Path:
    """Contribution of each single-layer-trained model against relative depth, 40-60% band shaded."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    layers = sorted(contrib)
    x = [(l + 0.5) / num_layers for l in layers]
    y = [contrib[l] for l in layers]
    ax.axvspan(band[0], band[1], color="C1", alpha=0.15, label=f"{int(band[0] * 100)}-{int(band[1] * 100)}% depth")
    ax.axhline(1.0, color="black", ls="--", lw=1, label="= full training")
    ax.axhline(0.0, color="grey", ls=":", lw=1)
    colors = ["C3" if v > 1.0 else "C0" for v in y]
    ax.bar(x, y, width=0.8 / num_layers, color=colors)
    for l, xi, yi in zip(layers, x, y):
        ax.annotate(str(l), (xi, yi), ha="center", va="bottom" if yi >= 0 else "top", fontsize=6)
    ax.set_xlim(0, 1)
    ax.set_xlabel(DEPTH)
    ax.set_ylabel("(score_l - base) / (full - base)\n(1 = full training)")
    ax.set_title(title or "Layer contribution from single-layer training", fontsize=9)
    from matplotlib.patches import Patch

    handles = ax.get_legend_handles_labels()[0] + [Patch(color="C0", label="one layer trained alone (index above)")]
    handles += [Patch(color="C3", label="beyond full training (> 1)")] if any(v > 1.0 for v in y) else []
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out_path, **FIGURE)


def plot_l2_change(single: dict[int, float], full: dict[int, float], num_layers: int, out_path: Path) -> Path:
    """L2 change of each layer when trained alone vs the same layer under full training."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    layers = sorted(set(single) | set(full))
    x = [(l + 0.5) / num_layers for l in layers]
    ax.plot(x, [single.get(l, float("nan")) for l in layers], "o-", ms=3, label="trained alone (single)")
    ax.plot(x, [full.get(l, float("nan")) for l in layers], "s-", ms=3, label="under full training")
    ax.set_xlim(0, 1)
    ax.set_xlabel(DEPTH)
    ax.set_ylabel("||W_trained - W_base||_F\n(Frobenius norm, weight units)")
    ax.set_title("Parameter change per layer: trained alone against under full training", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return save_figure(fig, out_path, **FIGURE)


def fmt(v, digits: int = 4) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return "-".join(str(x) for x in v) if v else ""
    return str(v)


def markdown_table(rows: Sequence[dict], columns: Optional[Iterable[str]] = None, digits: int = 4) -> str:
    """A GitHub-markdown table of ``rows`` (all keys of the first row unless ``columns``)."""
    if not rows:
        return ""
    cols = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, ""), digits) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict], path: Path) -> Path:
    """CSV of ``rows`` (union of keys, in first-seen order), written atomically."""
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in rows:
        w.writerow({k: fmt(v, 8) if isinstance(v, (list, tuple)) else v for k, v in r.items()})
    return atomic_write_text(Path(path), buf.getvalue())


def build_rows(pair: list[dict], base_m: list[dict], tuned_m: list[dict], wc: list[dict]) -> list[dict]:
    """One table row per layer from the pieces the tasks returned."""
    n = len(pair)
    rows = []
    for l in range(n):
        r: dict[str, Any] = {"layer": l, "depth": round((l + 0.5) / n, 4)}
        r.update(pair[l])
        for k in ("prompt_entropy", "dataset_entropy", "effective_rank", "probe_accuracy", "massive_tokens"):
            r[f"{k}_base"] = base_m[l][k]
            r[f"{k}_tuned"] = tuned_m[l][k]
        for k in ("q", "k", "v", "o", "attn", "mlp", "ssm", "total", "rel_attn", "rel_mlp", "rel_total"):
            if k in wc[l]:
                r[f"wc_{k}"] = wc[l][k]
        rows.append(r)
    return rows


def write_outputs(out_dir: Path, res: dict, base_label: str, tuned_label: str, meta: dict) -> list[Path]:
    """Tables, plots and summary of one pair into ``out_dir``; returns the written files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [write_csv(res["rows"], out_dir / "layers.csv")]
    cols = ["layer", "depth", "cka", "cosine", "mean_shift", "wc_attn", "wc_mlp", "prompt_entropy_base",
            "prompt_entropy_tuned", "dataset_entropy_base", "dataset_entropy_tuned", "effective_rank_base",
            "effective_rank_tuned", "probe_accuracy_base", "probe_accuracy_tuned"]
    cols = [c for c in cols if c in res["rows"][0]]
    md = f"# compare\n\nbase: `{base_label}`  \ntuned: `{tuned_label}`\n\n" + markdown_table(res["rows"], cols)
    if res["swaps"]:
        files.append(write_csv(res["swaps"], out_dir / "swaps.csv"))
        md += (f"\n## Layer swap ({res['swaps'][0]['score_key']})\n\nbase {res['base_score']:.4f}, "
               f"tuned {res['tuned_score']:.4f}\n\n" + markdown_table(res["swaps"],
                                                                       ["block", "layers", "direction", "score"]))
    files.append(atomic_write_text(out_dir / "layers.md", md))
    plots = plot_compare(res["rows"], out_dir / "plots", "base", "tuned",
                         title=f"{Path(base_label).name} vs {Path(tuned_label).name}")
    if res["swaps"]:
        plots.append(plot_swaps(res["swaps"], res["base_score"], res["tuned_score"], out_dir / "plots" / "swap.png"))
    files += plots
    summary = dict(meta, base_score=res["base_score"], tuned_score=res["tuned_score"], swaps=res["swaps"],
                   layers=res["rows"])
    files.append(atomic_write_json(out_dir / "summary.json", summary))
    return files
