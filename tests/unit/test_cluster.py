"""Preflight checks without a cluster: the storage verdict's one line, the store checks (scheme, a refused
port within seconds, an unwritable run root), the step-window system metrics, the version tags."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycpt import cluster
from raycpt.runs import run, store
from raycpt.runs.location import locate
from raycpt.config import TrackingConfig
from raycpt.errors import RaycptError


def test_storage_verdict_names_the_node_that_cannot_see_the_token(tmp_path):
    token = "abc123"
    seen_file = tmp_path / ".raycpt-storage-check-x"
    seen_file.write_text(token)
    private = tmp_path / "elsewhere" / seen_file.name  # what a node with its own private /mnt/shared sees
    seen = {"10.0.0.1 (head)": cluster.read_token(str(seen_file)),
            "10.0.0.7 (worker7)": cluster.read_token(str(private))}
    assert seen["10.0.0.1 (head)"] == token and seen["10.0.0.7 (worker7)"].startswith("<missing")
    with pytest.raises(RaycptError) as e:
        cluster.storage_verdict(tmp_path, token, seen)
    msg = str(e.value)
    assert "\n" not in msg and "node 10.0.0.7 (worker7) cannot see tracking.run_root" in msg
    assert "10.0.0.1" not in msg and "No such file" in msg
    # a node that sees a different file at the same path (another storage mounted there)
    with pytest.raises(RaycptError, match=r"node b .*different file"):
        cluster.storage_verdict(tmp_path, token, {"a": token, "b": "zzz"})
    cluster.storage_verdict(tmp_path, token, {"a": token, "b": token})  # all see it: no error


def test_single_node_needs_no_storage_check(tmp_path):
    assert cluster.check_shared_storage(tmp_path, nodes=[{"NodeID": "n1", "Alive": True}]) == []
    assert not list(tmp_path.iterdir())  # no token file written


def test_unknown_scheme_is_one_line():
    with pytest.raises(RaycptError, match=r"tracking.uri 'ftp://x/y': unknown scheme 'ftp'"):
        locate(TrackingConfig(run_root="/tmp", uri="ftp://x/y"))
    with pytest.raises(RaycptError, match=r"unknown scheme '\(none\)'"):
        store.check_uri_scheme("just-a-name")
    assert store.check_uri_scheme("postgresql+psycopg2://u@h/db") == "postgresql"
    assert store.check_uri_scheme("sqlite:////tmp/x.db") == "sqlite"


def _refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


def test_refused_port_fails_fast(tmp_path):
    uri = f"http://127.0.0.1:{_refused_port()}"
    t0 = time.time()
    with pytest.raises(RaycptError, match=r"no MLflow server answers") as e:
        locate(TrackingConfig(run_root=str(tmp_path), uri=uri))
    assert time.time() - t0 < 15 and "\n" not in str(e.value) and uri in str(e.value)


def test_unwritable_run_root(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RaycptError, match=r"tracking.run_root .*a-file/runs' is not a writable folder"):
        locate(TrackingConfig(run_root=str(blocker / "runs")))
    # /proc is a read-only place even for root
    with pytest.raises(RaycptError, match=r"is not a writable folder"):
        store.check_run_root(Path("/proc/raycpt-runs"))


@pytest.mark.parametrize("uri", [None, "http://127.0.0.1:1"])
def test_cli_bad_store_exits_2_with_one_line(tmp_path, uri):
    """The real CLI: one line on stderr, exit 2, quickly (no model load, no Ray)."""
    blocker = tmp_path / "f"
    blocker.write_text("x")
    over = ["tracking.run_root=" + (str(blocker / "runs") if uri is None else str(tmp_path / "runs"))]
    if uri:
        over.append(f"tracking.uri={uri}")
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "raycpt", "train", *over], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and ("not a writable folder" in lines[0] or "no MLflow server answers" in lines[0])
    assert "Traceback" not in p.stderr and time.time() - t0 < 60


def test_step_system_metrics_cover_the_window():
    from raycpt.train.worker.sysmetrics import StepSystemMetrics

    sm = StepSystemMetrics()
    t_end = time.time() + 0.5
    while time.time() < t_end:  # keep one core busy for the window
        sum(i * i for i in range(1000))
    m = sm.sample()
    import psutil

    assert 0 < m["system/cpu_utilization_percentage"] <= 100
    # memory figures agree with psutil's own, read independently
    used = psutil.virtual_memory().used / 1e6
    assert m["system/system_memory_usage_megabytes"] == pytest.approx(used, rel=0.2)
    assert m["system/process_rss_megabytes"] > 10


def test_version_tags_match_the_installed_packages():
    import importlib.metadata as md

    import ray
    import torch

    tags = run.version_tags()
    assert tags["raycpt.ray_version"] == ray.__version__ == md.version("ray")
    assert tags["raycpt.torch_version"] == torch.__version__
    assert tags["raycpt.cuda_version"] == (torch.version.cuda or "none")
    head = subprocess.run(["git", "-C", str(Path(cluster.__file__).parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode == 0:
        assert tags["raycpt.git_commit"] == head.stdout.strip()
