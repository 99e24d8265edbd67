"""The columns of a task's main table, declared once (issue 46 item 3): what each column holds and how each view
writes it. The Markdown table (:func:`raycpt.report.sweep.views.markdown.table_markdown`), the rich table of
``runs show`` (:func:`raycpt.report.sweep.views.rich.rich_table`), the terminal's compact table
(:func:`raycpt.report.sweep.views.terminal.compact_table`) and the flat records of ``deltas.csv`` / the MLflow table
(:func:`raycpt.report.sweep.summary.delta_records`) take their columns from :data:`COLUMNS` - a view shows the columns
that name it, in this order, under the heading they give it.

A column reads a :class:`Place`: the task, the row (:class:`~raycpt.report.sweep.model.Row`) and, for a per-cell
column, the category, the mode and the cell (:class:`~raycpt.report.sweep.model.Cell`). ``per_category`` marks the
column that stands for one column per category in the Markdown and rich tables (their cells: value over Δ)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from raycpt.report.sweep.model import Cell, Row
from raycpt.report.sweep.views.format import colour, fmt, fmt_delta, fmt_pm, fmt_s, fmt_value, mark_of

CSV, MARKDOWN, RICH, TERMINAL = "csv", "markdown", "rich", "terminal"
VERDICT_WORD = {1: "better", -1: "worse", 0: "no clear change"}
"""The CSV's word for a cell's mark after multiplicity control (an untested cell: empty)."""


@dataclass(frozen=True)
class Place:
    """Where a column reads: the task, the row, and for a per-cell column its category, mode and cell (a Markdown
    category column: the category and the ``modes`` the table shows)."""

    task: str
    row: Row
    category: Optional[str] = None
    mode: Optional[str] = None
    cell: Optional[Cell] = None
    modes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    """One column: ``name`` (the CSV field and how the views name it), ``headers`` (per view its heading; a view not
    named does not show the column), ``value`` (what it holds at a :class:`Place`: the CSV writes it as it is),
    ``texts`` (per view how it writes the column; ``str`` of the value otherwise), ``per_cell`` (one value per
    (category, mode) cell: the CSV's long form), ``per_category`` (stands for one column per category in the
    Markdown and rich tables), ``loss`` (a loss column: shown when some row has one)."""

    name: str
    headers: dict[str, str]
    value: Callable[[Place], Any]
    texts: dict[str, Callable[[Place], str]] = field(default_factory=dict)
    per_cell: bool = False
    per_category: bool = False
    loss: bool = False

    def header(self, view: str) -> str:
        return self.headers[view]

    def text(self, view: str, at: Place) -> str:
        """How ``view`` writes the column at ``at`` (``str`` of the value unless the column says otherwise)."""
        how = self.texts.get(view)
        return how(at) if how else str(self.value(at))


def _cell_field(attr: str, default=None) -> Callable[[Place], Any]:
    def read(at: Place):
        v = getattr(at.cell, attr)
        return default if default is not None and not v else v
    return read


def _markdown_cells(at: Place) -> str:
    """A Markdown category cell: ``G / L (ΔG [lo, hi] / ΔL [lo, hi])`` over the table's modes, ``-`` without any."""
    xs = [x for x in (at.row.cell(at.category, m) for m in at.modes) if x is not None]
    txt = " / ".join(fmt_value(x) for x in xs)
    deltas = [x for x in xs if x.delta is not None]
    if deltas:
        txt += " (" + " / ".join(fmt_delta(x) for x in deltas) + ")"
    return txt or "-"


def _rich_cell(at: Place) -> str:
    """A rich category cell of one mode: the value (best: ``*`` and bold) over its Δ, coloured by its mark."""
    x = at.row.cell(at.category, at.mode)
    if x is None:
        return "-"
    txt = fmt(x.value) + ("*" if x.best else " ")
    txt = f"[bold]{txt}[/bold]" if x.best else txt
    if x.delta is not None:
        col = colour(x.sign)
        txt += f"\n[{col}]{fmt(x.delta, sign=True)}{mark_of(x.sign) or '  '}[/{col}]"
    return txt


