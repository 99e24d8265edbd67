"""Issue 46 item 3: the typed cells and rows of the sweep summary read a summary.json cell and row as written by
hand here and write back the same keys in the same order with the same values."""

from __future__ import annotations

import json

from raycpt.report.sweep.model import Cell, Row, Summary, as_rows, as_summary

# a cell as the verdict leaves it (keys in the order the summary builds them) and a baseline's cell (fewer keys)
MARKED = {"value": 56.25, "value_lo": None, "value_hi": None, "seeds": 1, "delta": 13.75, "lo": -2.6, "hi": 29.4,
          "sign": 0, "method": "exact McNemar + score interval", "n": 80, "p": 0.11, "best": False, "raw_sign": None,
          "p_adj": 0.44, "role": "secondary", "claim": "checkpoint", "family": "vs full"}
PLAIN = {"value": 42.5, "value_lo": 40.0, "value_hi": 45.0, "seeds": 2, "delta": None, "lo": None, "hi": None,
         "sign": None, "method": None, "n": 0, "p": None, "best": True}


def test_a_cell_reads_its_fields_and_writes_the_same_keys_in_order():
    c = Cell.from_json(MARKED)
    assert (c.value, c.delta, c.lo, c.hi, c.sign, c.p, c.p_adj, c.role) == (56.25, 13.75, -2.6, 29.4, 0, 0.11, 0.44,
                                                                           "secondary")
    assert c.interval == (-2.6, 29.4) and c.value_interval is None and c.claim == "checkpoint"
    assert json.dumps(c.to_json()) == json.dumps(MARKED)
    p = Cell.from_json(PLAIN)
    assert p.value_interval == (40.0, 45.0) and p.interval is None and p.p_adj is None and p.best is True
    assert list(p.to_json()) == list(PLAIN) and "p_adj" not in p.to_json()  # an absent key stays absent
    odd = {"delta": 1.0, "value": 2.0}  # another order comes back in that order
    assert list(Cell.from_json(odd).to_json()) == ["delta", "value"]
    assert Cell.from_json(MARKED).unmarked().sign is None and Cell.from_json(MARKED).sign == 0


def test_an_unknown_key_is_kept_and_written_back_in_its_place():
    """A summary.json another version wrote (a key no field names): read as before, nothing dropped."""
    odd = {"value": 1.0, "surprise": [1, 2], "delta": None}
    c = Cell.from_json(odd)
    assert c.extra == {"surprise": [1, 2]} and c.value == 1.0
    assert json.dumps(c.to_json()) == json.dumps(odd)
    row = {"name": "x", "old_field": 3, "cells": {"average": {"logit": odd}}}
    assert json.dumps(Row.from_json(row).to_json()) == json.dumps(row)
    summary = {"tables": {"wn": [row]}, "surprise": {"a": 1}, "horizon": "h"}
    s = Summary.from_json(summary)
    assert s.extra == {"surprise": {"a": 1}} and s.horizon == "h"
    assert json.dumps(s.to_json()) == json.dumps(summary)


def test_a_row_reads_its_cells_and_deltas_typed_and_writes_back_its_json():
    row = {"name": "train_shallow-r0.5", "strategy": "train_shallow", "split": 0.5, "seeds": [0, 1],
           "cells": {"stem": {"logit": MARKED}, "average": {"logit": PLAIN, "cloze": MARKED}},
           "final_loss": 2.6, "heldout_loss": 3.5, "heldout_delta": {"delta": -0.1, "lo": -0.2, "hi": 0.0, "sign": -1},
           "general_loss": None, "general_delta": None, "heldout_best": True}
    r = Row.from_json(row)
    assert r.seeds == (0, 1) and r.runs == 2 and r.heldout_best is True and r.general_delta is None
    assert r.cell("average", "cloze").p_adj == 0.44 and r.cell("average", "generate") is None
    assert r.heldout_delta.sign == -1 and r.heldout_delta.interval == (-0.2, 0.0)
    assert list(r.cells) == ["stem", "average"] and list(r.cells["average"]) == ["logit", "cloze"]
    assert json.dumps(r.to_json()) == json.dumps(row)
    assert Row.from_json({**row, "seeds": []}).runs == 1  # a row that names no run is one run
    assert as_rows([row, r]) == (r, r)
    assert as_summary({"tables": {"wn": [row]}}).first_rows() == (r,)


def test_one_column_table_gives_each_view_its_columns_and_the_csv_its_record():
    from raycpt.report.sweep.views.columns import CSV, MARKDOWN, RICH, TERMINAL, columns, records

    # deltas.csv's header as the code before the column table wrote it (tests/data/sweep_golden/*/deltas.csv)
    assert [c.name for c in columns(CSV)] == ("task,model,strategy,split,seeds,category,mode,accuracy,accuracy_lo,"
                                              "accuracy_hi,delta_vs_full,delta_lo,delta_hi,verdict,interval,best,p,"
                                              "p_adjusted,role").split(",")
    assert [c.header(MARKDOWN) for c in columns(MARKDOWN) if not c.per_category] == \
        ["model", "seeds", "final loss", "held-out loss", "general loss", "Δ held-out"]
    assert [c.header(RICH) for c in columns(RICH) if not c.per_category] == ["trial"]
    assert [c.header(TERMINAL) for c in columns(TERMINAL)] == ["row", "Δ vs full"]
    row = Row.from_json({"name": "r", "strategy": "train_deep", "split": 0.5, "seeds": [3, 4],
                         "cells": {"average": {"logit": MARKED, "cloze": PLAIN}}})
    marked, plain = records("wn", [row])
    assert marked == {"task": "wn", "model": "r", "strategy": "train_deep", "split": 0.5, "seeds": 2,
                      "category": "average", "mode": "logit", "accuracy": 56.25, "accuracy_lo": None,
                      "accuracy_hi": None, "delta_vs_full": 13.75, "delta_lo": -2.6, "delta_hi": 29.4,
                      "verdict": "no clear change", "interval": "exact McNemar + score interval", "best": False,
                      "p": 0.11, "p_adjusted": 0.44, "role": "secondary"}
    # no mark, no method, no role: empty verdict and interval, the role exploratory
    assert (plain["mode"], plain["verdict"], plain["interval"], plain["role"], plain["best"]) == \
        ("cloze", "", "", "exploratory", True)


def test_written_parts_come_after_the_others_as_a_dict_update_places_them():
    s = Summary.from_json({"tables": {}, "horizon": None, "num_layers": 12})
    w = s.written(num_layers=30, trials=[{"name": "full", "split": (1, 2)}])
    assert list(w.to_json()) == ["tables", "horizon", "num_layers", "trials"]  # num_layers keeps its place
    assert w.num_layers == 30 and w.trials == [{"name": "full", "split": [1, 2]}]  # as summary.json reads back
    assert s.num_layers == 12  # frozen: a new summary, the old one unchanged
