"""Fabricated inputs for every figure raycpt writes, one drawing function per figure family (``ALL``): each writes
its PNGs into a folder and returns their paths. tests/unit/test_figures.py reads the figures back; running
``ALL`` by hand renders the same PNGs to look at."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from raycpt.report.sweep.outcomes import question_outcomes

CATS = ["STEM", "Social Science", "Humanities", "Other"]
KEYS = ["stem", "social_science", "humanities", "other"]
Q = 40
SWEEP_ROWS = ("base", "full", "train_shallow-r0.5", "train_deep-r0.5")  # the sweep's rows (groups), in order
SEEDS = (0, 1)
TRAINABLE = {"full": 120e6, "train_shallow-r0.5": 55e6, "train_deep-r0.5": 55e6}
# per row: domain probability shift (points), held-out loss shift, general loss shift (nats per token)
SHIFT = {"base": (0, 0, 0), "full": (6, -0.3, 0.05), "train_shallow-r0.5": (2, -0.12, 0.0),
         "train_deep-r0.5": (3, -0.18, 0.02)}


def _trial(name: str, strategy: str, seed: int, probs, blocks, general, split=None, group=None) -> dict:
    """One run: per-question cloze records (gold probability and correct flag), held-out and general block losses."""
    qs = [{"id": f"q{i}", "category": CATS[i % 4], "question": "?", "gold": "A",
           "cloze": {"prediction": "A", "correct": p > 50, "prob": float(p)}} for i, p in enumerate(probs)]
    per = {c: float(np.mean([p for i, p in enumerate(probs) if i % 4 == k])) for k, c in enumerate(KEYS)}
    scores = {f"wn/{c}/cloze.prob": v for c, v in per.items()}
    scores["wn/average/cloze.prob"] = float(np.mean(list(per.values())))
    acc = {c: 100.0 * np.mean([p > 50 for i, p in enumerate(probs) if i % 4 == k]) for k, c in enumerate(KEYS)}
    scores.update({f"wn/{c}/cloze": v for c, v in acc.items()})
    scores["wn/average/cloze"] = float(np.mean(list(acc.values())))
    return {"name": name, "group": group or name, "strategy": strategy, "split": split, "b": None, "seed": seed,
            "scores": scores, "outcomes": question_outcomes({"wn": qs}),
            "heldout_blocks": list(blocks), "heldout_weights": [63] * len(blocks),
            "heldout_loss": float(np.mean(blocks)),
            "general_blocks": list(general), "general_weights": [63] * len(general),
            "general_loss": float(np.mean(general))}


def sweep_trials() -> list[dict]:
    """base (one run) and three trained rows at two seeds each, with loss curves and trainable counts."""
    rng = np.random.default_rng(0)
    base_p = 30 + 20 * rng.random(Q)
    base_h, base_g = 3.8 + 0.2 * rng.standard_normal(30), 3.0 + 0.2 * rng.standard_normal(25)
    out = [_trial("base", "base", 0, base_p, base_h, base_g)]
    for row in SWEEP_ROWS[1:]:
        dp, dh, dg = SHIFT[row]
        strategy, split = (row, None) if row == "full" else (row.split("-r")[0], float(row.split("-r")[1]))
        for sd in SEEDS:
            t = _trial(f"{row}-s{sd}", strategy, sd, base_p + dp + 2 * rng.standard_normal(Q),
                       base_h + dh + 0.02 * rng.standard_normal(30), base_g + dg + 0.01 * rng.standard_normal(25),
                       split=split, group=row)
            t["losses"] = list(4.0 + dh - 0.5 * np.log1p(np.arange(20)) + 0.05 * rng.standard_normal(20))
            t["trainable_params"] = int(TRAINABLE[row])
            out.append(t)
    return out


def draw_sweep(out: Path) -> list[Path]:
    from raycpt.report.sweep.summary import write_summary

    s = write_summary(out / "sweep", sweep_trials(), None, num_layers=30, domain=["wn"], general=[],
                      report={"primary": "heldout_loss"})
    return [Path(f) for f in s["files"] if f.endswith(".png")]


ARMS = [f"arm{i}" for i in range(5)]
DECIDE_SEEDS = (0, 1, 2)


def decide_outcome():
    """decision_outcome on simulated runs: each arm searched at 1/3, 1, 3 (1 best), its pick at three seeds; the long
    horizon keeps the short order but for the last two arms."""
    from raycpt.config import load_config
    from raycpt.decide import rate_rows
    from raycpt.report.decide import decision_outcome

    rng = np.random.default_rng(1)
    short = {a: 4.0 + 0.1 * i for i, a in enumerate(ARMS)}
    long = {a: 3.5 + 0.1 * i for i, a in enumerate(ARMS)}
    long["arm3"], long["arm4"] = long["arm4"], long["arm3"]
    cfg = load_config(None, [f"decide.seeds={list(DECIDE_SEEDS)}"])
    results, rows = {}, {}
    for h, means in ((1.0, short), (8.0, long)):
        for a, mu in means.items():
            draws = rng.normal(mu, 0.03, len(DECIDE_SEEDS))
            for m in (1 / 3, 1.0, 3.0):
                for sd in (DECIDE_SEEDS if m == 1.0 else (0,)):
                    x = float(draws[sd]) + (0.0 if m == 1.0 else 0.5)
                    results[f"{a}-h{h:g}-{m:.3g}-s{sd}"] = {"tune": f"{a}-h{h:g}", "lr_mult": m, "seed": sd,
                                                            "heldout_loss": x, "validation_loss": x, "scores": {}}
        rows[h] = rate_rows({f"{a}-h{h:g}": {m: results[f"{a}-h{h:g}-{m:.3g}-s0"]["validation_loss"]
                                             for m in (1 / 3, 1.0, 3.0)} for a in means}, [1 / 3, 1.0, 3.0])
    return decision_outcome(results, rows, list(short), {1.0: 8, 8.0: 64}, cfg, resamples=100)


def draw_decide(out: Path) -> list[Path]:
    from raycpt.report.decide import write_decision

    run = SimpleNamespace(run_dir=out / "decide", log_artifact=lambda *a: None, log_metrics=lambda *a: None)
    o = decide_outcome()
    write_decision(run, o)
    return [Path(f) for f in o.files if f.endswith(".png")]


NUM_LAYERS = 12


def compare_rows() -> list[dict]:
    """One row per layer with every panel's metric (per-model metrics as ``<key>_base`` / ``<key>_tuned``)."""
    rng = np.random.default_rng(2)
    rows = []
    for i in range(NUM_LAYERS):
        r = {"layer": i, "cka": 1 - 0.02 * i, "cosine": 1 - 0.01 * i, "mean_shift": 0.1 * i, "wc_attn": 0.5 + 0.1 * i,
             "wc_mlp": 0.7 + 0.1 * i}
        for key, scale in (("prompt_entropy", 1.0), ("dataset_entropy", 1.0), ("effective_rank", 100.0),
                           ("probe_accuracy", 1.0)):
            r[f"{key}_base"] = scale * (0.3 + 0.05 * i / NUM_LAYERS + 0.01 * rng.random())
            r[f"{key}_tuned"] = scale * (0.32 + 0.05 * i / NUM_LAYERS + 0.01 * rng.random())
        rows.append(r)
    return rows


