"""Issue 27, driven from outside through ``python -m raycpt train``: a tracking server killed mid-run (the run
finishes locally, one warning line, exit 0, ``raycpt runs sync`` records it later) and a disk that fills at a
checkpoint (one line naming the path and ENOSPC, exit 2, the run ended FAILED, nothing half-written left)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def _lines(text: str) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()]


def _corpus(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": f"gloss {i} of a small corpus with a few more words"}) + "\n"
                            for i in range(200)))
    return path


def _train_args(tiny_dir, tmp_path, root, *extra):
    return ["train", f"model.ref={tiny_dir}", f"tracking.run_root={root}", f"data.corpus=[{_corpus(tmp_path / 'c.jsonl')}]",
            "data.seq_len=32", "train.num_workers=1", "train.checkpoint_every=2", *extra]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(root: Path, port: int) -> subprocess.Popen:
    """``mlflow server`` on 127.0.0.1:``port`` over ``root``'s SQLite store, in its own process group."""
    root.mkdir(exist_ok=True)
    log = open(root / "server.log", "a")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    import urllib.request

    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("mlflow server did not start: " + (root / "server.log").read_text()[-2000:])
        time.sleep(1)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _wait_for_step(root: Path, step: int, proc: subprocess.Popen, timeout: float = 400) -> Path:
    """The run folder, once its ``train_metrics.jsonl`` holds ``step``."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for f in root.glob("train-*/train_metrics.jsonl"):
            steps = [json.loads(ln).get("step") for ln in f.read_text().splitlines() if ln.startswith('{"step"')]
            if step in steps:
                return f.parent
        time.sleep(0.5)
    raise AssertionError(f"training never reached step {step}: {proc.poll()}")


@pytest.mark.slow
def test_a_tracking_server_killed_mid_run_finishes_locally_then_syncs(tmp_path, tiny_dir):
    from mlflow.tracking import MlflowClient

    port, store = _free_port(), tmp_path / "server"
    server = _start_server(store, port)
    uri = f"http://127.0.0.1:{port}"
    root = tmp_path / "runs"
    args = _train_args(tiny_dir, tmp_path, root, f"tracking.uri={uri}", "train.max_steps=8")
    train = subprocess.Popen([sys.executable, "-m", "raycpt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env(RAYCPT_FAULTS=json.dumps({"step_sleep": 1.0})))
    try:
        run_dir = _wait_for_step(root, 2, train)
        _kill(server)  # by its PID, mid-run
        out, err = train.communicate(timeout=600)
    finally:
        if train.poll() is None:
            train.kill()
        _kill(server)
    lines = _lines(err)
    assert train.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"warning: tracking server {uri} unreachable since step "), lines
    assert str(run_dir) in lines[0] and f"raycpt runs sync {run_dir}" in lines[0]
    assert (run_dir / "final_model" / "config.json").is_file() and (run_dir / "train_result.json").is_file()
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "finished" and (run_dir / "tracking_lost.json").is_file()
    records = [json.loads(ln) for ln in (run_dir / "train_metrics.jsonl").read_text().splitlines()
               if ln.startswith('{"step"')]
    assert [r["step"] for r in records] == list(range(1, 9))

    server = _start_server(store, port)  # the same server again, on its store: the run is there, RUNNING
    try:
        client = MlflowClient(uri)
        assert client.get_run(state["mlflow_run_id"]).info.status == "RUNNING"
        live = {m.step for m in client.get_metric_history(state["mlflow_run_id"], "loss")}
        assert live and max(live) < 8  # the steps after the kill never arrived
        r = subprocess.run([sys.executable, "-m", "raycpt", "runs", "sync", str(run_dir)], capture_output=True,
                           text=True, env=_env(), timeout=300)
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr[-3000:]
        run = client.get_run(state["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        for key in ("loss", "grad_norm", "lr"):
            hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            assert hist == [(rec["step"], pytest.approx(rec[key], rel=1e-12)) for rec in records], key
        result = json.loads((run_dir / "train_result.json").read_text())
        assert run.data.metrics["final_loss"] == pytest.approx(result["losses"][-1])
        assert not (run_dir / "tracking_lost.json").exists()
    finally:
        _kill(server)


@pytest.mark.slow
def test_a_disk_full_at_a_checkpoint_is_one_line_and_the_run_ends_failed(tmp_path, tiny_dir):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "runs"
    args = _train_args(tiny_dir, tmp_path, root, "train.max_steps=4", "train.max_failures=0")
    r = subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=600,
                       env=_env(RAYCPT_FAULTS=json.dumps({"oserror_step": 2, "oserror_errno": "ENOSPC"})))
    lines = _lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = lines[0]
    assert "No space left on device (ENOSPC)" in line and "model.safetensors" in line and "--resume" in line
    named = Path(line.split("cannot write ", 1)[1].split(":", 1)[0])
    assert not named.parent.exists()  # the half-written checkpoint folder is gone
    (run_dir,) = root.glob("train-*")
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "failed" and "ENOSPC" in state["error"]
    hidden = [p for p in run_dir.rglob("*") if p.name.startswith((".raycpt-ckpt-", ".final_model")) or
              p.name.endswith(".tmp")]
    assert hidden == [] and not (run_dir / "final_model").exists()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert client.get_run(state["mlflow_run_id"]).info.status == "FAILED"


def _attempts(run_dir: Path) -> int:
    """How many times a worker group started training: rank 0's ``start`` / ``resume`` events."""
    events = [json.loads(ln) for ln in (run_dir / "train_metrics.jsonl").read_text().splitlines() if ln.strip()]
    return sum(1 for e in events if e.get("event") in ("start", "resume"))


@pytest.mark.slow
def test_a_full_disk_is_not_retried_by_max_failures(tmp_path, tiny_dir):
    """``train.max_failures=2`` (the default) restarts a worker group that failed; a full disk stays full, so the
    run ends after its first attempt with the one line."""
    root = tmp_path / "runs"
    args = _train_args(tiny_dir, tmp_path, root, "train.max_steps=4", "train.max_failures=2")
    r = subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=600,
                       env=_env(RAYCPT_FAULTS=json.dumps({"oserror_step": 2, "oserror_errno": "ENOSPC"})))
    lines = _lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in lines[0] and "model.safetensors" in lines[0]
    (run_dir,) = root.glob("train-*")
    assert _attempts(run_dir) == 1  # not 1 + max_failures
    assert json.loads((run_dir / "state.json").read_text())["status"] == "failed"
