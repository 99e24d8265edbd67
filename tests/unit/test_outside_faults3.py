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
    code = ("import resource,sys\nfrom raycpt.data.corpus import iter_documents\nfrom raycpt.errors import "
            "RaycptError\ntry:\n    list(iter_documents([sys.argv[1]]))\nexcept RaycptError as e:\n    print(e)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120)
    line, peak_kib = r.stdout.strip().splitlines()
    assert "at byte 0 is a line longer than 4,194,304 bytes" in line
    assert int(peak_kib) < 600_000, peak_kib  # was 5 GB; the cap reads at most 4 MiB of the line


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
