"""The stderr filter's exit: what the process wrote is forwarded, and a child that inherited fd 2 and outlives the
process (multiprocessing's resource tracker of a spawn pool) does not hold the exit up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SNIPPET = r"""
import re, subprocess, sys
from raycpt.runtime import filter_stderr
filter_stderr([re.compile("drop this")])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # inherits fd 2: the filter's pipe
print(child.pid, flush=True)
sys.stderr.write("keep me\ndrop this line\n")
raise RuntimeError("boom at exit")
"""


def test_exit_forwards_what_was_written_and_does_not_wait_for_a_child_holding_the_pipe(tmp_path: Path):
    err_file, out_file = tmp_path / "err.txt", tmp_path / "out.txt"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(err_file, "wb") as err, open(out_file, "wb") as out:  # files: a pipe here would wait for the child
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", SNIPPET], stdout=out, stderr=err, env=env)
        try:
            rc = proc.wait(timeout=60)
        finally:
            proc.kill()
        elapsed = time.monotonic() - t0
    pid = int(out_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    text = err_file.read_text()
    assert rc == 1
    assert "keep me" in text and "drop this" not in text, text
    assert text.rstrip().splitlines()[-1] == "RuntimeError: boom at exit", text  # the traceback, forwarded whole
    assert elapsed < 3.5, elapsed  # was 5 s of waiting for an EOF the child's copy of the pipe never gave