SWAPS_KEY = "wn/average/logit"


def swaps() -> list[dict]:
    out = []
    for b in range(4):
        layers = list(range(3 * b, 3 * b + 3))
        bump = 2.0 * (1 - abs(b - 1.5) / 1.5)
        out += [{"block": b, "layers": layers, "direction": d, "score": s, "score_key": SWAPS_KEY}
                for d, s in (("base<-tuned", 40.0 + bump), ("tuned<-base", 46.0 - bump))]
    return out


def draw_compare(out: Path) -> list[Path]:
    from raycpt.report.compare import plot_compare, plot_contribution, plot_l2_change, plot_swaps

    d = out / "compare"
    paths = plot_compare(compare_rows(), d, title="base vs tuned")
    paths.append(plot_swaps(swaps(), 40.0, 46.0, d / "swap.png"))
    contrib = {i: 0.1 + 0.9 * np.sin(np.pi * (i + 0.5) / NUM_LAYERS) for i in range(NUM_LAYERS)}
    contrib[3] = 1.2
    paths.append(plot_contribution(contrib, NUM_LAYERS, d / "contribution.png"))
    paths.append(plot_l2_change({i: 1.0 + 0.1 * i for i in range(NUM_LAYERS)},
                                {i: 0.5 + 0.05 * i for i in range(NUM_LAYERS)}, NUM_LAYERS, d / "l2_change.png"))
    return paths


