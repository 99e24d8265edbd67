"""``raycpt eval`` bad inputs: one line on stderr, exit code 2, nothing started (no run folder, no MLflow store)."""

from __future__ import annotations

import json

import pytest

from raycpt import evaluate as E
from raycpt.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture
def root(tmp_path):
    return tmp_path / "runs"


def _assert_nothing_started(root):
    assert not root.exists() or not any(root.iterdir())


def test_unknown_task(capsys, root):
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--tasks", "mmlu_pro")
    assert code == 2 and len(err.splitlines()) == 1
    assert "unknown task 'mmlu_pro'" in err and "wordnet_mc" in err
    _assert_nothing_started(root)


def test_missing_checkpoint(capsys, root, tmp_path):
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--checkpoints", f"{tmp_path}/ckpt-missing")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: checkpoint not found:") and "ckpt-missing" in err
    _assert_nothing_started(root)


def test_checkpoint_folder_without_model(capsys, root, tmp_path):
    (tmp_path / "empty").mkdir()
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--checkpoints", str(tmp_path / "empty"))
    assert code == 2 and "holds no model" in err and len(err.splitlines()) == 1


def test_malformed_question_file(capsys, root, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "A",
                               "category": "STEM"}) + "\n{oops\n")
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--tasks", str(bad))
    assert code == 2 and len(err.splitlines()) == 1
    assert "malformed question file" in err and "line 2 is not JSON" in err
    _assert_nothing_started(root)


def test_hub_task_offline(capsys, root, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(E, "_hub_cached", lambda spec: False)
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--tasks", "wordnet_mc,cmmlu")
    assert code == 2 and len(err.splitlines()) == 1
    assert "'cmmlu' needs the Hugging Face hub dataset haonan-li/cmmlu" in err and "'wordnet_mc'" in err
    _assert_nothing_started(root)


def test_bad_mode(capsys, root):
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--modes", "logits")
    assert code == 2 and "eval.modes" in err and "logit" in err and len(err.splitlines()) == 1


def test_empty_checkpoints(capsys, root):
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--checkpoints", ",")
    assert code == 2 and "no checkpoint given" in err
