#!/usr/bin/env python
"""The run-to-run SD of a sweep run with several seeds (issue 36; docs/analysis.md "The run-to-run SD").

    python scripts/run_sd.py runs/sweep-default-XXXX

Per row: the SD across seeds of the held-out loss and of every Average score (benchmark x mode); the run variance
of the held-out loss pooled over the rows (:func:`raycpt.stats.pooled_run_variance`, what the verdict's strategy
test uses); the per-block residual between runs of one row (each run's offset removed) and the document-clustered
SE of a two-run difference (:func:`raycpt.stats.ratio_delta_se`), which calibrate benchmarks/bench_calibration.py.
Reads the trials' result.json and eval_result.json only.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raycpt.stats import pooled_run_variance, ratio_delta_se  # noqa: E402


def load_rows(run: Path) -> dict[str, list[tuple[dict, dict]]]:
    rows: dict[str, list] = {}
    for f in sorted((run / "trials").glob("*/result.json")):
        t = json.loads(f.read_text())
        rows.setdefault(t.get("group") or t["name"], []).append((t, json.loads(Path(t["eval_file"]).read_text())))
    return rows


def block_noise(runs: list[tuple[dict, dict]], docs) -> tuple[float, float]:
    """(per-block residual SD with each run's offset removed, mean doc-clustered SE of a two-run difference)."""
    b = np.array([e["heldout_block_losses"] for _, e in runs])
    w = runs[0][1].get("heldout_block_weights")
    c = b - b.mean(0)
    resid = c - c.mean(1, keepdims=True)
    k, n = b.shape
    ses = [ratio_delta_se(b[i], b[j], clusters=docs, weights=w)[1] for i, j in itertools.combinations(range(k), 2)]
    return float(np.sqrt((resid ** 2).sum() / ((k - 1) * (n - 1)))), float(np.mean(ses))


def main(argv=None) -> int:
    run = Path((argv or sys.argv[1:])[0])
    rows = load_rows(run)
    docs = json.loads((run / "heldout_docs.json").read_text()) if (run / "heldout_docs.json").is_file() else None
    keys = sorted(k for k in next(iter(rows.values()))[0][0]["scores"] if "/average/" in k)
    print("| row | seeds | held-out loss mean | SD | " + " | ".join(f"{k.replace('/average/', ' ')} SD" for k in keys)
          + " | per-block residual SD | doc SE of a two-run Δ |")
    print("|---" * (6 + len(keys)) + "|")
    for g, runs in rows.items():
        h = [t["heldout_loss"] for t, _ in runs]
        sds = [np.std([t["scores"][k] for t, _ in runs], ddof=1) for k in keys]
        res, se = block_noise(runs, docs)
        print(f"| {g} | {len(runs)} | {np.mean(h):.4f} | {np.std(h, ddof=1):.4f} | "
              + " | ".join(f"{x:.2f}" for x in sds) + f" | {res:.4f} | {se:.4f} |")
    var, df = pooled_run_variance([[t["heldout_loss"] for t, _ in r] for r in rows.values()])
    print(f"\npooled run-to-run SD of the held-out loss: {np.sqrt(var):.4f} nats on {df} df")
    for k in keys:
        v, d = pooled_run_variance([[t["scores"][k] for t, _ in r] for r in rows.values()])
        print(f"pooled run-to-run SD of {k}: {np.sqrt(v):.2f} points on {d} df")
    return 0


if __name__ == "__main__":
    sys.exit(main())
