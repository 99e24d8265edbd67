"""``raycpt decide``'s report: the arms' picked rates per horizon, the short ranking against the long one, decision
accuracy per short metric, top-1 regret, the win probabilities' calibration; the terminal lines, ``summary/decision.md``,
``summary/decision.json``, ``summary/decision.png`` and the parent run's metrics. Pure but for the writer."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from raycpt.decide import Decision, arm_stats, decide
from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.report.figures import save_figure

PRIMARY = "heldout_loss"
TARGETS = {"decision_accuracy": (">=", 0.90), "decision_accuracy_all_pairs": (">=", 0.80),
           "top1_regret_sd": ("<=", 1.0), "win_probability_ece": ("<=", 0.05), "interior_lr_share": (">=", 1.0)}
"""Issue 47's targets: what a short sweep must reach before its ranking is read as the long one's."""


def metric_keys(domain: str) -> dict[str, tuple[str, int]]:
    """Short-horizon predictors: name -> (result key, sign that makes lower better)."""
    return {"heldout_loss": ("heldout_loss", 1), "heldout_bpb": ("heldout_bpb", 1),
            "validation_loss": ("validation_loss", 1), "general_loss": ("general_loss", 1),
            "p_gold": (f"{domain}/average/logit.prob", -1), "logprob": (f"{domain}/average/logit.logprob", -1),
            "accuracy": (f"{domain}/average/logit", -1)}


def value(result: dict, key: str) -> Optional[float]:
    v = result.get(key, (result.get("scores") or {}).get(key))
    return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None


@dataclass
class DecideOutcome:
    horizons: list
    steps: dict
    arms: list
    picks: dict
    """{horizon: {arm: {"picked", "tried", "losses", "tuned", "edge"}}}."""
    values: dict
    """{horizon: {metric: {arm: [per-seed values, lower better]}}}."""
    decisions: dict
    """{metric: Decision as a dict}: each short metric against the long horizon's held-out loss."""
    baseline: dict = field(default_factory=dict)
    """The plain baseline, the default sweep as it was: every arm at its centre rate (multiplier 1), one seed (the
    first), at the short horizon, against the same long-horizon truth: ``{"accuracy_all", "pairs_all", "tau",
    "short_pick", "long_best"}`` (empty when those runs are missing)."""
    results: dict = field(default_factory=dict)
    """The five RESULT figures with their bootstrap errors: {name: {"value", "se", "n", "target", "pass"}}."""
    seeds: list = field(default_factory=list)
    run_dir: Optional[Path] = None
    parent_run_id: Optional[str] = None
    wall_s: float = 0.0
    files: list = field(default_factory=list)


def picked_values(results: dict, arms: list, h: float, pick: dict, keys: dict) -> dict:
    """{metric: {arm: [value per seed at the arm's picked rate]}} at horizon ``h`` (sign-adjusted: lower better)."""
    out = {m: {a: [] for a in arms} for m in keys}
    for r in sorted(results.values(), key=lambda r: r.get("seed", 0)):
        arm = next((a for a in arms if r.get("tune") == f"{a}-h{h:g}"), None)
        if arm is None or pick.get(arm) is None or float(r["lr_mult"]) != pick[arm]:
            continue
        for m, (key, sign) in keys.items():
            v = value(r, key)
            if v is not None:
                out[m][arm].append(sign * v)
    return out


