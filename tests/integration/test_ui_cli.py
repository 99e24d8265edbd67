"""`raycpt ui` through the real console script: a busy port is one line and exit 2 with nothing
started; stopped by SIGTERM or Ctrl-C it leaves no MLflow process behind (checked with psutil)."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

EXE = str(Path(sys.executable).with_name("raycpt"))


def _ours(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if marker in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_busy_port_is_one_line_and_starts_nothing(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([EXE, "ui", f"tracking.run_root={tmp_path}", "--port", str(port)], capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"error: port {port} on 127.0.0.1 is not free (Address already in use): "
                                             "nothing was started; stop what uses it or pass --port N"]
    assert _ours(str(tmp_path)) == []


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_ui_stopped_leaves_no_mlflow_process(tmp_path, how):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([EXE, "ui", f"tracking.run_root={tmp_path}", "--port", str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except OSError:
                assert p.poll() is None, p.stderr.read().decode()[-2000:]
                time.sleep(1)
        tree = psutil.Process(p.pid).children(recursive=True)
        assert any("mlflow" in " ".join(c.cmdline()) for c in tree), [c.cmdline() for c in tree]
        if how == "SIGTERM":
            p.send_signal(signal.SIGTERM)
        else:  # what a terminal does on Ctrl-C: SIGINT to the foreground process group (raycpt's)
            os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=60)
        _, alive = psutil.wait_procs(tree, timeout=30)
        assert alive == [], [c.cmdline() for c in alive]
        assert _ours(str(tmp_path)) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
