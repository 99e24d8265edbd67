"""Sweep summary: the paper's Table-1 layout with deltas against ``full``, each with a 95% interval, the
domain benchmark next to the general one, S(b) (with its interval) next to the realised gain of each
split, a bar chart per task, and the loss curves overlaid.

A cell is marked better / worse only by the verdict (:mod:`raycpt.report.sweep.verdict`, over
:mod:`raycpt.report.sweep.family`): the comparison's p-value after the sweep's multiplicity control, never its
interval alone. The parts: :mod:`~raycpt.report.sweep.outcomes` (per-question data from the trials' files),
:mod:`~raycpt.report.sweep.cells` (tables, intervals, gains), :mod:`~raycpt.report.sweep.domain`,
:mod:`~raycpt.report.sweep.verdict`, and the renderers :mod:`~raycpt.report.sweep.views.markdown`,
:mod:`~raycpt.report.sweep.views.rich`, :mod:`~raycpt.report.sweep.views.plots`.

Here: ``build_summary`` (pure: unit-tested on fabricated per-question records) puts the numbers together;
``write_summary`` writes CSV / Markdown / JSON / PNG files (the sweep job logs them to its MLflow run:
:func:`raycpt.jobs.sweep.log_summary`; no report module talks to MLflow).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional, Sequence

from raycpt.decide import horizon_line, read_record
from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.report.sweep import family
from raycpt.report.sweep.domain import domain_general
from raycpt.report.sweep.model import Summary, as_rows
from raycpt.report.sweep.views.columns import records
from raycpt.report.sweep.views.markdown import summary_markdown
from raycpt.report.sweep.outcomes import load_outcomes
from raycpt.report.sweep.base import against_base
from raycpt.report.sweep.views.plots import TRADEOFF_PNG, plot_bars, plot_heldout, plot_losses, plot_tradeoff
from raycpt.report.sweep.cells import split_gains, summary_table
from raycpt.report.sweep.verdict import apply_verdict, primary_best, sb_against_gain
from raycpt.stats import DEFAULT_RESAMPLES

DEFAULT_REPORT = {"primary": None, "adjust": "holm", "alpha": 0.05}  # build_summary without a config: no primary


def delta_records(tables: dict) -> list[dict]:
    """Every cell of every task as one flat record (the MLflow parent table and ``deltas.csv``; its columns:
    :data:`raycpt.report.sweep.views.columns.COLUMNS`)."""
    return [rec for task, rows in tables.items() for rec in records(task, as_rows(rows))]


def _csv(records: list[dict]) -> str:
    buf = io.StringIO()
    if records:
        w = csv.DictWriter(buf, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)
    return buf.getvalue()


def report_options(cfg, decisions: Path) -> dict:
    """What build_summary needs from an experiment config: ``report.*``, how the plans treat the embeddings, final
    norm and head (stated in the legend), and the horizon line of ``raycpt decide``'s record in ``decisions`` (the
    run root's folder of them)."""
    p = cfg.plan
    parts = [name for name, on in (("embeddings", p.train_embeddings), ("final norm", p.train_final_norm),
                                   ("head", p.train_head)) if on]
    treat = ("train " + ", ".join(parts)) if parts else "frozen"
    footing = (f"equal footing (sweep.equal_footing): every row, full included, trains only its decoder layers; "
               f"embeddings, final norm and head {treat} in every row") if cfg.sweep.equal_footing else (
        "NOT equal footing: full also trains the embeddings, final norm and head, the other rows "
        f"{'train ' + ', '.join(parts) if parts else 'freeze them'}; a delta against full mixes the layer choice "
        "with training those (sweep.equal_footing=true compares layers alone)")
    if cfg.sweep.budget is not None and cfg.sweep.equal_footing:
        footing += ("; except where a method's authors train them: LISA's rows train the embeddings, final norm "
                    "and head at every step, Spectrum's the embeddings and head (both inside the budget's count)")
    return {"primary": cfg.report.primary, "adjust": cfg.report.adjust, "alpha": cfg.report.alpha, "footing": footing,
            "horizon": horizon_line(cfg.train.max_steps, read_record(decisions, cfg, cfg.train.max_steps))}