def decision_outcome(results: dict, rows: dict, arms: list, steps: dict, cfg, resamples: int = 2000) -> DecideOutcome:
    hs = sorted(rows)
    keys = metric_keys((cfg.eval.domain or ["wordnet_mc"])[0])
    picks = {h: {r.method[:-len(f"-h{h:g}")]: {"picked": r.picked, "tried": list(r.mults), "losses": list(r.losses),
                                                "tuned": r.tuned, "edge": r.edge} for r in rows[h]} for h in hs}
    values = {h: picked_values(results, arms, h, {a: p["picked"] for a, p in picks[h].items()}, keys) for h in hs}
    short, long = hs[0], hs[-1]
    truth = arm_stats(values[long][PRIMARY])
    decisions = {m: decide(arm_stats(values[short][m]), truth, m, cfg.decide.alpha) for m in keys
                 if sum(1 for v in values[short][m].values() if v) >= 2}
    tuned = [a for a in arms if all(picks[h][a]["tuned"] for h in hs)]
    out = DecideOutcome(horizons=hs, steps={f"{h:g}": steps[h] for h in hs}, arms=list(arms), picks=picks,
                        values=values, decisions={m: _as_dict(d) for m, d in decisions.items()},
                        seeds=list(cfg.decide.seeds))
    fixed = {a: [v for r in sorted(results.values(), key=lambda r: r.get("seed", 0))
                 if r.get("tune") == f"{a}-h{short:g}" and float(r["lr_mult"]) == 1.0
                 and r.get("seed") == cfg.decide.seeds[0] and (v := value(r, PRIMARY)) is not None]
             for a in arms}
    fixed = {a: v for a, v in fixed.items() if v}
    if len(fixed) >= 2:
        b = decide(arm_stats(fixed), truth, PRIMARY, cfg.decide.alpha)
        out.baseline = {"accuracy_all": b.accuracy_all, "pairs_all": b.pairs_all, "tau": b.tau,
                        "short_pick": b.short_pick, "long_best": b.long_best, "regret_sd": b.regret_sd}
    out.results = result_figures(values[short][PRIMARY], values[long][PRIMARY], len(tuned) / len(arms) if arms else
                                 math.nan, len(arms), cfg.decide.alpha, resamples)
    return out


def _as_dict(d: Decision) -> dict:
    out = asdict(d)
    out["calls"] = [asdict(c) for c in d.calls]
    return out


def result_figures(short: dict, long: dict, interior: float, n_arms: int, alpha: float, resamples: int = 2000,
                   seed: int = 0) -> dict:
    """The five RESULT figures and their bootstrap standard errors: seeds resampled with replacement, the same
    seed indices for every arm at both horizons (paired seeds)."""
    d = decide(arm_stats(short), arm_stats(long), PRIMARY, alpha)
    point = {"decision_accuracy": (d.accuracy_resolved, d.pairs_resolved),
             "decision_accuracy_all_pairs": (d.accuracy_all, d.pairs_all), "top1_regret_sd": (d.regret_sd, n_arms),
             "win_probability_ece": (d.ece, d.pairs_all)}
    k = min([len(v) for v in list(short.values()) + list(long.values())] or [0])
    reps = {name: [] for name in point}
    rng = np.random.default_rng(seed)
    for _ in range(resamples if k >= 3 else 0):  # two seeds have one resample with two distinct runs: no spread
        idx = rng.integers(0, k, size=k)
        if len(set(idx.tolist())) < 2:
            continue
        rs = {a: [v[i] for i in idx] for a, v in short.items()}
        rl = {a: [v[i] for i in idx] for a, v in long.items()}
        b = decide(arm_stats(rs), arm_stats(rl), PRIMARY, alpha)
        for name, x in (("decision_accuracy", b.accuracy_resolved), ("decision_accuracy_all_pairs", b.accuracy_all),
                        ("top1_regret_sd", b.regret_sd), ("win_probability_ece", b.ece)):
            if math.isfinite(x):
                reps[name].append(x)
    out = {}
    for name, (v, n) in point.items():
        se = float(np.std(reps[name], ddof=1)) if len(reps[name]) > 1 else math.nan
        out[name] = _figure(name, v, se, n)
    out["interior_lr_share"] = _figure("interior_lr_share", interior, math.nan, n_arms)
    return out


