"""Issue 27 for ``raycpt contribution`` and ``raycpt hybrid run``, driven from outside as for the sweep
(test_failure_paths_sweep.py): the tracking server (a real ``mlflow server``) killed by its PID once the first trial
has logged and a training step is on disk. The command finishes locally, writes its report, exits 0 with one warning
line naming its folder and the sync command; after a restart of the server on its store, ``raycpt runs sync RUN_DIR``
ends every trial's run FINISHED with the numbers of its files, and a second sync adds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_failure_paths_sweep import _points, _records, _sync
from test_failure_paths_train import _env, _free_port, _kill, _lines, _start_server


def _wait_for(runs: Path, pattern: str, first: str, proc: subprocess.Popen, timeout: float = 600) -> Path:
    """The run folder (``pattern``'s match, three levels up from a trial's ``train_metrics.jsonl``) once ``first``
    (a file of the first trial, relative to the run folder) exists and a trial's training logged a step."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for f in runs.glob(pattern):
            run_dir = f.parents[3]
            if (run_dir / first).is_file() and any(ln.startswith('{"step"') for ln in f.read_text().splitlines()):
                return run_dir
        time.sleep(0.5)
    rc = proc.poll()
    raise AssertionError(f"no trial logged a step (exit {rc}): {proc.stderr.read()[-3000:] if rc is not None else ''}")


def _run_killing_the_server(args: list[str], runs: Path, pattern: str, first: str, server) -> tuple:
    """Run ``raycpt ARGS``, kill the server (by its PID) once :func:`_wait_for` says so;
    ``(proc, out, err, run_dir)``."""
    proc = subprocess.Popen([sys.executable, "-m", "raycpt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(RAYCPT_FAULTS=json.dumps({"step_sleep": 1.0})))
    try:
        run_dir = _wait_for(runs, pattern, first, proc)
        _kill(server)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill(server)
    return proc, out, err, run_dir


def _assert_finished_locally(proc, out: str, err: str, run_dir: Path, uri: str) -> dict:
    lines = _lines(err)
    assert proc.returncode == 0 and "Traceback" not in err + out, (err + out)[-4000:]
    assert len(lines) == 1 and lines[0].startswith(f"warning: tracking server {uri} unreachable"), err[-4000:]
    assert f"raycpt runs sync {run_dir}" in lines[0]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "finished" and (run_dir / "tracking_lost.json").is_file()
    return state


def _assert_steps(client, run_id: str, train_dir: Path, steps: int) -> None:
    """The run's loss / grad_norm / lr history is the training folder's step records, each once."""
    records = _records(train_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for key in ("loss", "grad_norm", "lr"):
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert hist == [(rec["step"], pytest.approx(rec[key], rel=1e-12)) for rec in records], (train_dir, key)


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"word {i}: a short definition of thing number {i}; example {i}."})
                              + "\n" for i in range(60)))
    return corpus


@pytest.mark.slow
def test_a_tracking_server_killed_mid_contribution_finishes_locally_then_syncs(tmp_path, tiny_dir):
    from mlflow.tracking import MlflowClient

    port, store, runs = _free_port(), tmp_path / "server", tmp_path / "runs"
    server = _start_server(store, port)
    uri = f"http://127.0.0.1:{port}"
    args = ["contribution", "name=tiny", f"model.ref={tiny_dir}", f"data.corpus=[{_corpus(tmp_path)}]",
            "data.seq_len=32", "data.max_documents=50", "train.max_steps=4", "train.micro_batch_size=2",
            "train.checkpoint_every=2", "train.cpus_per_worker=0.5", "train.lr=1e-2", "train.warmup_ratio=0",
            "eval.limit=4", "eval.modes=logit", "eval.batch_size=4", "contribution.score=heldout_loss",
            "contribution.heldout_docs=10", "contribution.cpus_per_trial=0.5", f"tracking.run_root={runs}",
            f"tracking.uri={uri}", "--layers", "1"]
    # base (evaluated only) is the first trial: once it has its result and full has logged a step, the server goes
    proc, out, err, run_dir = _run_killing_the_server(args, runs, "contribution-*/trials/*/train/train_metrics.jsonl",
                                                      "trials/base/result.json", server)
    state = _assert_finished_locally(proc, out, err, run_dir, uri)
    names = ["base", "full", "single-L01"]
    assert sorted(p.parent.name for p in run_dir.glob("trials/*/result.json")) == names
    for f in ("contribution.csv", "contribution.md", "ranking.json", "summary.json", "plots/contribution.png"):
        assert (run_dir / f).is_file(), f

    server = _start_server(store, port)  # the same server again, on its store
    try:
        client = MlflowClient(uri)
        r = _sync(run_dir)
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr[-3000:]
        parent = client.get_run(state["mlflow_run_id"])
        assert parent.info.status == "FINISHED"
        assert {f.path for f in client.list_artifacts(parent.info.run_id)} >= {
            "contribution.csv", "contribution.md", "ranking.json", "summary.json", "contribution.png"}
        summary = json.loads((run_dir / "summary.json").read_text())
        hist = [(m.step, m.value) for m in client.get_metric_history(parent.info.run_id, "contribution")]
        assert hist == [(1, pytest.approx(summary["contribution"]["1"], rel=1e-12))]
        assert parent.data.metrics["full_score"] == pytest.approx(summary["full_score"], rel=1e-12)
        points = {}
        for name in names:
            tdir = run_dir / "trials" / name
            run_id = json.loads((tdir / "trial.json").read_text())["mlflow_run_id"]
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            assert run.data.params["kind"] == name.split("-")[0]
            result = json.loads((tdir / "result.json").read_text())
            assert run.data.metrics["heldout_loss"] == pytest.approx(result["heldout_loss"], rel=1e-12)
            assert run.data.metrics["score"] == pytest.approx(result["score"], rel=1e-12)
            if name != "base":
                _assert_steps(client, run_id, tdir / "train", 4)
                l2 = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "l2_change"))
                assert l2 == [(i, pytest.approx(v, rel=1e-12)) for i, v in enumerate(result["l2"])]
            points[run_id] = _points(client, run_id)
        points[parent.info.run_id] = _points(client, parent.info.run_id)
        assert not (run_dir / "tracking_lost.json").exists()
        again = _sync(run_dir)  # a second sync adds nothing
        assert again.returncode == 0, again.stderr[-3000:]
        assert {rid: _points(client, rid) for rid in points} == points
    finally:
        _kill(server)


