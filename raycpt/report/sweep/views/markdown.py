"""summary.md: the verdict block, the domain-versus-general table, and per task the Table-1 layout and the S(b)
gains, every delta with its 95% interval (the numbers come computed: :mod:`raycpt.report.sweep.cells`)."""

from __future__ import annotations

from typing import Sequence

from raycpt.report.sweep.model import Cell, Row, as_summary
from raycpt.report.sweep.views.columns import MARKDOWN, Place, columns, loss_columns
from raycpt.report.sweep.views.format import (CATEGORY_LABEL, MODE_LETTER, fmt_p, fmt_s, fmt_delta, row_categories,
                                              table_modes)
from raycpt.report.sweep.seeds import checkpoint_line
from raycpt.report.sweep.statistics import STRATEGY
from raycpt.report.sweep.cells import largest_s_b
from raycpt.report.sweep.family import HELDOUT
from raycpt.tasks import is_continuous

LEGEND = ("Δ against full with its 95% interval in brackets (what each interval covers: the legend of the "
          "verdict below); ▲ / ▼ = better / worse than full, marked only when the comparison's p-value survives "
          "the multiplicity control over the sweep (for losses lower is better), never from an interval alone; "
          "* = best on the primary metric, only when it beats every other row")


def table_markdown(task: str, rows: Sequence[Row], continuous: bool = False) -> str:
    """Markdown: cells ``G / L (ΔG [lo, hi] / ΔL [lo, hi])`` in percent, best marked with ``*``; mean ±
    95% half-width over seeds when a cell has several; the loss columns and the held-out Δ at the end (the
    columns: :data:`raycpt.report.sweep.views.columns.COLUMNS`). ``continuous``: the same table of the continuous
    scores (``cloze.prob``, ...: :data:`raycpt.tasks.CONTINUOUS`) instead of the accuracies, without the loss
    columns."""
    cats = row_categories(rows)
    modes = tuple(m for m in table_modes(rows) if is_continuous(m) == continuous)
    if not modes:
        return ""
    losses = set() if continuous else {c.name for c in loss_columns(rows)}
    held = not continuous and any(r.heldout_delta is not None and r.heldout_delta.delta is not None for r in rows)
    cols = [c for c in columns(MARKDOWN) if (not c.loss or c.name in losses) and (c.name != "heldout_delta" or held)]

    def texts(c, r):
        if c.per_category:
            return [c.text(MARKDOWN, Place(task, r, k, modes=modes)) for k in cats]
        return [c.text(MARKDOWN, Place(task, r))]
    heads = [h for c in cols for h in ([CATEGORY_LABEL.get(k, k) for k in cats] if c.per_category
                                       else [c.header(MARKDOWN)])]
    letters = " / ".join(MODE_LETTER.get(m, m) for m in modes)
    what = ("continuous scores (prob: % on gold among the choices; logprob: nats; logprob_char: nats/char)"
            if continuous else "accuracy (%)")
    lines = [f"**{task}** — {letters} {what}, Δ against full [95% interval] in brackets, * = best", "",
             "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(t for c in cols for t in texts(c, r)) + " |" for r in rows]
    return "\n".join(lines)


def domain_general_markdown(entries: list[dict]) -> str:
    """The domain-versus-general table: per strategy and split, the domain gain and the general change
    against full (Average column, each mode, 95% intervals), the held-out loss delta, and the reading."""
    if not entries:
        return ""
    cols = [("domain", i["task"], i["mode"]) for i in entries[0]["domain"]] + \
           [("general", i["task"], i["mode"]) for i in entries[0]["general"]]
    lines = ["**Domain versus general** — Average accuracy Δ against full (points) [95% interval]", "",
             "| trial | " + " | ".join(f"{role}: {task} {MODE_LETTER.get(m, m)}" for role, task, m in cols)
             + " | Δ held-out loss | Δ general loss | reading |", "|" + "---|" * (len(cols) + 4)]
    for e in entries:
        by = {(role, i["task"], i["mode"]): i for role in ("domain", "general") for i in e[role]}
        cells = [fmt_delta(Cell.delta_of(by.get(c))) for c in cols]
        held, general = Cell.delta_of(e.get("heldout")), Cell.delta_of(e.get("general_loss"))
        lines.append(f"| {e['name']} | " + " | ".join(cells) + f" | {fmt_delta(held, 3, True)} | "
                     f"{fmt_delta(general, 3, True)} | {e['reading']} |")
    return "\n".join(lines)


def gains_markdown(task: str, gains: list[dict]) -> str:
    """S(b) (with its interval over prompts) next to the realised gains of each split, with intervals."""
    modes = [m for m in (gains[0].get("modes") or []) if any(g.get(f"shallow_vs_full_{m}") is not None
                                                              or g.get(f"shallow_vs_deep_{m}") is not None
                                                              for g in gains)] if gains else []
    letters = " / ".join(MODE_LETTER.get(m, m) for m in modes)
    lines = [f"**{task}** — S(b) from the trace [95% interval over prompts, trace.sb_aggregate] next to the realised gain "
             f"of train_shallow (average, percentage points, {letters}) [95% interval]", "",
             f"| split r | b | S(b) [95%] | shallow−full {letters} | shallow(r)−deep(1−r) {letters} | held-out loss "
             "shallow−full | held-out loss shallow(r)−deep(1−r) |", "|---|---|---|---|---|---|---|"]

    def pick(g, key):
        return Cell.delta_of(g, key)

    for g in gains:
        s_b = fmt_s(g["S_b"]) + (f" [{g['S_b_lo']:.3f}, {g['S_b_hi']:.3f}]" if g.get("S_b_lo") is not None else "")
        sf = " / ".join(fmt_delta(pick(g, f"shallow_vs_full_{m}")) for m in modes)
        sd = " / ".join(fmt_delta(pick(g, f"shallow_vs_deep_{m}")) for m in modes)
        lines.append(f"| {g['split']:g} | {'-' if g['b'] is None else g['b']} | {s_b} | {sf} | {sd} | "
                     f"{fmt_delta(pick(g, 'shallow_vs_full_heldout'), 3, True)} | "
                     f"{fmt_delta(pick(g, 'shallow_vs_deep_heldout'), 3, True)} |")
    return "\n".join(lines)


def verdict_markdown(summary) -> list[str]:
    """The verdict block: the primary comparison per row (adjusted), the best or "no clear best", how the
    marks are controlled and what every interval covers, and whether S(b) could be put to a test."""
    summary = as_summary(summary)
    v = summary.verdict
    md = ["**Verdict**", ""]
    line = checkpoint_line(summary)
    if line:
        md.append(line)
    prim = [c for c in v.get("comparisons", []) if c.get("primary")]
    if prim:
        what = "strategies (run-to-run noise inside)" if v.get("claim") == STRATEGY else "checkpoints"
        md.append(f"Primary comparison ({v.get('primary')}) against full, adjusted - {what}:")
        for c in prim:
            word = {1: "▲ better", -1: "▼ worse", 0: "no clear change", None: "no test"}[c["sign"]]
            if c["task"] == HELDOUT and c["sign"]:
                word = "▲ lower loss (better)" if c["sign"] < 0 else "▼ higher loss (worse)"
            pa = "-" if c.get("p_adj") is None else f"{c['p_adj']:.3g}"
            md.append(f"- {c['a']}: Δ {c['delta']:+.3f}, p = {fmt_p(c.get('p'))}, adjusted p = {pa}: {word}")
    else:
        md.append(f"Primary comparison: {v.get('primary') or 'none declared'} - not evaluated in this sweep; "
                  "every comparison is in one Holm family.")
    b = v.get("best")
    if b:
        of = "" if b.get("claim") == STRATEGY else " (this run of each plan)"
        md.append(f"Best on {b['metric']}{of}: **{b['best']}** (beats every other row, Bonferroni over {b['pairs']} "
                  f"pairs, largest p = {fmt_p(b['p'])})" if b["best"] else
                  f"Best on {b['metric']}{of}: no clear best - the top row {b['top']} does not beat the runner-up "
                  f"{b['runner_up']} (or another row) at {v.get('alpha', 0.05):g} / {b['pairs']} pairs "
                  f"(largest pairwise p = {fmt_p(b['p'])})")
    md += split_words(summary)
    for task, gains in summary.split_gains.items():
        md += [f"Shallow vs deep ({task}), r = {g['split']:g}: {g['deep_missing']}." for g in gains
               if g.get("deep_missing")]
    for task, s in summary.sb_vs_gain.items():
        md.append(f"S(b) against the realised gain ({task}, {s['gain']}): {s['words']}.")
    md.append("")
    md += [f"- {line}" for line in v.get("legend", [])]
    return md


NO_GENERAL = ("No general task and no general probe ran, so forgetting is not measured here: set "
              "sweep.general_docs (the general-text loss, docs/analysis.md) or add eval.tasks=[wordnet_mc,mmlu].")


def not_general(summary) -> bool:
    """True when the sweep declared general tasks but none of them ran and it has no general probe either."""
    summary = as_summary(summary)
    general = summary.roles.get("general", [])
    probe = any(m.get("axis") == "forget" for m in summary.base.get("metrics", []))
    return bool(general) and not probe and not any(t in summary.tables for t in general)


def split_words(summary) -> list[str]:
    """The split S(b) favours among the sweep's splits, and the ones the trace cannot tell from it."""
    summary = as_summary(summary)
    largest = largest_s_b(summary)
    if largest is None:
        return []
    top, same, told = largest
    gains = next(iter(summary.split_gains.values()), [])
    if sum(g.get("S_b") is not None for g in gains) < 2:  # one split: nothing to single out (issue 50)
        return []
    if not told:
        return [f"Largest S(b) among the sweep's splits: r = {top:g} (argmax of point estimates; the trace gave no "
                "set of splits indistinguishable from it)."]
    tail = "the data single it out" if same == [top] else \
        "not distinguishable from it: r = " + ", ".join(f"{r:g}" for r in same)
    return [f"Largest S(b) among the sweep's splits: r = {top:g}; {tail} (one-sided 95% bound over prompts)."]


def oriented_mark(cell: dict, metric: dict) -> dict:
    """The cell with its mark as better (▲) / worse (▼) than base: the family decides on row - base, so a loss
    (lower is better) flips."""
    if not cell.get("sign"):
        return cell
    return {**cell, "sign": cell["sign"] if metric["higher_is_better"] else -cell["sign"]}


def base_markdown(summary) -> str:
    """summary.md's table of gain and forgetting against base: per row, every metric (row - base oriented: gain >
    0 better, forgetting > 0 worse) with its 95% interval and the adjusted mark, the Pareto front marked ★."""
    base = as_summary(summary).base
    metrics, rows = base.get("metrics") or [], base.get("rows") or []
    if not metrics or not rows:
        return ""
    front = set(base.get("pareto") or [])
    lines = ["**Gain and forgetting against base** (the untrained model) — gain > 0 = better than base, forgetting "
             "> 0 = worse; [95% interval]; ▲ / ▼ = better / worse than base after the verdict's multiplicity "
             "control; ★ = on the Pareto front of the first gain and first forgetting column (point estimates)", "",
             "| row | " + " | ".join(f"{m['axis'].replace('forget', 'forgetting')}: {m['label']}" for m in metrics)
             + " |", "|" + "---|" * (len(metrics) + 1)]
    for r in rows:
        cells = []
        for m, c in zip(metrics, r["cells"]):
            shown = Cell(delta=c.get("shown"), lo=c.get("shown_lo"), hi=c.get("shown_hi"),
                         sign=oriented_mark(c, m).get("sign"))
            cells.append(fmt_delta(shown, 3 if m["mode"] is None else 2))
        star = " ★" if r["name"] in front else ""
        lines.append(f"| {r['name']}{star} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(summary) -> str:
    """summary.md: the verdict and how to read it, domain versus general, then per task the table and the
    S(b) gains. ``summary``: a :class:`~raycpt.report.sweep.model.Summary` or its JSON form."""
    summary = as_summary(summary)
    md = [LEGEND[0].upper() + LEGEND[1:] + ".", ""]
    if summary.verdict:
        md += verdict_markdown(summary) + [""]
    if base_markdown(summary):
        md += [base_markdown(summary), ""]
    if summary.domain_general:
        md += [domain_general_markdown(summary.domain_general), ""]
    missing = {role: [t for t in summary.roles.get(role, []) if t not in summary.tables]
               for role in ("domain", "general")}
    if any(missing.values()):
        md += ["Not evaluated in this sweep: " + "; ".join(f"eval.{role} {', '.join(ts)}"
                                                          for role, ts in missing.items() if ts) + ".", ""]
    if not_general(summary):
        md += [NO_GENERAL, ""]
    for task, rows in summary.tables.items():
        md += [table_markdown(task, rows), ""]
        if table_markdown(task, rows, continuous=True):
            md += [table_markdown(task, rows, continuous=True), ""]
        if summary.split_gains.get(task):
            md += [gains_markdown(task, summary.split_gains[task]), ""]
    return "\n".join(md)
