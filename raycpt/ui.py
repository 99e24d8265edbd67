"""``raycpt ui``: the MLflow UI as a child that never outlives us.

``mlflow ui`` starts a web server and job-runner processes of its own. :func:`serve_ui` checks the
port first (a busy port is one line and exit 2, with nothing started), runs MLflow in its own
process group without its artifact proxy (:func:`ui_command`: ``--no-serve-artifacts``, so there is no upload
endpoint and nothing is written under the folder it was started from; the UI still shows a run's files, which it
reads from the run's own artifact location), and and on any way out (the UI exiting, Ctrl-C, SIGTERM, SIGHUP) ends that whole group
and every descendant it saw, so no MLflow process is left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from raycpt.errors import RaycptError


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """RaycptError when ``host:port`` cannot be bound (in use, or not a valid port)."""
    if not 0 < port < 65536:
        raise RaycptError(f"--port {port}: not a TCP port (1-65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise RaycptError(f"port {port} on {host} is not free ({e.strerror}): nothing was started; "
                              f"stop what uses it or pass --port N") from None


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_group(proc: subprocess.Popen, seen: list, grace_s: float = 10.0) -> None:
    """End ``proc``'s process group and every process in ``seen`` (TERM, then KILL after ``grace_s``)."""
    import psutil

    procs = {p.pid: p for p in seen + _descendants(proc.pid)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs.values():
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        try:
            proc.wait(timeout=grace_s if sig == signal.SIGTERM else 5)
        except subprocess.TimeoutExpired:
            pass
        _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s if sig == signal.SIGTERM else 5)
        if proc.poll() is not None and not alive:
            return


def ui_command(uri: str, port: int) -> list[str]:
    """The ``mlflow ui`` command line: 127.0.0.1 only, no artifact proxy (MLflow's default serves a writable,
    unauthenticated ``<cwd>/mlartifacts``), new experiments' artifacts next to a SQLite store (not ``./mlruns``)."""
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
           "--port", str(port), "--no-serve-artifacts"]
    if uri.startswith("sqlite:///"):
        cmd += ["--default-artifact-root", (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()]
    return cmd


def serve_ui(uri: str, port: int) -> int:
    """Run ``mlflow ui`` on 127.0.0.1:``port`` until it exits or we are stopped; return its exit code
    (0 when we were stopped by a signal or Ctrl-C). Nothing of it survives this call."""
    check_port_free(port)
    cmd = ui_command(uri, port)
    stopped = {"sig": None}

    def on_signal(signum, frame):
        stopped["sig"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    proc = subprocess.Popen(cmd, start_new_session=True)
    seen: list = []
    try:
        while proc.poll() is None:
            seen = list({p.pid: p for p in seen + _descendants(proc.pid)}.values())
            time.sleep(0.5)
        if proc.returncode != 0:
            raise RaycptError(f"the MLflow UI exited with code {proc.returncode} (see its output above)")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(proc, seen)
        for s, h in old.items():
            signal.signal(s, h)
