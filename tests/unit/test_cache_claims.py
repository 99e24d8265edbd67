"""Issue 51, rule 1, beyond the base row: every cache the project keeps is a claim about content, checked when it is
read, and the command that reports a cache's state reaches the verdict of the command that uses it.

Each test changes a cached file's content in place (its size kept and its modification time set back with
``os.utime``), or edits an entry, and shows the user of the cache refuses it (one line saying why) and builds it
again, and that the reporting command (``raycpt data info``'s job) says the same before the rebuild."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from raycpt.config import DataConfig, load_config
from raycpt.data.pack import ensure_packed, find_packed
from raycpt.data.store import builds_logged, list_stores, read_store, store_state
from raycpt.data.stream import PackedBlocks
from raycpt.jobs.data import store_info
from raycpt.jobs.job import Options
from tiny import save_tiny


def rewrite_in_place(path: Path, offset: int) -> None:
    """Change one byte of ``path`` at ``offset`` (from the end when negative), keeping its size and setting its
    access and modification times back to what they were: what ``stat`` shows is unchanged but its change time."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    with open(path, "r+b") as f:
        f.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def _corpus(path: Path, n: int = 60) -> None:
    path.write_text("".join(json.dumps({"text": f"document number {i} of the cached corpus"}) + "\n"
                            for i in range(n)))


def _packed(tmp_path):
    tiny = save_tiny(tmp_path / "tiny")
    _corpus(tmp_path / "c.jsonl")
    cfg = DataConfig(corpus=[str(tmp_path / "c.jsonl")], seq_len=16)
    store, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built
    return tiny, cfg, store


def _info_state(tmp_path, tiny) -> str:
    """What ``raycpt data info`` prints as the store's state (its job, with the same config)."""
    cfg = load_config(None, [f"model.ref={tiny}", f"data.corpus=[{tmp_path / 'c.jsonl'}]", "data.seq_len=16",
                             f"tracking.run_root={tmp_path / 'runs'}"])
    _root, rows = store_info(cfg, Options())
    (row,) = rows
    return row[1]


def test_a_packed_shard_changed_in_place_is_refused_and_packed_again(tmp_path, capsys):
    tiny, cfg, store = _packed(tmp_path)
    assert _info_state(tmp_path, tiny) == "corpus: current"
    assert find_packed(cfg, str(tiny), tmp_path / "runs").build_id == store.build_id  # a hit, verified
    good = PackedBlocks(store.path, store.manifest).rows(np.arange(store.num_blocks)).tolist()
    shard = store.path / store.manifest["shards"][0]["file"]
    rewrite_in_place(shard, -1)  # the last token of the last block: same size, same mtime
    state = _info_state(tmp_path, tiny)
    assert state.startswith("store damaged: its shard") and "does not match its sha256" in state
    capsys.readouterr()
    assert find_packed(cfg, str(tiny), tmp_path / "runs") is None  # the user of the cache: the same verdict
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not verify" in err[0] and "does not match its sha256" in err[0], err
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and again.manifest["build"] == 2 and again.build_id != store.build_id
    assert PackedBlocks(again.path, again.manifest).rows(np.arange(again.num_blocks)).tolist() == good
    assert _info_state(tmp_path, tiny) == "corpus: current"
    assert len(builds_logged(store.path.parent, store.key)) == 2


def test_an_edited_manifest_is_refused_and_packed_again(tmp_path, capsys):
    tiny, cfg, store = _packed(tmp_path)
    m = json.loads((store.path / "manifest.json").read_text())
    m["num_blocks"] += 1  # a hand edit: more blocks than the shards hold
    (store.path / "manifest.json").write_text(json.dumps(m, indent=1))
    state = _info_state(tmp_path, tiny)
    assert state == ("store damaged: its manifest does not match its seal (edited after it was packed); packed again "
                     "when next read")
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and again.num_blocks == store.num_blocks and "does not match its seal" in capsys.readouterr().err
    assert store_state(read_store(again.path)) == "corpus: current"


