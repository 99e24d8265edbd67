"""Issue 46 item 3: the typed summary changes no byte. Each fabricated sweep of :mod:`sweep_golden` is summarised by
today's code and its summary.json, summary.md, deltas.csv, a task's CSV table and the terminal text (the end of
``raycpt sweep`` and ``runs show`` overview and ``--section all``) are compared with the files the code before the
typed summary (commit 58e40b8) wrote into ``tests/data/sweep_golden`` - the reference is the old code, not the new."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raycpt.report.sweep.model import Row, Summary
from raycpt.report.sweep.summary import write_summary
from sweep_golden import FILES, GOLDEN, SCENARIOS, TERMINAL, inside, write_scenario


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def written(request, tmp_path_factory):
    return request.param, write_scenario(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("name", FILES + (TERMINAL,))
def test_files_and_terminal_text_equal_the_old_codes_byte_for_byte(written, name):
    scenario, texts = written
    golden = (GOLDEN / scenario / name).read_text(encoding="utf-8")
    assert texts[name] == golden, f"{scenario}/{name} differs from the golden file"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_old_summary_json_reads_back_typed_and_writes_the_same_bytes(scenario):
    text = (GOLDEN / scenario / "summary.json").read_text(encoding="utf-8")
    typed = Summary.from_json(json.loads(text))
    assert json.dumps(typed.to_json(), indent=2, ensure_ascii=False, default=str) == text
    assert all(isinstance(r, Row) for rows in typed.tables.values() for r in rows)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_old_summary_json_equals_the_typed_summary_built_now(scenario, tmp_path):
    trials, trace, opts = SCENARIOS[scenario]()
    with inside(tmp_path):
        built = write_summary(Path("RUN"), trials, trace, 30, domain=opts["domain"], general=opts["general"],
                              report=opts["report"])
    built.pop("files")  # the list of what was written: not in summary.json
    old = Summary.from_json(json.loads((GOLDEN / scenario / "summary.json").read_text(encoding="utf-8")))
    assert Summary.from_json(built) == old
