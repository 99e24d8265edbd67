"""Issue 27: resume checks what it resumes, driven from outside through ``python -m raycpt``.

A train stopped after its step-2 checkpoint, the corpus edited and re-packed (``data prepare --rebuild``), then
``train --resume``: exit 2, one stderr line saying how to start fresh, no traceback, and the run left as it was
(no new checkpoint, state.json and the MLflow run still FAILED)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(args, env_extra=None, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(env_extra or {})}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def _lines(err: str) -> list[str]:
    return [ln for ln in err.strip().splitlines() if ln.strip()]


def _statuses(run_root: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_root / 'mlflow.db'}")
    return [r.info.status for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


@pytest.mark.slow  # one local-Ray train and three more commands: ~4 min on a contended 2-core machine
def test_resume_after_the_corpus_was_edited_and_repacked_is_refused_in_one_line(tmp_path, tiny_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"gloss number {i} of a small corpus"}) + "\n" for i in range(200)))
    runs = tmp_path / "runs"
    args = ["train", f"model.ref={tiny_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32", f"tracking.run_root={runs}",
            "train.max_steps=4", "train.checkpoint_every=2", "train.num_workers=1", "ray.num_cpus=2"]
    first = _cli(args, {"RAYCPT_FAULTS": json.dumps({"nan_step": 3})})  # stops after the step-2 checkpoint
    assert first.returncode == 2 and "the last good checkpoint is step 2" in first.stderr, first.stderr[-2000:]
    (run_dir,) = runs.glob("train-default-*")
    before = sorted(p.name for p in run_dir.rglob("checkpoint_*"))
    with open(corpus, "a") as f:
        f.write(json.dumps({"text": "a document added after the checkpoint"}) + "\n")
    stale = _cli(["train", *args[1:], "--resume"])  # not re-packed: the store itself is refused as stale
    assert stale.returncode == 2 and "--rebuild" in stale.stderr and len(_lines(stale.stderr)) == 1, stale.stderr
    prep = _cli(["data", "prepare", *args[1:], "--rebuild"])
    assert prep.returncode == 0, prep.stderr[-2000:]
    r = _cli(["train", *args[1:], "--resume"])
    lines = _lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "--resume: checkpoint" in lines[0] and "checkpoint_000002" in lines[0] and "other data" in lines[0]
    assert "without --resume" in lines[0]
    assert sorted(p.name for p in run_dir.rglob("checkpoint_*")) == before  # nothing trained
    assert json.loads((run_dir / "state.json").read_text())["status"] == "failed"
    assert _statuses(runs) == ["FAILED"]  # the refused resume did not touch the run
    assert not (run_dir / "final_model").exists()