def test_a_manifest_of_the_wrong_shape_or_without_a_seal_is_packed_again(tmp_path, capsys):
    tiny, cfg, store = _packed(tmp_path)
    m = json.loads((store.path / "manifest.json").read_text())
    del m["seal"]  # what an older raycpt wrote
    (store.path / "manifest.json").write_text(json.dumps(m))
    assert "has no seal" in _info_state(tmp_path, tiny)
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and "has no seal" in capsys.readouterr().err
    (store.path / "manifest.json").write_text("[1, 2]")
    assert list_stores(store.path.parent) == []  # not a store: data info lists none, a reader packs again
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and again.num_blocks == store.num_blocks


def test_a_missing_or_resized_shard_is_named(tmp_path):
    tiny, cfg, store = _packed(tmp_path)
    shard = store.path / store.manifest["shards"][0]["file"]
    with open(shard, "ab") as f:
        f.write(b"\0\0")
    assert "bytes, not the" in _info_state(tmp_path, tiny)
    shard.unlink()
    assert "is missing" in _info_state(tmp_path, tiny)
    again, built = ensure_packed(cfg, str(tiny), tmp_path / "runs")
    assert built and _info_state(tmp_path, tiny) == "corpus: current"


# ------------------------------------------------------------------------------------ finished work in a run folder

def test_a_finished_work_memo_changed_in_place_is_refused_and_done_again(tmp_path, capsys):
    """A trial's ``result.json`` (and the trace's ``trace_result.json``) is the memo a resume skips work by: changed in
    place with size and mtime kept, it is refused with one line and the work is done again; the grid's count of
    finished trials and the progress line's ``done`` give the same verdict as the memo before it is redone."""
    from raycpt.jobs.grid import unfinished
    from raycpt.report.progress import trial_state
    from raycpt.runs.folder import memo

    calls = []

    def work():
        calls.append(1)
        return {"name": "t1", "heldout_loss": 5.133}

    path = tmp_path / "t1" / "result.json"
    path.parent.mkdir()
    assert memo(path, work) == {"name": "t1", "heldout_loss": 5.133} and len(calls) == 1
    assert memo(path, work)["heldout_loss"] == 5.133 and len(calls) == 1  # verified: read back, not redone
    assert trial_state(path.parent).phase == "done" and unfinished(tmp_path, ["t1"], {})[1] == []
    text = path.read_text()
    i = text.index("5.133")
    path.write_text(text[:i] + "6.133" + text[i + 5:])  # the hand edit of the issue, same size
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert trial_state(path.parent).phase != "done" and unfinished(tmp_path, ["t1"], {})[1] == ["t1"]
    capsys.readouterr()
    assert memo(path, work)["heldout_loss"] == 5.133 and len(calls) == 2  # done again, not the edited number
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not match the sha256 in its seal" in err[0] and "result.json.refused-1" in err[0]
    assert (path.parent / "result.json.refused-1").is_file()
    assert trial_state(path.parent).phase == "done"


def test_a_memo_without_a_seal_or_of_the_wrong_shape_is_done_again(tmp_path, capsys):
    from raycpt.io import sealed_json_problem, write_sealed_json
    from raycpt.runs.folder import memo

    path = tmp_path / "trace_result.json"
    path.write_text(json.dumps({"recommended_split": 0.5}))  # an older raycpt's file, no seal
    assert "has no seal" in sealed_json_problem(path)
    assert memo(path, lambda: {"recommended_split": 0.25}) == {"recommended_split": 0.25}
    assert "has no seal" in capsys.readouterr().err
    write_sealed_json(path, [1, 2])  # sealed, but not an object
    assert sealed_json_problem(path) == "it holds a list, not an object"
    assert memo(path, lambda: {"recommended_split": 0.75}) == {"recommended_split": 0.75}
    assert "not an object" in capsys.readouterr().err and sealed_json_problem(path) is None