@pytest.mark.slow
def test_a_tracking_server_killed_mid_hybrid_run_finishes_locally_then_syncs(tmp_path):
    from mlflow.tracking import MlflowClient
    from tiny import save_tiny

    port, store, runs = _free_port(), tmp_path / "server", tmp_path / "runs"
    donor = save_tiny(tmp_path / "donor", "llama", 4, 32, seed=1)
    server = _start_server(store, port)
    uri = f"http://127.0.0.1:{port}"
    cfg = {"name": "ihyb", "model": {"ref": str(donor)},
           "data": {"seq_len": 32, "max_documents": 50, "corpus": [str(_corpus(tmp_path))]},
           "trace": {"max_prompts": 10, "batch_size": 10, "splits": [0.5], "top_k": 5},  # 10: no small-set warning
           "train": {"max_steps": 4, "micro_batch_size": 2, "lr": 1e-2, "warmup_ratio": 0.0, "checkpoint_every": 2,
                     "keep_checkpoints": 1, "cpus_per_worker": 1},
           "eval": {"limit": 4, "batch_size": 4, "max_gen_toks": 2},
           # qwen3 new layers: mamba2's add transformers' two kernel-fallback notes to stderr on a CPU
           "tracking": {"run_root": str(runs), "uri": uri}, "hybrid": {"depth": 4, "new_kind": "qwen3"}}
    path = tmp_path / "hyb.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # the first build's child run has its params (its segment map logged) and a training step is on disk
    proc, out, err, run_dir = _run_killing_the_server(["hybrid", "run", str(path)], runs,
                                                      "hybrid-*/builds/*/train/train_metrics.jsonl",
                                                      "builds/new_shallow/build.json", server)
    state = _assert_finished_locally(proc, out, err, run_dir, uri)
    builds = ["new_deep", "new_shallow"]
    assert sorted(p.parent.name for p in run_dir.glob("builds/*/result.json")) == builds
    for f in ("hybrid_table.txt", "hybrid.csv", "hybrid_profiles.png", "summary.json"):
        assert (run_dir / f).is_file(), f

    server = _start_server(store, port)
    try:
        client = MlflowClient(uri)
        r = _sync(run_dir)
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr[-3000:]
        parent = client.get_run(state["mlflow_run_id"])
        assert parent.info.status == "FINISHED"
        assert {f.path for f in client.list_artifacts(parent.info.run_id)} >= {"hybrid_table.txt", "summary.json"}
        points = {parent.info.run_id: None}
        for build in builds:
            bdir = run_dir / "builds" / build
            run_id = json.loads((bdir / "build.json").read_text())["mlflow_run_id"]
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            assert run.data.params["build"] == build
            result = json.loads((bdir / "result.json").read_text())
            assert run.data.metrics["final_loss"] == pytest.approx(result["final_loss"], rel=1e-12)
            assert parent.data.metrics[f"{build}/final_loss"] == pytest.approx(result["final_loss"], rel=1e-12)
            _assert_steps(client, run_id, bdir / "train", 4)
            assert "trace" in [a.path for a in client.list_artifacts(run_id)]
            trace_id = json.loads((bdir / "trace" / "state.json").read_text())["mlflow_run_id"]
            trace = client.get_run(trace_id)  # the build's trace, nested under it, with its numbers
            assert trace.info.status == "FINISHED" and trace.data.tags["mlflow.parentRunId"] == run_id
            tsum = json.loads((bdir / "trace" / "summary.json").read_text())
            assert trace.data.metrics["recommended_split"] == pytest.approx(tsum["recommended"]["ratio"])
            points.update({run_id: None, trace_id: None})
        points = {rid: _points(client, rid) for rid in points}
        again = _sync(run_dir)
        assert again.returncode == 0, again.stderr[-3000:]
        assert {rid: _points(client, rid) for rid in points} == points
    finally:
        _kill(server)