TRACE_GROUPS = ["reasoning", "knowledge", "reading"]


def trace_profiles() -> dict:
    x = np.linspace(0, 1, NUM_LAYERS)
    groups = {g: {"tp": 1 + k + x * (k + 1), "ls": 0.1 + 0.05 * k + 0.3 * (1 - x)} for k, g in enumerate(TRACE_GROUPS)}
    return {"groups": groups, "tp_norm": x, "ls_norm": 1 - x ** 2}


def draw_trace(out: Path) -> list[Path]:
    from raycpt.report.trace import DJS_LABEL, RATIO_LABEL, heatmap, profile_plot

    d = out / "trace"
    p = trace_profiles()
    g = p["groups"]
    return [heatmap(np.stack([g[k]["tp"] for k in TRACE_GROUPS]), TRACE_GROUPS,
                    "tiny: mean Ratio per group and layer (Task Particle)", "Greens", d / "heatmap_ratio.png",
                    RATIO_LABEL),
            heatmap(np.stack([g[k]["ls"] for k in TRACE_GROUPS]), TRACE_GROUPS,
                    "tiny: mean dJS per group and layer (Layer-wise Sensitivity)", "Reds", d / "heatmap_djs.png",
                    DJS_LABEL),
            profile_plot(p, {"split_layer": 6, "ratio": 0.5}, [0.25, 0.5, 0.75], d / "profile.png",
                         "tiny: normalised TP and LS")]


def draw_select(out: Path) -> list[Path]:
    from raycpt.report.select import scores_plot

    s = np.array([0.1 * ((i * 7) % NUM_LAYERS) for i in range(NUM_LAYERS)])
    return [scores_plot(out / "select" / "scores.png", s, [1, 3, 5], "gradient norm per layer, top 3")]


HYBRID_BUILDS = ("attn-mamba", "mamba-attn")


def hybrid_results() -> list[dict]:
    kinds = ["attention"] * 6 + ["mamba"] * 6
    x = np.linspace(0, 1, NUM_LAYERS)
    return [{"name": HYBRID_BUILDS[0], "layer_kinds": kinds, "trainable_layers": list(range(6)),
             "trace": {"tp_norm": x, "ls_norm": 1 - x}},
            {"name": HYBRID_BUILDS[1], "layer_kinds": kinds[::-1], "trainable_layers": list(range(6, 12)),
             "trace": {"tp_norm": x ** 2, "ls_norm": 1 - x ** 2}}]


def draw_hybrid(out: Path) -> list[Path]:
    from raycpt.report.hybrid import plot_profiles

    return [plot_profiles(hybrid_results(), out / "hybrid" / "hybrid_profiles.png")]


def drift_history() -> list[dict]:
    return [{"step": s, **{f"drift.dW.L{i:02d}": 0.01 * s * (i + 1) for i in range(4)},
             **{f"drift.cka.L{i:02d}": 1 - 0.001 * s * (i + 1) for i in range(4)}} for s in range(0, 50, 10)]


def draw_train(out: Path) -> list[Path]:
    from raycpt.report.train import plot_drift, plot_loss_curve

    d = out / "train"
    steps = list(range(1, 31))
    return [plot_loss_curve(steps, [4 - 0.3 * np.log(s) for s in steps], d / "loss_curve.png", title="full"),
            plot_drift(drift_history(), d / "drift.png")]


ALL = {"sweep": draw_sweep, "decide": draw_decide, "compare": draw_compare, "trace": draw_trace,
       "select": draw_select, "hybrid": draw_hybrid, "train": draw_train}
