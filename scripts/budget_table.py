"""The README's equal-budget table from a finished ``raycpt sweep --budget`` run folder.

    python scripts/budget_table.py RUN_DIR

One Markdown row per reported run (each method's picked run of the learning-rate grid): trainable parameters,
the picked rate (``edge`` when it is the grid's smallest or largest), the validation loss it was picked on, the
held-out loss, its difference from ``full`` with the 95% interval over held-out documents
(:func:`raycpt.report.sweep.cells.heldout_delta`, the summary's own), and training tokens/s. Reads
``summary/summary.json``; computes nothing the summary did not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from raycpt.report.sweep.outcomes import load_outcomes
from raycpt.report.sweep.cells import heldout_delta


def rows(run_dir: Path) -> list[str]:
    summary = json.loads((run_dir / "summary" / "summary.json").read_text())
    trials = [load_outcomes(t) for t in summary["trials"]]
    full = next(t for t in trials if t["name"] == "full")
    out = ["| run | trainable | lr (picked) | validation loss | held-out loss | Δ vs full [95%] | tok/s |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for t in trials:
        grid = t.get("lr_grid") or {}
        lr = f"{t['lr']:.3g}" + (" (edge)" if grid.get("edge") else "") if t.get("lr") is not None else "-"
        count = t.get("trainable_per_step") or t["trainable_params"]
        if t is full:
            delta = "-"
        else:
            iv = heldout_delta(t, full)
            d = t["heldout_loss"] - full["heldout_loss"]
            delta = f"{d:+.3f}" + (f" [{iv.lo:+.3f}, {iv.hi:+.3f}]" if iv is not None else "")
        val = t.get("validation_loss")
        out.append(f"| {t['name']} | {count / 1e6:.1f}M | {lr} | {'-' if val is None else f'{val:.3f}'} | "
                   f"{t['heldout_loss']:.3f} | {delta} | {_speed(t)} |")
    return out


def _speed(trial: dict) -> str:
    """Training tokens/s, ``-`` for a row that did not train (``base``)."""
    speed = trial.get("tokens_per_s")
    return "-" if not speed else f"{speed:.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    a = ap.parse_args(argv)
    print("\n".join(rows(a.run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
