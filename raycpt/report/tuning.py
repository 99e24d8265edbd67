"""Equal tuning (``sweep.lr_grid``): each method's learning rate picked on the validation slice, the held-out result
reported for the picked run only. Pure: trial results in, the picked trials and the grid table out.

A trial of the grid carries ``tune`` (its method: the summary cell it stands for), ``lr_mult`` (its multiplier),
``lr`` and ``validation_loss`` (token mean on the validation slice, :mod:`raycpt.data.validation`). Per method the
multiplier with the lowest validation loss wins (its mean over the method's seeds when it has several; ties: the
smaller rate); its runs are reported under the method's name. The held-out test loss never enters the choice.
"""

from __future__ import annotations

from typing import Optional

from raycpt.decide import RateRow, finite_mean


UNTUNED = "(untuned)"
"""The suffix of a picked run whose rate sits at its grid's edge: every table shows it, no mark or best rests on it."""


def pick_by_validation(trials: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(picked trials, grid table)``. Trials without ``tune`` pass unchanged; of a tuned method only the runs at
    its picked multiplier stay, renamed ``base_name`` (the name without ``-lr<m>``) with ``lr_grid`` (the table
    row) added. A table row: ``{"method", "grid": [{"lr_mult", "lr", "validation_loss", "heldout_loss", "runs"}],
    "picked_mult", "picked_lr", "edge", "untuned"}`` (``edge``: the pick is the smallest or largest rate tried, so
    the best rate may lie outside them: the method is *untuned*, issue 47); a method none of whose runs has a finite validation loss picks nothing (None)."""
    methods: dict[str, list[dict]] = {}
    out: list[dict] = []
    for t in trials:
        if t.get("tune") is None:
            out.append(t)
        else:
            methods.setdefault(t["tune"], []).append(t)
    table = []
    for method, runs in methods.items():
        mults = sorted({float(r["lr_mult"]) for r in runs})
        grid = [{"lr_mult": m, "lr": next(float(r["lr"]) for r in runs if float(r["lr_mult"]) == m),
                 "validation_loss": finite_mean(r.get("validation_loss") for r in runs if float(r["lr_mult"]) == m),
                 "heldout_loss": finite_mean(r.get("heldout_loss") for r in runs if float(r["lr_mult"]) == m),
                 "runs": [r["name"] for r in runs if float(r["lr_mult"]) == m]} for m in mults]
        rate = RateRow(method, tuple(mults), tuple(g["validation_loss"] for g in grid))  # THE pick and edge rule
        best: Optional[dict] = next((g for g in grid if g["lr_mult"] == rate.picked), None)
        row = {"method": method, "grid": grid, "picked_mult": best and best["lr_mult"],
               "picked_lr": best and best["lr"], "edge": rate.edge is not None}
        row["untuned"] = row["edge"]
        table.append(row)
        for r in runs:
            if best is not None and float(r["lr_mult"]) == best["lr_mult"]:
                name = r.get("base_name") or method
                mark = (lambda x: f"{x} {UNTUNED}") if row["untuned"] else (lambda x: x)
                out.append({**r, "name": mark(name), "group": mark(r.get("group") or method), "lr_grid": row,
                            "untuned": row["untuned"]})
    return out, table


def tuning_lines(table: list[dict], validation_note: str = "") -> list[str]:
    """What the terminal shows: per method every rate with its validation loss, the picked one marked ``*``."""
    head = "Learning rate per method, picked on the validation slice" + (f" ({validation_note})" if validation_note
                                                                          else "") + "; held-out loss of the pick:"
    lines = [head]
    for row in table:
        cells = " | ".join(f"{g['lr']:.3g}{'*' if g['lr_mult'] == row['picked_mult'] else ''} "
                           f"(val {g['validation_loss']:.4f})" for g in row["grid"])
        pick = next((g for g in row["grid"] if g["lr_mult"] == row["picked_mult"]), None)
        tail = (f"-> lr {row['picked_lr']:.3g}, held-out {pick['heldout_loss']:.4f}"
                + (" (untuned: at the grid's edge)" if row["edge"] else "")) if pick else "-> none (no finite validation loss)"
        lines.append(f"- {row['method']}: {cells} {tail}")
    return lines


def tuning_markdown(table: list[dict], validation_note: str = "") -> str:
    """The grid and the choice as a Markdown section (``summary/tuning.md``)."""
    out = ["## Learning-rate tuning (equal tuning)", "",
           "Each method ran at every rate of the grid; the run with the lowest loss on the validation slice"
           + (f" ({validation_note})" if validation_note else "")
           + " is the one every table of the summary reports. The held-out test loss never enters the choice.", "",
           "| method | lr | validation loss | held-out loss | picked |", "|---|---:|---:|---:|:---:|"]
    for row in table:
        for g in row["grid"]:
            mark = "*" + (" (untuned: edge)" if row["edge"] else "") if g["lr_mult"] == row["picked_mult"] else ""
            out.append(f"| {row['method']} | {g['lr']:.3g} | {g['validation_loss']:.4f} | {g['heldout_loss']:.4f} "
                       f"| {mark} |")
    return "\n".join(out) + "\n"
