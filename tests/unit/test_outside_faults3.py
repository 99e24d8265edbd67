"""Issue 41 (faults from outside, round three), the cases a unit test can reproduce: each asserts the one line (or
the right result) and that nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from raycpt.config import load_config
from raycpt.data.corpus import iter_documents
MAX_LINE_BYTES = 4 << 20
from raycpt.data.pack import _raycpt_cause
from raycpt.errors import RaycptError
from raycpt.usage import sort_words


# ------------------------------------------------------------------------------- bounded input

def test_config_from_dev_zero_is_refused_without_reading_it():
    """/dev/zero has st_size 0: a size check that trusts it read it for ever (2 GB in 2 s). Run in a child process
    whose address space is capped, so a regression fails this test instead of filling the machine's memory."""
    code = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from raycpt.config import load_config\nfrom raycpt.errors import RaycptError\ntry:\n"
            "    load_config('/dev/zero')\nexcept RaycptError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "config file /dev/zero is a device, not a regular file; expected a file", r.stderr[-500:]


def test_config_that_is_a_fifo_nobody_writes_is_refused_at_once(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    out: list = []

    def load():
        try:
            load_config(fifo)
        except RaycptError as e:
            out.append(str(e))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(timeout=10)
    if t.is_alive():  # the old read blocked here: release it so the test process can end
        with open(fifo, "w"):
            pass
        t.join(timeout=10)
        pytest.fail("loading a FIFO nobody writes blocked")
    assert out == [f"config file {fifo} is a FIFO (named pipe), not a regular file; expected a file"]


def test_config_read_with_a_byte_cap_even_when_st_size_says_less(tmp_path, monkeypatch):
    """The cap holds for a file whose size stat does not report (as for /proc files): the read stops at the cap."""
    from raycpt.config.yaml_io import MAX_CONFIG_BYTES

    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * (MAX_CONFIG_BYTES + 10) + "\n")
    real_stat = os.stat

    class Zero:
        def __init__(self, st):
            self.st = st

        def __getattr__(self, k):
            return 0 if k == "st_size" else getattr(self.st, k)

    monkeypatch.setattr("pathlib.Path.stat", lambda self, **kw: Zero(real_stat(self, **kw)))
    with pytest.raises(RaycptError, match=r"is more than 1,048,576 bytes; a config is at most 1,048,576 bytes"):
        load_config(big)


def test_a_corpus_line_over_the_cap_is_one_line_naming_it(tmp_path):
    p = tmp_path / "c.jsonl"
    ok = json.dumps({"text": "a short document"}) + "\n"
    p.write_text(ok + json.dumps({"text": "x" * (MAX_LINE_BYTES + 5)}) + "\n" + ok)
    with pytest.raises(RaycptError) as e:
        list(iter_documents([str(p)]))
    assert str(e.value) == (f"data.corpus: {p} at byte {len(ok.encode())} is a line longer than {MAX_LINE_BYTES:,} bytes; a document is "
                            "at most that long (one document per line): split it into several")
    # a line of exactly the cap (newline excluded) is still a document
    q = tmp_path / "t.txt"
    q.write_text("y" * MAX_LINE_BYTES + "\nz\n")
    assert [len(d) for d in iter_documents([str(q)])] == [MAX_LINE_BYTES, 1]


