"""Issue 46 item 3: the typed summary changes no byte. Each fabricated sweep of :mod:`sweep_golden` is summarised by
today's code and its summary.json, summary.md, deltas.csv, a task's CSV table and the terminal text (the end of
``raycpt sweep`` and ``runs show`` overview and ``--section all``) are compared with the files the code before the
typed summary (commit 58e40b8) wrote into ``tests/data/sweep_golden`` - the reference is the old code, not the new."""

from __future__ import annotations

import pytest

from sweep_golden import FILES, GOLDEN, SCENARIOS, TERMINAL, write_scenario


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def written(request, tmp_path_factory):
    return request.param, write_scenario(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("name", FILES + (TERMINAL,))
def test_files_and_terminal_text_equal_the_old_codes_byte_for_byte(written, name):
    scenario, texts = written
    golden = (GOLDEN / scenario / name).read_text(encoding="utf-8")
    assert texts[name] == golden, f"{scenario}/{name} differs from the golden file"