def _figure(name: str, v: float, se: float, n: int) -> dict:
    op, target = TARGETS[name]
    ok = math.isfinite(v) and (v >= target if op == ">=" else v <= target)
    return {"value": v, "se": se, "n": n, "target": target, "op": op, "pass": bool(ok)}


def result_line(name: str, f: dict, seeds: int) -> str:
    """``RESULT <name> <measured> target <op> <value> PASS|FAIL`` with its count and bootstrap error."""
    se = f" ± {f['se']:.3f} (bootstrap SE over seeds)" if math.isfinite(f["se"]) else ""
    return (f"RESULT {name} {f['value']:.3f} target {f['op']} {f['target']:g} {'PASS' if f['pass'] else 'FAIL'}"
            f"  [n={f['n']}, seeds={seeds}{se}]")


def headline(o: DecideOutcome) -> str:
    """The verdict's first line: whether the short ranking may be read as the long one's."""
    s, l = o.steps[f"{o.horizons[0]:g}"], o.steps[f"{o.horizons[-1]:g}"]
    ok = all(f["pass"] for f in o.results.values())
    d = o.decisions.get(PRIMARY, {})
    acc = f"{d.get('accuracy_all', math.nan):.0%} of {d.get('pairs_all', 0)} pairs"
    if ok:
        return (f"The {s}-step ranking predicts the {l}-step ranking ({acc} ordered alike, every target met): "
                f"a {s}-step sweep's pick may be read as the longer run's.")
    failed = ", ".join(n for n, f in o.results.items() if not f["pass"])
    return (f"The {s}-step ranking does NOT predict the {l}-step ranking well enough to act on ({acc} ordered alike; "
            f"missed: {failed}): decide at the longer horizon, e.g. raycpt sweep CONFIG train.max_steps={l}.")


def terminal_lines(o: DecideOutcome) -> list[str]:
    hs = o.horizons
    lines = [headline(o), ""]
    lines.append("Learning rate per arm (validation slice; * = picked, untuned = still at its grid's edge):")
    for a in o.arms:
        cells = []
        for h in hs:
            p = o.picks[h][a]
            tried = " ".join(f"{m:.3g}{'*' if m == p['picked'] else ''}" for m in p["tried"])
            cells.append(f"{o.steps[f'{h:g}']} steps: {tried}" + ("" if p["tuned"] else f" (untuned, {p['edge']} edge)"))
        lines.append(f"- {a}: " + " | ".join(cells) + f"  ({transfer(o, a)})")
    lines += ["", f"Held-out loss per arm, seed means (± run SD) at {len(o.seeds)} seeds:"]
    sv, lv = o.values[hs[0]][PRIMARY], o.values[hs[-1]][PRIMARY]
    srank = {a: i + 1 for i, a in enumerate(sorted(o.arms, key=lambda a: _m(sv[a])))}
    lrank = {a: i + 1 for i, a in enumerate(sorted(o.arms, key=lambda a: _m(lv[a])))}
    for a in sorted(o.arms, key=lambda a: lrank[a]):
        lines.append(f"  {a:<22} short {_m(sv[a]):.4f} ± {_sd(sv[a]):.4f} (rank {srank[a]})   "
                     f"long {_m(lv[a]):.4f} ± {_sd(lv[a]):.4f} (rank {lrank[a]})")
    d = o.decisions.get(PRIMARY)
    if d:
        lines += ["", f"Short pick {d['short_pick']}; long best {d['long_best']}; Kendall tau {d['tau']:.2f}."]
    lines += ["", "Which short metric predicts the long held-out ranking (decision accuracy, all pairs | resolved):"]
    for m, x in sorted(o.decisions.items(), key=lambda kv: -_nz(kv[1]["accuracy_all"])):
        lines.append(f"  {m:<16} {x['accuracy_all']:.2f} of {x['pairs_all']} | {_fmt(x['accuracy_resolved'])} of "
                     f"{x['pairs_resolved']}   tau {_fmt(x['tau'])}")
    if o.baseline:
        b = o.baseline
        lines += ["", f"Baseline, the sweep as it was (every arm at its centre rate, one seed): decision accuracy "
                      f"{_fmt(b['accuracy_all'])} of {b['pairs_all']} pairs, tau {_fmt(b['tau'])}, short pick "
                      f"{b['short_pick']} (long best {b['long_best']})."]
    lines += [""] + [result_line(n, f, len(o.seeds)) for n, f in o.results.items()]
    return lines


