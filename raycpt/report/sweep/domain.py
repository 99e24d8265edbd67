"""Domain versus general: per strategy and split, the domain tasks' gain and the general tasks' change against
``full`` (the Average column, from the summary tables) with the held-out loss delta, and a one-phrase reading
from the (adjusted) signs."""

from __future__ import annotations

from typing import Optional, Sequence

def domain_general(tables: dict[str, list[dict]], domain: Sequence[str], general: Sequence[str],
                   baseline: str = "full") -> list[dict]:
    """Per strategy and split (every cell but the baseline): the domain tasks' gain and the general
    tasks' change against ``baseline`` (the Average column, every mode, with intervals) and the held-out
    loss delta, plus a one-phrase reading. Tasks of a role that did not run are left out; [] when no
    task of either role ran."""
    d_tasks = [t for t in domain if t in tables]
    g_tasks = [t for t in general if t in tables]
    if not d_tasks and not g_tasks:
        return []
    first = tables[(d_tasks or g_tasks)[0]]
    out = []
    for row in first:
        if row["name"] == baseline or row["strategy"] == "base":  # the base row: its own table (report.sweep.base)
            continue
        entry = {"name": row["name"], "strategy": row["strategy"], "split": row["split"],
                 "heldout": row.get("heldout_delta"), "general_loss": row.get("general_delta"), "domain": [],
                 "general": []}
        for role, tasks in (("domain", d_tasks), ("general", g_tasks)):
            for task in tasks:
                r = next((x for x in tables[task] if x["name"] == row["name"]), None)
                for mode, cell in ((r or {}).get("cells", {}).get("average", {})).items():
                    entry[role].append({"task": task, "mode": mode, **{k: cell.get(k) for k in (
                        "delta", "lo", "hi", "sign", "method", "n", "p", "p_adj", "role")}})
        entry["reading"] = reading(entry, bool(d_tasks), bool(g_tasks))
        out.append(entry)
    return out


def _direction(items: list[dict]) -> Optional[int]:
    signs = {i["sign"] for i in items if i.get("sign") is not None}
    if not signs:
        return None
    return 2 if {1, -1} <= signs else (1 if 1 in signs else (-1 if -1 in signs else 0))


def reading(entry: dict, has_domain: bool = True, has_general: bool = True) -> str:
    """One phrase per role, from the (adjusted) signs only: a delta without a mark is no change. When the
    sweep has a primary comparison, it comes first and the rest are labelled exploratory."""
    words = {"domain": {1: "domain gain", -1: "domain loss", 2: "domain mixed", 0: "no clear domain change",
                        None: "domain: no interval"},
             "general": {1: "general improves", -1: "general forgets", 2: "general mixed",
                         0: "no clear general change", None: "general: no interval"}}
    items = [i for role in ("domain", "general") for i in entry[role]] + [entry.get("heldout") or {}]
    prim = next((i for i in items if i.get("role") == "primary"), None)
    tag = " (exploratory)" if prim is not None else ""
    parts = []
    if prim is not None:
        what = prim.get("task", "held-out loss") if prim.get("mode") is None else f"{prim['task']} {prim['mode']}"
        word = {1: "higher", -1: "lower", 0: "no clear change", None: "no test"}[prim.get("sign")]
        parts.append(f"primary {what}: {word}")
    for role, on in (("domain", has_domain), ("general", has_general)):
        if on:
            sec = [i for i in entry[role] if i.get("role") != "primary"]
            parts.append(words[role][_direction(sec)] + tag if sec else
                         (f"{role}: not evaluated" if not entry[role] else ""))
    h = entry.get("heldout") or {}
    if h.get("sign") is not None and h.get("role") != "primary":
        parts.append({1: "held-out loss higher", -1: "held-out loss lower", 0: "held-out loss unchanged"}[h["sign"]]
                     + tag)
    return "; ".join(p for p in parts if p)