def build_summary(trials: list[dict], trace: Optional[dict], domain: Sequence[str] = ("wordnet_mc",),
                  general: Sequence[str] = ("mmlu",), resamples: int = DEFAULT_RESAMPLES,
                  report: Optional[dict] = None, num_layers: Optional[int] = None) -> dict:
    """The summary's numbers (pure): per-task tables, split gains, the verdict (adjusted marks, primary,
    best), domain versus general, S(b) against the gain, flat records. ``trials`` carry their per-question
    ``outcomes`` and held-out block losses (:func:`load_outcomes`) for tests and intervals; without them the
    deltas are shown without either. ``report``: ``{"primary", "adjust", "alpha"}`` (``ReportConfig``); ``num_layers``: the model's depth, which
    pairs train_shallow at r with train_deep at 1 - r at equal layer counts (without it: equal trainable counts)."""
    report = {**DEFAULT_REPORT, **(report or {}),
              "untuned": sorted({t.get("group") or t["name"] for t in trials if t.get("untuned")})}  # issue 47: no claims on them
    tables = summary_table(trials, resamples=resamples)
    split_scores = (trace or {}).get("split_scores", {})
    split_ci = (trace or {}).get("split_intervals", {})
    gains = {task: split_gains(trials, split_scores, task, split_intervals=split_ci, resamples=resamples,
                               num_layers=num_layers) for task in tables}
    tasks = list(domain) + [t for t in general if t not in domain]
    base = against_base(trials, domain, general, resamples)
    decision = apply_verdict(tables, gains, tasks, report, base_rows=base["rows"])
    decision["best"] = primary_best(trials, tables, report, resamples=resamples)
    decision["untuned"] = report["untuned"]  # the recommendation leaves them out too (views/advice.py)
    primary = family.parse_primary(report.get("primary"))
    mode = "logit" if primary is None else primary["mode"]  # None: the held-out loss
    sb = {task: sb_against_gain(g, mode, decision["alpha"]) for task, g in gains.items()
          if any(x.get("S_b") is not None for x in g)}
    methods = sorted({x.get("method") for rows in tables.values() for r in rows
                      for x in [c for ms in r["cells"].values() for c in ms.values()] + [r.get("heldout_delta") or {}]
                      if x.get("method")})
    decision["legend"] = family.legend(methods, report.get("primary") if decision["primary_found"] else
                                        (f"{report.get('primary')} (not evaluated in this sweep)"
                                         if report.get("primary") else None),
                                        decision["adjust"], decision["alpha"], decision["family_size"],
                                        decision["base_size"])
    if report["untuned"]:
        decision["legend"].append("Untuned (its learning rate is at the grid's edge after every extension, so its "
                                  "best rate may lie outside what ran): " + ", ".join(report["untuned"])
                                  + " - shown, never marked, never best.")
    if decision.get("run_model"):
        decision["legend"].append(f"Run-to-run noise model: {decision['run_model']} - each plan's own run variance.")
    if report.get("footing"):
        decision["legend"].append("Plans: " + report["footing"] + ".")
    return {"tables": tables, "split_gains": gains, "domain_general": domain_general(tables, domain, general),
            "base": base,
            "records": delta_records(tables), "roles": {"domain": list(domain), "general": list(general)},
            "verdict": decision, "sb_vs_gain": sb, "split_like_best": (trace or {}).get("split_like_best") or {},
            "horizon": report.get("horizon")}


def summarise(trials: list[dict], trace: Optional[dict], domain: Sequence[str] = ("wordnet_mc",),
              general: Sequence[str] = ("mmlu",), resamples: int = DEFAULT_RESAMPLES, report: Optional[dict] = None,
              num_layers: Optional[int] = None) -> Summary:
    """:func:`build_summary` typed (:class:`~raycpt.report.sweep.model.Summary`): what the writers and views read."""
    return Summary.from_json(build_summary(trials, trace, domain, general, resamples, report, num_layers))


DROP = ("losses", "outcomes", "heldout_blocks", "heldout_weights", "heldout_docs", "general_blocks", "general_weights",
        "general_docs")


def write_summary(run_dir: Path, trials: list[dict], trace: Optional[dict], num_layers: int,
                  domain: Sequence[str] = ("wordnet_mc",), general: Sequence[str] = ("mmlu",), report=None) -> dict:
    """Write the summary files into ``run_dir/summary`` from the typed summary (:func:`summarise`); returns what
    summary.json holds, with ``"files"`` listing them (the sweep job logs them to its run:
    :func:`raycpt.jobs.sweep.log_summary`)."""
    out = Path(run_dir) / "summary"
    out.mkdir(parents=True, exist_ok=True)
    full = [load_outcomes(t) for t in trials]
    summary = summarise(full, trace, domain, general, report=report, num_layers=num_layers)
    files = [atomic_write_text(out / "deltas.csv", _csv(summary.records))]
    for task, rows in summary.tables.items():
        files.append(atomic_write_text(out / f"table_{task}.csv", _csv(records(task, rows))))
        files.append(plot_bars(out / f"scores_{task}.png", task, rows))
    files.append(plot_losses(out / "loss_curves.png", trials))
    if any(t.get("heldout_loss") is not None for t in trials):
        files.append(plot_heldout(out / "heldout_loss.png", trials))
    if summary.base.get("axes"):
        files.append(plot_tradeoff(out / TRADEOFF_PNG, summary.base))
    files.append(atomic_write_text(out / "summary.md", summary_markdown(summary)))
    summary = summary.written(num_layers=num_layers, recommended_split=(trace or {}).get("recommended_split"),
                              trials=[{k: v for k, v in t.items() if k not in DROP} for t in trials])
    files.append(atomic_write_json(out / "summary.json", summary.to_json()))
    return {**summary.to_json(), "files": [str(f) for f in files]}