def _loss(at_value: Callable[[Place], Any]) -> dict[str, Callable[[Place], str]]:
    return {MARKDOWN: lambda at: fmt_s(at_value(at))}


COLUMNS: tuple[Column, ...] = (
    Column("task", {CSV: "task"}, lambda at: at.task),
    Column("model", {CSV: "model", MARKDOWN: "model", RICH: "trial", TERMINAL: "row"}, lambda at: at.row.name),
    Column("strategy", {CSV: "strategy"}, lambda at: at.row.strategy),
    Column("split", {CSV: "split"}, lambda at: at.row.split),
    Column("seeds", {CSV: "seeds", MARKDOWN: "seeds"}, lambda at: at.row.runs),
    Column("cells", {MARKDOWN: "", RICH: ""}, lambda at: at.row.cells, {MARKDOWN: _markdown_cells, RICH: _rich_cell},
           per_category=True),
    Column("category", {CSV: "category"}, lambda at: at.category, per_cell=True),
    Column("mode", {CSV: "mode"}, lambda at: at.mode, per_cell=True),
    Column("accuracy", {CSV: "accuracy"}, _cell_field("value"), per_cell=True),
    Column("accuracy_lo", {CSV: "accuracy_lo"}, _cell_field("value_lo"), per_cell=True),
    Column("accuracy_hi", {CSV: "accuracy_hi"}, _cell_field("value_hi"), per_cell=True),
    Column("delta_vs_full", {CSV: "delta_vs_full"}, _cell_field("delta"), per_cell=True),
    Column("delta_lo", {CSV: "delta_lo"}, _cell_field("lo"), per_cell=True),
    Column("delta_hi", {CSV: "delta_hi"}, _cell_field("hi"), per_cell=True),
    Column("verdict", {CSV: "verdict"}, lambda at: VERDICT_WORD.get(at.cell.sign, ""), per_cell=True),
    Column("interval", {CSV: "interval"}, _cell_field("method", ""), per_cell=True),
    Column("best", {CSV: "best"}, _cell_field("best"), per_cell=True),
    Column("p", {CSV: "p"}, _cell_field("p"), per_cell=True),
    Column("p_adjusted", {CSV: "p_adjusted"}, _cell_field("p_adj"), per_cell=True),
    Column("role", {CSV: "role"}, _cell_field("role", "exploratory"), per_cell=True),
    Column("final_loss", {MARKDOWN: "final loss"}, lambda at: at.row.final_loss, _loss(lambda at: at.row.final_loss),
           loss=True),
    Column("heldout_loss", {MARKDOWN: "held-out loss"}, lambda at: at.row.heldout_loss,
           _loss(lambda at: at.row.heldout_loss), loss=True),
    Column("general_loss", {MARKDOWN: "general loss"}, lambda at: at.row.general_loss,
           _loss(lambda at: at.row.general_loss), loss=True),
    Column("heldout_delta", {MARKDOWN: "Δ held-out", TERMINAL: "Δ vs full"}, lambda at: at.row.heldout_delta,
           {MARKDOWN: lambda at: fmt_delta(at.row.heldout_delta, 3, lower_is_better=True),
            TERMINAL: lambda at: fmt_pm(at.row.heldout_delta, 3, lower_is_better=True)}),
)
"""Every column of the main per-task table, in order."""


def columns(view: str) -> list[Column]:
    """The columns ``view`` shows, in order."""
    return [c for c in COLUMNS if view in c.headers]


def by_name(name: str) -> Column:
    return next(c for c in COLUMNS if c.name == name)


def loss_columns(rows) -> list[Column]:
    """The loss columns some row has a value in (the last step's training loss, the held-out loss, the general
    probe's loss)."""
    return [c for c in COLUMNS if c.loss and any(c.value(Place("", r)) is not None for r in rows)]


def records(task: str, rows) -> list[dict]:
    """Every cell of a task's rows as one flat record (:data:`CSV` columns): ``deltas.csv``, the tables' CSV and the
    MLflow parent table."""
    cols = columns(CSV)
    return [{c.name: c.value(Place(task, r, cat, m, x)) for c in cols}
            for r in rows for cat, modes in r.cells.items() for m, x in modes.items()]
