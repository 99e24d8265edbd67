"""Trace artifacts: heatmaps (groups x layers, the paper's Fig. 4), the normalised TP / LS profile
with the splits marked (Fig. 10), the S(b) table (Table 9), the per-prompt Parquet table.

Every file is written aside and renamed into place. Plots use matplotlib's Agg backend.
"""

from __future__ import annotations

import csv
import io
import json
import os
import uuid
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from raycpt.diagnostics.scores import (boundary_score, boundary_score_interval, profiles, recommend_split, split_table,
                                       splits_like_best, tp_interval)
from raycpt.report.figures import save_figure
from raycpt.splits import split_index


def _aside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")


def write_text(path: Path, text: str) -> Path:
    tmp = _aside(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FIGURE = {"format": "png", "dpi": 120, "bbox_inches": "tight"}  # how these figures are saved (report.figures)
RATIO_LABEL = "mean Ratio (relative change of P_t, unitless)"  # the heatmaps' colour bars
DJS_LABEL = "mean dJS (relative change of JS, unitless)"


# ------------------------------------------------------------------------------------------ tables
SHORT_COLUMNS = [("ratio", "shallow ratio r"), ("split_layer", "b"), ("shallow_layers", "train (shallow)"),
                 ("deep_layers", "freeze (deep)"), ("S", "S(b)"), ("S_ci", "95% interval"),
                 ("S_mean", "S(b) paper mean")]
TABLE_COLUMNS = [("ratio", "Trainable shallow ratio"), ("split_layer", "Split layer b"),
                 ("shallow_layers", "Shallow (train)"), ("deep_layers", "Deep (freeze)"), ("S", "S(b)"),
                 ("S_lo", "S(b) 2.5%"), ("S_hi", "S(b) 97.5%"),
                 ("ls_shallow", "LS^ shallow"), ("tp_deep", "TP^ deep"), ("tp_shallow", "TP^ shallow"),
                 ("ls_deep", "LS^ deep"), ("S_mean", "S(b) paper mean"), ("S_median", "S(b) on medians"),
                 ("like_best", "≈ best")]
S_INTERVAL_NOTE = ("S(b), its 95% interval and the recommended split use scaled profiles by default (trace.sb_aggregate): "
                   "each prompt's Ratio and dJS divided by their own mean over layers before averaging, so every prompt "
                   "weighs the same (004 averages raw values, and a few prompts whose Ratio explodes, P_t near 0, up to "
                   "1e5 on Gemma 3, then decide the mean; the table shows that paper-mean S(b) beside it). The interval "
                   "is S(b) -+ t(n-1) times its jackknife standard error over prompts (the point always inside); its "
                   "coverage on heavy-tailed prompts is measured by benchmarks/bench_calibration.py (sb_ci_coverage). "
                   "An interval containing 0 says the sign of S(b) means nothing. '≈ best' marks the splits whose S(b) "
                   "is not distinguishable from the largest (one-sided 95% jackknife-t bound of the difference reaches "
                   "0): the recommended split is one of them, not a finding on its own when there are several.")
S_RESAMPLES = 2000


def add_s_intervals(table: Sequence[dict], ratio_rows: np.ndarray, djs_rows: np.ndarray,
                    resamples: int = S_RESAMPLES, seed: int = 0, aggregate: str = "scaled") -> None:
    """Set ``S_lo`` / ``S_hi`` and ``like_best`` (over prompts, :func:`raycpt.diagnostics.scores.boundary_score_interval`
    and :func:`~raycpt.diagnostics.scores.splits_like_best`) on every S(b)-table row, in place: a jackknife-t
    interval for ``aggregate="scaled"`` (the one whose coverage is checked), BCa bootstrap otherwise."""
    bs = [row["split_layer"] for row in table]
    method = "jackknife_t" if aggregate == "scaled" else "bca"
    ivs = boundary_score_interval(ratio_rows, djs_rows, bs, resamples, seed, aggregate=aggregate, method=method)
    like = (splits_like_best(ratio_rows, djs_rows, bs, resamples, seed, aggregate=aggregate,
                             method="jackknife_t" if aggregate == "scaled" else "bootstrap")
            if len(bs) > 1 else [True] * len(bs))
    for row, iv, lk in zip(table, ivs, like):
        row["S_lo"], row["S_hi"], row["like_best"] = iv.lo, iv.hi, lk


def fmt_cell(key: str, v) -> str:
    """One S(b)-table cell as text (ratios as percentages, floats to 3 decimals)."""
    if key == "S_ci":  # the row's interval, passed as (lo, hi)
        return "-" if v is None or v[0] is None else f"[{v[0]:.3f}, {v[1]:.3f}]"
    if key == "like_best":
        return "-" if v in (None, "-") else ("yes" if v else "no")
    if key == "ratio":
        return f"{v:.0%}" if abs(v * 100 - round(v * 100)) < 1e-9 else f"{v:.1%}"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def table_markdown(table: Sequence[dict], recommended: Optional[dict] = None) -> str:
    """Table 9 as Markdown (plus a line for the recommended split)."""
    lines = ["| " + " | ".join(h for _, h in TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for row in table:
        lines.append("| " + " | ".join(fmt_cell(k, row.get(k, "-")) for k, _ in TABLE_COLUMNS) + " |")
    if recommended:
        lines.append("")
        lines.append(f"Recommended split (max S(b) over the grid): r = {recommended['ratio']:g}, "
                     f"b = {recommended['split_layer']}, S(b) = {recommended['S']:.3f}")
    lines.append("")
    lines.append("S(b) uses the paper's per-layer means of Ratio (TP) and dJS (LS), min-max normalised; "
                 "'S(b) on medians' is the same score on per-layer medians (a robustness check).")
    lines.append("")
    lines.append(S_INTERVAL_NOTE)
    return "\n".join(lines) + "\n"


def table_csv(table: Sequence[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([k for k, _ in TABLE_COLUMNS])
    for row in table:
        w.writerow([row.get(k, "") for k, _ in TABLE_COLUMNS])
    return buf.getvalue()


def profiles_csv(profiles: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    groups = list(profiles.get("groups", {}))
    med = profiles.get("median")
    out_k = profiles.get("mass_outside")  # [embedding, block 0..N-1]: block i is column i + 1
    w.writerow(["layer", "tp", "ls", "tp_norm", "ls_norm"] + (["tp_median", "ls_median"] if med else [])
               + (["q_mass_outside_topk"] if out_k is not None else [])
               + [f"tp/{g}" for g in groups] + [f"ls/{g}" for g in groups])
    for i in range(len(profiles["tp"])):
        w.writerow([i, repr(float(profiles["tp"][i])), repr(float(profiles["ls"][i])),
                    repr(float(profiles["tp_norm"][i])), repr(float(profiles["ls_norm"][i]))]
                   + ([repr(float(med["tp"][i])), repr(float(med["ls"][i]))] if med else [])
                   + ([repr(float(out_k[i + 1]))] if out_k is not None else [])
                   + [repr(float(profiles["groups"][g]["tp"][i])) for g in groups]
                   + [repr(float(profiles["groups"][g]["ls"][i])) for g in groups])
    return buf.getvalue()


# ------------------------------------------------------------------------------------------ plots
def heatmap(matrix: np.ndarray, groups: Sequence[str], title: str, cmap: str, path: Path, label: str) -> Path:
    """Groups x layers heatmap of a per-layer mean (the paper's Fig. 4 rows are task groups)."""
    plt = pyplot()
    m = np.asarray(matrix, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * m.shape[1] + 3), 0.42 * m.shape[0] + 1.6))
    im = ax.imshow(m, aspect="auto", cmap=cmap, interpolation="nearest")
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels([f"{i + 1}: {g}" for i, g in enumerate(groups)], fontsize=8)
    step = 1 if m.shape[1] <= 32 else 2
    ax.set_xticks(range(0, m.shape[1], step))
    ax.set_xticklabels([str(i) for i in range(0, m.shape[1], step)], fontsize=7)
    ax.set_xlabel("decoder layer index i (0-based; output of block i)")
    ax.set_ylabel("prompt group")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label=label, fraction=0.03, pad=0.02)
    return save_figure(fig, path, **FIGURE)


def profile_plot(profiles: dict, recommended: dict, requested: Sequence[float], path: Path, title: str = "") -> Path:
    """Normalised TP and LS against layer; the recommended split solid, the requested splits dashed
    (Fig. 10: shallow side shaded green, deep side red, for the recommended split)."""
    plt = pyplot()
    tp, ls = np.asarray(profiles["tp_norm"]), np.asarray(profiles["ls_norm"])
    n = len(tp)
    x = np.arange(n)
    fig, ax = plt.subplots(figsize=(8, 4))
    b = recommended["split_layer"]
    ax.axvspan(-0.5, b - 0.5, color="tab:green", alpha=0.08, label=f"shallow [0, {b}) train")
    ax.axvspan(b - 0.5, n - 0.5, color="tab:red", alpha=0.06, label=f"deep [{b}, {n}) freeze")
    ax.plot(x, tp, "-o", color="tab:green", ms=3, label="TP^ (mean Ratio, normalised)")
    ax.plot(x, ls, "-s", color="tab:red", ms=3, label="LS^ (mean dJS, normalised)")
    ax.axvline(b - 0.5, color="black", lw=1.5, label=f"recommended r={recommended['ratio']:g} (b={b})")
    for r in requested:
        rb = split_index(r, n)
        ax.axvline(rb - 0.5, color="gray", lw=1, ls="--",
                   label=None if r != requested[0] else "requested split ratios r (dashed, r above)")
        ax.text(rb - 0.5, 1.04, f"{r:g}", ha="center", va="bottom", fontsize=7, color="gray")
    step = 1 if n <= 32 else 2
    ax.set_xticks(range(0, n, step))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(-0.05, 1.12)
    ax.set_xlabel("decoder layer index i (0-based)")
    ax.set_ylabel("min-max normalised over layers\n(0 = lowest layer, 1 = highest)")
    ax.set_title(title or "LayerTracer profiles", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(fig, path, **FIGURE)


# ------------------------------------------------------------------------------------------ all
def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return _jsonable(o.tolist())
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    return o


def write_artifacts(run_dir: Path, df, profiles: dict, table: Sequence[dict], recommended: dict, summary: dict,
                    requested: Sequence[float], title: str = "") -> dict[str, Path]:
    """Write every trace artifact into ``run_dir``; return ``{name: path}``."""
    run_dir = Path(run_dir)
    paths: dict[str, Path] = {}
    tmp = _aside(run_dir / "per_prompt.parquet")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, run_dir / "per_prompt.parquet")
    paths["per_prompt"] = run_dir / "per_prompt.parquet"
    groups = list(profiles["groups"])
    if groups:
        ratio_m = np.stack([profiles["groups"][g]["tp"] for g in groups])
        djs_m = np.stack([profiles["groups"][g]["ls"] for g in groups])
        paths["heatmap_ratio"] = heatmap(ratio_m, groups, f"{title}: mean Ratio per group and layer (Task Particle)",
                                         "Greens", run_dir / "heatmap_ratio.png", RATIO_LABEL)
        paths["heatmap_djs"] = heatmap(djs_m, groups, f"{title}: mean dJS per group and layer (Layer-wise Sensitivity)",
                                       "Reds", run_dir / "heatmap_djs.png", DJS_LABEL)
    paths["profile"] = profile_plot(profiles, recommended, requested, run_dir / "profile.png",
                                    f"{title}: normalised TP and LS")
    paths["split_table_csv"] = write_text(run_dir / "split_table.csv", table_csv(table))
    paths["split_table_md"] = write_text(run_dir / "split_table.md", table_markdown(table, recommended))
    paths["profiles_csv"] = write_text(run_dir / "profiles.csv", profiles_csv(profiles))
    paths["summary"] = write_text(run_dir / "summary.json", json.dumps(_jsonable(summary), indent=2))
    return paths


def aggregate(prep, rows: dict[str, np.ndarray]) -> dict:
    """A trace's per-prompt rows -> per-prompt table (pandas), TP/LS profiles, S(b) table, recommendation.

    ``prep``: the trace's checked inputs (``cfg.trace``, ``records``, ``encoded``, ``splits``, ``tokenizer``)."""
    import pandas as pd

    t = prep.cfg.trace
    groups = [r.group for r in prep.records]
    prof = profiles(rows["ratio"], rows["djs"], groups)  # the paper's raw means: plots, CSV, Task-Particle layers
    sb = prof if t.sb_aggregate == "mean" else profiles(rows["ratio"], rows["djs"], aggregate=t.sb_aggregate)
    med = profiles(rows["ratio"], rows["djs"], aggregate="median")
    table = split_table(sb["tp_norm"], sb["ls_norm"], prep.splits)
    for row in table:  # the paper's mean-based S(b) and the median one beside the reported estimator
        row["S_mean"] = boundary_score(prof["tp_norm"], prof["ls_norm"], row["split_layer"])
        row["S_median"] = boundary_score(med["tp_norm"], med["ls_norm"], row["split_layer"])
    add_s_intervals(table, rows["ratio"], rows["djs"], aggregate=t.sb_aggregate)
    rec = recommend_split(sb["tp_norm"], sb["ls_norm"], t.grid)
    rec["aggregate"] = t.sb_aggregate
    rec_med = recommend_split(med["tp_norm"], med["ls_norm"], t.grid)
    prof["median"] = dict((k, med[k]) for k in ("tp", "ls", "tp_norm", "ls_norm"))
    prof["median"]["recommended"] = dict((k, rec_med[k]) for k in ("ratio", "split_layer", "S"))
    tok = prep.tokenizer
    answer_ids = np.array([e.answer_id for e in prep.encoded])
    has_answer = answer_ids >= 0
    hit = (rows["t_star"] == answer_ids) & has_answer
    # the Task-Particle interval under 004 §4.1's per-layer top-k reading (over the full softmax P_t is
    # never 0, so Ratio > 0 everywhere and the interval would be every layer); full-softmax rows as fallback
    intervals = [tp_interval(r, t.tau) for r in rows.get("ratio_topk", rows["ratio"])]
    df = pd.DataFrame({
        "index": np.arange(len(groups)),
        "line": [r.line for r in prep.records],
        "group": groups,
        "s1": [r.s1 for r in prep.records],
        "s2": [r.s2 for r in prep.records],
        "answer": [r.answer for r in prep.records],
        "num_tokens": [len(e.input_ids) for e in prep.encoded],
        "num_context": [len(e.context) for e in prep.encoded],
        "t_star": rows["t_star"],
        "top1": [tok.decode([int(i)]) for i in rows["t_star"]],
        "answer_hit": np.where(has_answer, hit, None),
        "p_final": rows["p_final"],
        "tp_first": [a for a, _, _ in intervals],
        "tp_last": [b for _, b, _ in intervals],
        "tp_count": [c for _, _, c in intervals],
        "p_t": list(rows["p_t"]),
        "js": list(rows["js"]),
        "ratio": list(rows["ratio"]),
        "djs": list(rows["djs"]),
        **({"q_mass_outside": list(rows["q_mass_outside"])} if "q_mass_outside" in rows else {}),
    })
    tp_layers = [int(i) for i in np.flatnonzero(prof["tp"] > t.tau)]
    hit_rate = float(hit[has_answer].mean()) if has_answer.any() else None
    if "q_mass_outside" in rows:  # per layer: mean share of Q outside P's top-k, beside JS@k
        prof["mass_outside"] = np.asarray(rows["q_mass_outside"], dtype=np.float64).mean(axis=0)
    return dict(df=df, profiles=prof, table=table, recommended=rec, tp_layers=tp_layers, hit_rate=hit_rate)