# ------------------------------------------------------------------------------------ the base model's shards

def test_base_shards_are_keyed_by_the_weights_content(tiny_dir, tmp_path):
    """A base model rewritten in place (size kept, mtime set back) gets new shards: the key is the weights' sha256."""
    from raycpt.models.shards import ensure_base_shards, read_shards, weight_files

    root = tmp_path / "base_shards"
    first = ensure_base_shards(tiny_dir, root, "float32")
    assert ensure_base_shards(tiny_dir, root, "float32") == first and read_shards(first) is not None
    rewrite_in_place(weight_files(tiny_dir)[0], -1)  # the last byte of the weights' data
    second = ensure_base_shards(tiny_dir, root, "float32")
    assert second != first and read_shards(second) is not None


def test_a_base_shard_changed_in_place_or_an_edited_manifest_is_refused_by_every_reader(tiny_dir, tmp_path):
    """The driver's check (its process trusts a file whose size, times and inode are unchanged, as a trial process
    does with the driver's) and a checkpoint that links the shards reach the same verdict, in one line."""
    import pytest
    import torch

    import raycpt.models.shards as sh
    from raycpt.errors import RaycptError
    from raycpt.train.ckpt.checkpoint import save_model_by_reference

    folder = sh.ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    assert sh.shards_problem(folder) is None
    victim = folder / "layer-001.safetensors"
    victim.chmod(0o644)
    rewrite_in_place(victim, -1)
    victim.chmod(sh.READ_ONLY)
    why = sh.shards_problem(folder)  # checked in this process before: its change time tells it to hash again
    assert why == "its layer-001.safetensors does not match its size and sha256 in shards.json"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
    with pytest.raises(RaycptError, match="do not verify .its layer-001.safetensors does not match") as e:
        save_model_by_reference(model, tok, model.state_dict(), tmp_path / "out", torch.float32, folder)
    assert "\n" not in str(e.value)
    other = sh.ensure_base_shards(tiny_dir, tmp_path / "other_root", "float32")
    doc = json.loads((other / "shards.json").read_text())
    doc["groups"]["layer-000"]["tensors"] = doc["groups"]["layer-000"]["tensors"][:1]  # a hand edit
    (other / "shards.json").chmod(0o644)
    (other / "shards.json").write_text(json.dumps(doc))
    assert sh.shards_problem(other).endswith("does not match its seal (edited, or written by an older raycpt)")
    assert sh.read_shards(other) is None
    (other / "shards.json").write_text(json.dumps({"format": sh.SHARDS_FORMAT, "groups": [1, 2]}))
    assert "is not a raycpt.base-shards/1 record" in sh.shards_problem(other)


# ------------------------------------------------------------------------------------ the MLflow store template

