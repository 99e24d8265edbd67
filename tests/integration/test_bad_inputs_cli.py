"""Bad inputs through the real `raycpt` console script: exit 2, exactly one stderr line, no traceback.

The cases are `scripts/bad_inputs.py`'s (the table of the closing note); the default suite runs the
ones the tryout found broken, the slow mark runs all of them."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bad_inputs", ROOT / "scripts" / "bad_inputs.py")
bad_inputs = importlib.util.module_from_spec(_spec)
sys.modules["bad_inputs"] = bad_inputs  # dataclasses look their module up there
_spec.loader.exec_module(bad_inputs)

TRYOUT = ["binary config", "config is a directory", "ranking num_layers='many'", "ranking score='high'",
          "plan.ranking_file=/bin/ls", "ranking file is a directory", "compare X X", "plan.name=blocks plan.pattern=",
          "train.lr=inf", "train.lr=1e309", "name with path separators", "hybrid build --out non-empty",
          "ui on a busy port", "sweep.seeds=[]", "duplicate seeds",
          "cloze on cmmlu", "data_dir missing a subject"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    f = bad_inputs.fixtures(tmp_path_factory.mktemp("bad"))
    yield f, {c.label: c for c in bad_inputs.cases(f)}
    f["busy"].close()


def _env():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.mark.parametrize("label", TRYOUT)
def test_tryout_bad_input_is_one_line(table, label):
    f, cases = table
    r = bad_inputs.run_case(cases[label], _env())
    assert r["ok"], r
    if label == "plan.name=blocks plan.pattern=":
        assert "None" not in r["line"]
    if label == "hybrid build --out non-empty":
        assert (f["tmp"] / "out" / "new_shallow" / "my_notes.txt").read_text() == "the user's file"


@pytest.mark.slow
def test_every_bad_input_is_one_line(table):
    _, cases = table
    rows = [bad_inputs.run_case(c, _env()) for c in cases.values() if c.owner == "19"]
    assert [r for r in rows if not r["ok"]] == []