def test_a_50mb_line_is_refused_in_bounded_memory(tmp_path):
    """The case as reported: one 50 MB line. A fresh process so its peak resident size is its own."""
    p = tmp_path / "one.txt"
    with open(p, "w") as f:
        f.write("w " * (25 << 20) + "\n")
    # VmHWM is this process's own peak: ru_maxrss would also hold the forking pytest's peak (Linux carries it
    # across exec), which in the full suite is over a GB by itself
    code = ("import re,sys\nfrom raycpt.data.corpus import iter_documents\nfrom raycpt.errors import "
            "RaycptError\ntry:\n    list(iter_documents([sys.argv[1]]))\nexcept RaycptError as e:\n    print(e)\n"
            "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120)
    out = r.stdout.strip().splitlines()
    assert out and "at byte 0 is a line longer than 4,194,304 bytes" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert int(out[-1]) < 1_000_000, out[-1]  # KiB; was 5 GB: the cap reads at most 4 MiB of the line


# ------------------------------------------------------------------------------- words of a command line

def test_an_override_key_with_a_look_alike_letter_is_named():
    with pytest.raises(RaycptError) as e:
        sort_words(["configs/default.yaml", "tr\u0430in.lr=1e-4"])
    assert str(e.value) == ("override 'tr\u0430in.lr=1e-4': its key has the non-ASCII character '\u0430' (U+0430 "
                            "CYRILLIC SMALL LETTER A) at position 3; config keys are ASCII letters, digits, '_' and "
                            "'.', e.g. train.lr=1e-4")


def test_a_second_config_file_message_is_not_garbled():
    from raycpt.entry import main

    for argv, want in ((["config", "validate", "a.yaml", "b.yaml"], "give at most one CONFIG file"),
                       (["compare", "a", "b", "c"], "give BASE TUNED and at most one CONFIG file")):
        r = subprocess.run([sys.executable, "-m", "raycpt", *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and want in r.stderr, r.stderr
        assert "  " not in r.stderr.split("error: ", 1)[1]
    del main


# ------------------------------------------------------------------------------- one line from Ray Data's path

def test_a_raycpt_error_that_ray_data_carries_only_as_text_is_one_line():
    """Ray Data raises ``RayTaskError(UserCodeException)`` whose chain ends before the task's error: the task's
    traceback text holds it (as Ray 2.60 gives it, reproduced by hand)."""

    class UserCodeException(Exception):
        pass

    text = ("ray::Map(_row_task)() (pid=1, ip=127.0.0.1)\n  File \"raycpt/data/corpus.py\", line 262, in _json_docs\n"
            "raycpt.errors.RaycptError: data.corpus: /c.jsonl at byte 15350: field 'text' is a number (5), not a "
            "string (data.text_field names the text)\n\nThe above exception was the direct cause of the following "
            "exception:\n\nray.exceptions.UserCodeException: UDF failed to process a data block.")
    outer = UserCodeException(text)
    outer.__context__ = StopIteration()
    err = _raycpt_cause(outer)
    assert str(err) == ("data.corpus: /c.jsonl at byte 15350: field 'text' is a number (5), not a string "
                        "(data.text_field names the text)")
    assert _raycpt_cause(RuntimeError("a bug")) is None  # a bug stays a bug


# ------------------------------------------------------------------------------- an older train_result.json

def test_a_finished_run_whose_result_lacks_tokens_per_s_reads_it_from_its_step_records(tmp_path):
    """``train --resume`` of a finished run whose ``train_result.json`` lacks ``tokens_per_s`` (an older or
    hand-edited record) was a 48-line KeyError (and turned the finished run FAILED)."""
    from raycpt.train.driver.result import result_from_files

    saved = {"final_model_dir": str(tmp_path / "final_model"), "losses": [4.0, 3.5, 3.0], "steps": [1, 2, 3],
             "wall_s": 12.5, "trainable_params": 10, "frozen_params": 20, "plan": {"name": "full"}}
    (tmp_path / "train_result.json").write_text(json.dumps(saved))
    records = [{"step": s, "loss": l, "tokens_per_s": r, "step_time_s": 0.1}
               for s, l, r in ((1, 4.0, 50.0), (2, 3.5, 200.0), (3, 3.0, 100.0))]
    res = result_from_files(tmp_path, {"status": "finished"}, records)
    assert res.tokens_per_s == 100.0  # the median of 50, 200, 100 (by hand)
    assert res.losses == [4.0, 3.5, 3.0] and res.wall_s == 12.5 and res.reused
    del saved["trainable_params"]
    (tmp_path / "train_result.json").write_text(json.dumps(saved))
    with pytest.raises(RaycptError, match=r"train_result.json lacks tokens_per_s, trainable_params \(an older"):
        result_from_files(tmp_path, {}, [])


# ------------------------------------------------------------------------------- resume checks everything

def _saved_run(tmp_path, overrides):
    from raycpt.config import save_config

    run_dir = tmp_path / "sweep-x-1"
    run_dir.mkdir()
    save_config(load_config(None, overrides), run_dir / "config.yaml")
    return run_dir


def test_a_sweep_resume_with_a_changed_key_is_one_line_naming_it(tmp_path):
    from raycpt.runs.folder import SWEEP_NEUTRAL, SWEEP_SECTIONS, check_resume_config, read_state

    run_dir = _saved_run(tmp_path, ["train.lr=3e-05"])
    before = (run_dir / "config.yaml").read_text()
    new = load_config(None, ["train.lr=1e-03"])
    with pytest.raises(RaycptError) as e:
        check_resume_config(run_dir, new, SWEEP_SECTIONS, SWEEP_NEUTRAL, why="Its finished trials ...")
    assert str(e.value).startswith(f"--resume: {run_dir} was made with other settings: train.lr: 3e-05 -> 0.001. "
                                   "Its finished trials ...")
    assert "--accept-changes" in str(e.value) and "\n" not in str(e.value)
    assert (run_dir / "config.yaml").read_text() == before  # nothing rewritten by a refusal
    # eval, trace, sweep and report settings define a sweep's work too; resources and concurrency do not
    for key in ("eval.limit=7", "sweep.splits=[0.25]", "trace.max_prompts=3", "report.alpha=0.1", "data.seq_len=16"):
        with pytest.raises(RaycptError, match=key.split("=")[0]):
            check_resume_config(run_dir, load_config(None, ["train.lr=3e-05", key]), SWEEP_SECTIONS, SWEEP_NEUTRAL)
    assert check_resume_config(run_dir, load_config(None, ["train.lr=3e-05", "sweep.max_concurrent_trials=2",
                                                           "ray.num_cpus=3"]), SWEEP_SECTIONS, SWEEP_NEUTRAL) == []
    # --accept-changes: a deliberate continuation; the folder's config then says what runs, the state what changed
    assert check_resume_config(run_dir, new, SWEEP_SECTIONS, SWEEP_NEUTRAL, accept=True) == \
        ["train.lr: 3e-05 -> 0.001"]
    assert load_config(run_dir / "config.yaml").train.lr == 1e-3
    assert read_state(run_dir)["config_changes"][0]["changes"] == ["train.lr: 3e-05 -> 0.001"]


class _Store:
    def __init__(self, key, identity, build="b"):
        self.key, self.identity, self.build_id = key, identity, build


def test_a_resume_after_the_replay_corpus_was_re_packed_is_refused_naming_it(tmp_path):
    from raycpt.train.driver.resume import check_resume_data

    ckpt = tmp_path / "checkpoint_000002"
    ckpt.mkdir()
    (ckpt / "train_state.json").write_text(json.dumps({"data": {
        "store_key": "k1", "store_identity": "p1", "replay_store_key": "r1", "replay_store_identity": "ri1"}}))
    check_resume_data(ckpt, _Store("k1", "p1"), _Store("r1", "ri1"))  # the same packs: resumes
    with pytest.raises(RaycptError) as e:
        check_resume_data(ckpt, _Store("k1", "p1"), _Store("r1", "ri2"))
    assert f"checkpoint {ckpt} was trained on other data (data.replay.corpus: corpus ri1, now ri2" in str(e.value)
    assert "`raycpt data prepare [CONFIG] [overrides] --rebuild`, which packs data.corpus and data.replay.corpus" \
        in str(e.value)
    with pytest.raises(RaycptError, match=r"\(data.corpus: corpus p1, now p2"):
        check_resume_data(ckpt, _Store("k1", "p2"), _Store("r1", "ri1"))


def _replay_cfg(tmp_path, model, replay):
    primary = tmp_path / "primary.jsonl"
    primary.write_text("".join(json.dumps({"text": f"primary document {i} about words"}) + "\n" for i in range(80)))
    return load_config(None, [f"model.ref={model}", f"tracking.run_root={tmp_path / 'runs'}", f"data.corpus=[{primary}]",
                              "data.seq_len=16", "data.replay.ratio=0.25", f"data.replay.corpus=[{replay}]"])


def test_a_changed_replay_corpus_names_it_and_data_prepare_rebuild_re_packs_it(tmp_path):
    """The advice of the line (``raycpt data prepare --rebuild``) re-packs the replay corpus it names: it used to
    re-pack only data.corpus, so the advice looped."""
    from raycpt.data.run_store import replay_corpus
    from raycpt.jobs.data import prepare_store
    from raycpt.jobs.job import Options
    from tiny import save_tiny

    model = save_tiny(tmp_path / "tiny")
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps({"text": f"general text {i}, quite plain"}) + "\n" for i in range(60)))
    cfg = _replay_cfg(tmp_path, model, replay)
    prepare_store(cfg, Options(values={}))
    first = replay_corpus(cfg, str(model), tmp_path / "runs")
    replay.write_text("".join(json.dumps({"text": f"other general text {i}"}) + "\n" for i in range(60)))
    with pytest.raises(RaycptError) as e:
        replay_corpus(cfg, str(model), tmp_path / "runs")
    assert str(e.value).startswith("data.replay.corpus: ") and "--rebuild" in str(e.value)
    prepare_store(cfg, Options(values={"rebuild": True}))
    again = replay_corpus(cfg, str(model), tmp_path / "runs")
    assert again.key == first.key and again.identity != first.identity  # the same store, the new corpus


@pytest.mark.parametrize("bad", ["missing", "empty", "short"])
def test_a_bad_replay_corpus_is_one_line_naming_data_replay_corpus(tmp_path, bad):
    from raycpt.data.run_store import check_corpora
    from tiny import save_tiny

    model = save_tiny(tmp_path / "tiny")
    replay = tmp_path / "replay.jsonl"
    if bad == "empty":
        replay.write_text("")
    elif bad == "short":
        replay.write_text(json.dumps({"text": "one"}) + "\n")
    cfg = _replay_cfg(tmp_path, model, replay)
    with pytest.raises(RaycptError) as e:
        check_corpora(cfg, str(model), tmp_path / "runs")
    assert str(e.value).startswith("data.replay.corpus"), str(e.value)
    assert " data.corpus" not in str(e.value)


# ------------------------------------------------------------------------------- a store that cannot be written

def test_a_real_sqlite_write_failure_is_recognised_through_mlflows_wrapping(tmp_path):
    """SQLite's own error (a database in a folder it cannot open), wrapped as MLflow wraps it, is the store failing;
    a server that refuses a call or any other error is not."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    from raycpt.runs.store import store_unwritable

    try:
        sqlite3.connect(str(tmp_path / "no-such-folder" / "mlflow.db")).execute("create table t (x)")
    except sqlite3.OperationalError as e:
        inner = e
    try:
        raise MlflowException(f"(sqlite3.OperationalError) {inner}") from inner
    except MlflowException as e:
        outer = e
    assert store_unwritable(outer) == "unable to open database file"
    assert store_unwritable(MlflowException("RESOURCE_ALREADY_EXISTS: run exists")) is None
    assert store_unwritable(RuntimeError("unable to open database file")) is None  # words alone, no SQLite error