def transfer(o: DecideOutcome, arm: str) -> str:
    """Whether the arm's short pick is its long optimum: ``transferred``, ``moved x<ratio>``, or ``untuned`` when a
    pick sits at its grid's edge (its optimum is not known)."""
    a, b = o.picks[o.horizons[0]][arm], o.picks[o.horizons[-1]][arm]
    if not (a["tuned"] and b["tuned"]):
        return "untuned: optimum not bracketed"
    return "rate transferred" if a["picked"] == b["picked"] else f"rate moved x{b['picked'] / a['picked']:.3g}"


def _m(v) -> float:
    return float(np.mean(v)) if v else math.nan


def _sd(v) -> float:
    return float(np.std(v, ddof=1)) if len(v) > 1 else math.nan


def _nz(x) -> float:
    return x if isinstance(x, float) and math.isfinite(x) else -1.0


def _fmt(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def markdown(o: DecideOutcome) -> str:
    hs = o.horizons
    out = ["# Decision accuracy: the short sweep against the long one", "", headline(o), "",
           f"Arms: {', '.join(o.arms)}; seeds {o.seeds}; horizons "
           + " and ".join(f"{o.steps[f'{h:g}']} steps" for h in hs) + ".", "",
           "| arm | " + " | ".join(f"lr pick @ {o.steps[f'{h:g}']} steps" for h in hs) + " | short held-out | long "
           "held-out |", "|---|" + "---:|" * len(hs) + "---:|---:|"]
    for a in o.arms:
        picks = " | ".join(f"{o.picks[h][a]['picked']:.3g}" + ("" if o.picks[h][a]["tuned"] else " (untuned)")
                           for h in hs)
        sv, lv = o.values[hs[0]][PRIMARY][a], o.values[hs[-1]][PRIMARY][a]
        out.append(f"| {a} | {picks} | {_m(sv):.4f} ± {_sd(sv):.4f} | {_m(lv):.4f} ± {_sd(lv):.4f} |")
    out += ["", "| short metric | decision accuracy (all pairs) | pairs | on resolved pairs | pairs | Kendall tau |",
            "|---|---:|---:|---:|---:|---:|"]
    for m, x in o.decisions.items():
        out.append(f"| {m} | {_fmt(x['accuracy_all'])} | {x['pairs_all']} | {_fmt(x['accuracy_resolved'])} | "
                   f"{x['pairs_resolved']} | {_fmt(x['tau'])} |")
    d = o.decisions.get(PRIMARY)
    if d:
        out += ["", "Calibration of the short sweep's win probabilities (held-out loss) against the long order:", "",
                "| confidence bin | pairs | mean confidence | share ordered alike |", "|---|---:|---:|---:|"]
        out += [f"| {r['lo']:.1f}-{r['hi']:.1f} | {r['n']} | {r['confidence']:.2f} | {r['correct']:.2f} |"
                for r in d["reliability"]]
    if o.baseline:
        b = o.baseline
        out += ["", f"Baseline (every arm at its centre rate, one seed, short horizon): decision accuracy "
                    f"{_fmt(b['accuracy_all'])} of {b['pairs_all']} pairs, Kendall tau {_fmt(b['tau'])}."]
    out += ["", "```"] + [result_line(n, f, len(o.seeds)) for n, f in o.results.items()] + ["```"]
    return "\n".join(out) + "\n"


def plot(o: DecideOutcome, path: Path) -> Path:
    """Short rank against long rank (left), the win probabilities' reliability (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = o.horizons
    sv, lv = o.values[hs[0]][PRIMARY], o.values[hs[-1]][PRIMARY]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6))
    xs, ys = [_m(sv[a]) for a in o.arms], [_m(lv[a]) for a in o.arms]
    ax.errorbar(xs, ys, xerr=[_sd(sv[a]) for a in o.arms], yerr=[_sd(lv[a]) for a in o.arms], fmt="o", capsize=3,
                label=f"arm: mean over {len(o.seeds)} seeds, whiskers ± 1 SD over seeds")
    for a, x, y in zip(o.arms, xs, ys):
        ax.annotate(a + ("" if all(o.picks[h][a]["tuned"] for h in hs) else " (untuned)"), (x, y), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    short, long = o.steps[f"{hs[0]:g}"], o.steps[f"{hs[-1]:g}"]
    ax.set_xlabel(f"held-out loss after {short} steps (nats per token)")
    ax.set_ylabel(f"held-out loss after {long} steps (nats per token)")
    d = o.decisions.get(PRIMARY, {})
    ax.set_title(f"{short}-step against {long}-step held-out loss per arm\n"
                 f"decision accuracy {_fmt(d.get('accuracy_all'))}, Kendall tau {_fmt(d.get('tau'))}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    rows = d.get("reliability", [])
    bx.plot([0.5, 1], [0.5, 1], ls="--", color="grey", label="perfect calibration")
    if rows:
        bx.plot([r["confidence"] for r in rows], [r["correct"] for r in rows], "o-",
                label="one bin of pairs (its number of pairs beside it)")
        for r in rows:
            bx.annotate(str(r["n"]), (r["confidence"], r["correct"]), fontsize=8, xytext=(4, -10),
                        textcoords="offset points")
    bx.set_xlim(0.45, 1.02), bx.set_ylim(-0.02, 1.02)
    bx.set_xlabel(f"{short}-step win probability of the pick of a pair (mean over the bin)")
    bx.set_ylabel(f"share of the bin's pairs the {long}-step run orders alike")
    bx.set_title(f"Calibration of the {short}-step win probabilities\nexpected calibration error {_fmt(d.get('ece'))}",
                 fontsize=10)
    bx.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def write_decision(run, o: DecideOutcome, console=None, record_to: Optional[Path] = None) -> None:
    """The report's files in ``<run>/summary``, on the parent run as artifacts and metrics; printed; the record a sweep
    of the short horizon's settings reads (``record_to``: :func:`raycpt.decide.record_path`)."""
    out = Path(run.run_dir) / "summary"
    files = [atomic_write_text(out / "decision.md", markdown(o)),
             atomic_write_json(out / "decision.json", {k: v for k, v in asdict(o).items()
                                                       if k not in ("run_dir", "files")}),
             plot(o, out / "decision.png")]
    for f in files:
        run.log_artifact(f, "summary")
    run.log_metrics({n: f["value"] for n, f in o.results.items() if math.isfinite(f["value"])})
    run.log_metrics({f"decision_accuracy/{m}": x["accuracy_all"] for m, x in o.decisions.items()
                     if math.isfinite(x["accuracy_all"])})
    o.files = [str(f) for f in files]
    if record_to is not None:
        d = o.decisions.get(PRIMARY, {})
        atomic_write_json(record_to, {"short_steps": o.steps[f"{o.horizons[0]:g}"],
                                      "long_steps": o.steps[f"{o.horizons[-1]:g}"],
                                      "passed": all(f["pass"] for f in o.results.values()),
                                      "accuracy_all": d.get("accuracy_all"), "pairs_all": d.get("pairs_all"),
                                      "results": o.results, "run_dir": str(run.run_dir), "written": time.time()})
    if console is not None:
        for line in terminal_lines(o):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
