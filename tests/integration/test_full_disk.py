"""Issue 27 on a real full file system (no fault hook): a small tmpfs as the run root, smaller than one
checkpoint of the model it trains, fills at the first checkpoint. ``raycpt train`` ends with exit 2 and one line
naming ENOSPC and the path, no traceback, no temporary folder left, ``state.json`` failed. Needs root and a
kernel that lets this process mount a tmpfs; else it is skipped, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_failure_paths_train import _corpus, _env, _lines

HIDDEN, LAYERS = 256, 4


def _model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _mount_tmpfs(where: Path, size: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, and this test does not run as root")
    where.mkdir(parents=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here: {(r.stderr or r.stdout).strip()[:200]}")


@pytest.mark.slow
def test_a_real_full_tmpfs_at_the_first_checkpoint_is_one_line(tmp_path):
    from tiny import tiny_model, tiny_tokenizer

    model = tiny_model("llama", num_layers=LAYERS, hidden=HIDDEN)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    weights = _model_bytes(model)  # float32: a checkpoint holds these weights plus AdamW's two moments, 3x
    size = max(weights * 3 // 2, 4 << 20)  # room for the pack and the run folder, not for one checkpoint
    assert size < 3 * weights, (size, weights)
    root = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    _mount_tmpfs(root, size)
    try:
        args = ["train", f"model.ref={model_dir}", f"tracking.run_root={root}",
                f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"data.corpus=[{_corpus(tmp_path / 'c.jsonl')}]",
                "data.seq_len=32", "train.num_workers=1", "train.max_steps=4", "train.checkpoint_every=2",
                "train.max_failures=2"]
        r = subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=900,
                           env=_env())
        lines = _lines(r.stderr)
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
        assert "No space left on device" in lines[0] and "ENOSPC" in lines[0] and str(root) in lines[0], lines
        (run_dir,) = root.glob("train-*")
        state = json.loads((run_dir / "state.json").read_text())
        assert state["status"] == "failed" and "ENOSPC" in state.get("error", "") + lines[0]
        leftovers = [p for p in run_dir.rglob("*") if p.name.startswith((".raycpt-ckpt-", ".final_model"))
                     or p.name.endswith(".tmp")]
        assert leftovers == [] and not (run_dir / "final_model").exists()
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
