"""Issue 27: `kill -9` of `raycpt data prepare` (from outside, by PID) leaves none of its spawned pack processes
running, and no store that looks complete."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def test_kill9_of_data_prepare_ends_its_pack_processes(tmp_path, tiny_dir):
    corpus = tmp_path / "big.jsonl"  # ~3 MB: three 1 MiB chunks, so the pack runs in a pool of processes
    with open(corpus, "w") as f:
        for i in range(30000):
            f.write(json.dumps({"text": f"document {i} " + "word " * 18}) + "\n")
    runs = tmp_path / "runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "raycpt", "data", "prepare", f"model.ref={tiny_dir}",
                          f"data.corpus=[{corpus}]", "data.seq_len=32", f"tracking.run_root={runs}"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    packers = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None and not packers:
            packers = [c for c in psutil.Process(p.pid).children(recursive=True)
                       if "spawn_main" in " ".join(c.cmdline())]
            time.sleep(0.05)
        assert packers, "no pack process was seen"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        _, alive = psutil.wait_procs(packers, timeout=30)
        assert alive == [], [c.cmdline() for c in alive]
    finally:
        if p.poll() is None:
            p.kill()
    stores = [d for d in (runs / "packed").iterdir() if d.is_dir() and not d.name.startswith(".")] \
        if (runs / "packed").is_dir() else []
    assert [d for d in stores if (d / "manifest.json").is_file()] == []
