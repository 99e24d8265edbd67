#!/usr/bin/env python
"""Does a short sweep's decision hold at a longer horizon? Issue 47's five figures, from one ``raycpt decide`` run.

    python benchmarks/bench_decision.py                 # runs raycpt decide configs/decide.yaml (hours on 2 cores)
    python benchmarks/bench_decision.py --run RUN_DIR   # a finished (or --resume'd) decide run's figures
    python benchmarks/bench_decision.py --smoke         # the same report code on simulated arms (seconds)

Five lines, each with its pair/arm count, the seeds and a bootstrap standard error over seeds (paired: the same
seed indices for every arm at both horizons):

1. **decision_accuracy** - the share of the pairs the long horizon separates beyond its own run noise (Welch
   p < 0.05) that the short horizon's held-out loss orders the same way. Target >= 0.90.
2. **decision_accuracy_all_pairs** - DataDecide's decision accuracy: all C(n, 2) pairs, seed means. Target >= 0.80.
3. **top1_regret_sd** - the long-horizon held-out loss of the short horizon's pick minus the long horizon's best, in
   long-horizon run SDs. Target <= 1.0.
4. **win_probability_ece** - the expected calibration error of the short sweep's win probabilities (its Welch
   model) against the long horizon's order. Target <= 0.05.
5. **interior_lr_share** - the share of arms whose learning-rate pick is interior at both horizons. Target >= 1.0.

Beside them (INFO), the reference a reader needs for line 4: the ECE a *perfectly calibrated* world gives at the
same number of pairs, seeds and run noise (the long horizon's means and SDs taken as the truth at both horizons,
simulated; the outcome a long seed mean, as in the measurement). An ECE target below that floor cannot be met by
any model at this many pairs: the line then says so.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._smoke import add_smoke  # noqa: E402
from raycpt.decide import arm_stats, decide  # noqa: E402
from raycpt.report.decide import PRIMARY, result_line, terminal_lines  # noqa: E402


def ece_floor(means: dict, sds: dict, seeds: int, sims: int, rng) -> tuple[float, float]:
    """Mean and Monte-Carlo SE of the ECE when short and long share one truth (``means``, run SDs ``sds``)."""
    eces = []
    for _ in range(sims):
        short = {a: list(rng.normal(means[a], sds[a], seeds)) for a in means}
        long = {a: list(rng.normal(means[a], sds[a], seeds)) for a in means}
        e = decide(arm_stats(short), arm_stats(long), PRIMARY).ece
        if math.isfinite(e):
            eces.append(e)
    return float(np.mean(eces)), float(np.std(eces, ddof=1) / math.sqrt(len(eces)))


def simulated_arms(rng, arms: int = 7, seeds: int = 3, shift: float = 0.3) -> tuple[dict, dict]:
    """Smoke: arms whose long-horizon means are the short ones plus a horizon shift (``shift`` run SDs), SD 0.01."""
    base = rng.normal(4.0, 0.03, arms)
    long_mu = base + rng.normal(0, shift * 0.01, arms)
    names = [f"arm{i}" for i in range(arms)]
    short = {n: list(rng.normal(base[i], 0.01, seeds)) for i, n in enumerate(names)}
    long = {n: list(rng.normal(long_mu[i], 0.01, seeds)) for i, n in enumerate(names)}
    return short, long


def smoke_outcome(short: dict, long: dict):
    """The report's whole path (:func:`raycpt.report.decide.decision_outcome`) on simulated trial results: each arm
    searched at 1/3, 1 and 3 (the middle one best) at seed 0, then its pick at every seed, at horizons 1 and 8."""
    from raycpt.config import load_config
    from raycpt.decide import rate_rows
    from raycpt.report.decide import decision_outcome

    cfg = load_config(None, ["decide.seeds=[0,1,2]"])
    results, rows = {}, {}
    for h, vals in ((1.0, short), (8.0, long)):
        for a, v in vals.items():
            for m in (1 / 3, 1.0, 3.0):
                for sd in ((0, 1, 2) if m == 1.0 else (0,)):
                    x = v[sd] + (0.0 if m == 1.0 else 0.05)
                    results[f"{a}-h{h:g}-{m:.3g}-s{sd}"] = {"tune": f"{a}-h{h:g}", "lr_mult": m, "seed": sd,
                                                          "heldout_loss": x, "validation_loss": x + 0.01,
                                                          "scores": {}}
        rows[h] = rate_rows({f"{a}-h{h:g}": {m: results[f"{a}-h{h:g}-{m:.3g}-s0"]["validation_loss"]
                                             for m in (1 / 3, 1.0, 3.0)} for a in vals}, [1 / 3, 1.0, 3.0])
    return decision_outcome(results, rows, list(short), {1.0: 8, 8.0: 64}, cfg, resamples=200)


def figures_of_run(run_dir: Path) -> dict:
    doc = json.loads((run_dir / "summary" / "decision.json").read_text())
    hs = sorted(doc["values"], key=float)
    return {"results": doc["results"], "short": doc["values"][hs[0]][PRIMARY], "long": doc["values"][hs[-1]][PRIMARY],
            "seeds": len(doc["seeds"]), "wall_s": doc.get("wall_s"), "baseline": doc.get("baseline") or {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    add_smoke(ap)
    ap.add_argument("--run", type=Path, help="a finished decide run folder (default: run raycpt decide now)")
    ap.add_argument("--config", default="configs/decide.yaml")
    ap.add_argument("--sims", type=int, default=2000, help="simulations of the calibrated-world ECE floor")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    t0 = time.time()
    if args.smoke:
        short, long = simulated_arms(rng)
        outcome = smoke_outcome(short, long)
        for line in terminal_lines(outcome):
            if not line.startswith("RESULT "):  # printed once, below, with the ECE floor beside them
                print(line)
        results, seeds, sims = outcome.results, 3, 100
        print("smoke: 7 simulated arms x 3 seeds through the report's code, not a measurement")
    else:
        run_dir = args.run
        if run_dir is None:
            root = Path("runs")
            subprocess.run(["raycpt", "decide", args.config, f"tracking.run_root={root}"], check=True)
            run_dir = max(root.glob("decide-*"), key=lambda p: p.stat().st_mtime)
        got = figures_of_run(run_dir)
        results, short, long, seeds, sims = got["results"], got["short"], got["long"], got["seeds"], args.sims
        print(f"decide run {run_dir}")
        b = got["baseline"]
        if b:  # the plain baseline beside ours: the sweep as it was (centre rate, one seed) against the same truth
            print(f"BASELINE decision_accuracy_all_pairs {b['accuracy_all']:.3f} (every arm at its centre rate, one "
                  f"seed, {b['pairs_all']} pairs; short pick {b['short_pick']}, long best {b['long_best']})")
    longs = arm_stats(long)
    means = {a: x.mean for a, x in longs.items()}
    sds = {a: math.sqrt(x.var) if x.k > 1 else 0.0 for a, x in longs.items()}
    floor, floor_se = ece_floor(means, sds, seeds, sims, rng)
    n_pairs = results["decision_accuracy_all_pairs"]["n"]
    print(f"INFO ece_of_a_calibrated_world {floor:.3f} ± {floor_se:.3f} (Monte-Carlo SE, {sims} simulations at "
          f"{n_pairs} pairs, {seeds} seeds, the long horizon's means and run SDs as the truth at both horizons)")
    if floor > results["win_probability_ece"]["target"]:
        print(f"INFO win_probability_ece's target {results['win_probability_ece']['target']} is below what a "
              f"perfectly calibrated model reaches at {n_pairs} pairs ({floor:.3f}): out of reach at this size")
    for name, f in results.items():
        f = {**f, "value": float("nan") if f["value"] is None else f["value"],
             "se": float("nan") if f.get("se") is None else f["se"]}
        print(result_line(name, f, seeds))
    print(f"took {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