def test_a_store_template_changed_in_place_is_made_again(tmp_path, monkeypatch, caplog):
    """The cached empty MLflow store every new run root copies: a row added to it in place (its size and mtime
    kept) would be in every new run root's store; it no longer matches its seal, so it is made again, in one line."""
    import logging
    import sqlite3

    from raycpt.runs.store import STORE_TEMPLATES, new_sqlite_store, template_problem

    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    assert new_sqlite_store(tmp_path / "a" / "mlflow.db")
    (template,) = (tmp_path / "cache" / STORE_TEMPLATES).glob("mlflow-*.db")
    assert template_problem(template) is None
    st = os.stat(template)
    with sqlite3.connect(template) as c:  # another experiment's row, planted in the template
        c.execute("INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
                  "VALUES (7, 'planted', '/nowhere', 'active')")
    os.utime(template, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert template_problem(template) == "it does not match the sha256 in its seal (changed after it was made)"
    (tmp_path / "b").mkdir()
    with caplog.at_level(logging.WARNING, logger="raycpt.runs.store"):
        assert new_sqlite_store(tmp_path / "b" / "mlflow.db")
    lines = [r.getMessage() for r in caplog.records if "store template" in r.getMessage()]
    assert len(lines) == 1 and "does not verify (it does not match the sha256 in its seal" in lines[0]
    with sqlite3.connect(tmp_path / "b" / "mlflow.db") as c:
        assert list(c.execute("SELECT name FROM experiments")) == []
    assert template_problem(template) is None


def test_an_evaluation_record_changed_in_place_is_evaluated_again(tmp_path, monkeypatch, capsys):
    """A trial's ``eval_result.json``, read back by ``final_evaluation`` instead of evaluating again: sealed when
    written; changed in place (size and mtime kept) it is refused in one line and the model evaluated again. The
    base row's verified cache entry is read as its caller verified it (``trusted``)."""
    import raycpt.train.driver.final_eval as fe
    from raycpt.config import EvalConfig
    from raycpt.evaluate.results import EvalResult
    from raycpt.io import write_sealed_json
    from raycpt.train.worker.evaluation import EvalRequest

    evaluated = []

    def fake_evaluate(model, eval_cfg, tokenizer=None, out_dir=None, name=None):
        evaluated.append(name)
        return EvalResult(name=name, source="test", scores={"t": {"logit": {"average": 25.0}}})

    monkeypatch.setattr(fe, "load_model", lambda path, **kw: (None, None))
    monkeypatch.setattr(fe, "evaluate_model", fake_evaluate)
    monkeypatch.setattr(fe, "eval_result_record", lambda ev, *a, **k: {**ev.to_dict(), "heldout_loss": None})
    req = EvalRequest(out_dir=str(tmp_path), name="m")
    path = tmp_path / "eval_result.json"
    write_sealed_json(path, {**EvalResult(name="m", source="test", scores={"t": {"logit": {"average": 25.0}}}
                                          ).to_dict(), "heldout_loss": None})
    ev, _ = fe.final_evaluation(tmp_path, EvalConfig(), req)
    assert evaluated == [] and ev.scores["t"]["logit"]["average"] == 25.0  # read back: it verifies
    text = path.read_text()
    path.write_text(text.replace("25.0", "75.0"))  # the hand edit, same size
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    ev, _ = fe.final_evaluation(tmp_path, EvalConfig(), req, trusted=True)
    assert evaluated == [] and ev.scores["t"]["logit"]["average"] == 75.0  # trusted: its caller checked it
    capsys.readouterr()
    ev, _ = fe.final_evaluation(tmp_path, EvalConfig(), req)
    err = capsys.readouterr().err.strip().splitlines()
    assert evaluated == ["m"] and ev.scores["t"]["logit"]["average"] == 25.0
    assert len(err) == 1 and "does not match the sha256 in its seal" in err[0] and "evaluating again" in err[0]
    ev, _ = fe.final_evaluation(tmp_path, EvalConfig(), req)
    assert evaluated == ["m"]  # written sealed: read back next time


def test_a_deleted_base_shard_is_written_again_with_the_same_bytes(tiny_dir, tmp_path, caplog):
    """Issue 51: one base-shard file deleted, then a new sweep: the folder does not verify, so it is written again
    (one warning line) with the same bytes, and every trial's link to it reads right again."""
    import hashlib

    from raycpt.models.shards import ensure_base_shards, shards_problem

    d = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    victim = sorted(d.glob("layer-*.safetensors"))[1]
    before = hashlib.sha256(victim.read_bytes()).hexdigest()
    victim.chmod(0o644)
    victim.unlink()
    assert "missing" in shards_problem(d)
    with caplog.at_level("WARNING"):
        again = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    assert again == d and shards_problem(again) is None
    assert hashlib.sha256(victim.read_bytes()).hexdigest() == before
    assert sum("written again" in r.getMessage() for r in caplog.records) == 1
