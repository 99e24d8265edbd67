"""Issue 28: a run that drops its checkpoints when it finishes (a sweep trial) writes its last checkpoint without
optimizer state and publishes it by hard links; a checkpoint this process just wrote is not hashed again. Each test
reads the files themselves: sizes against AdamW's two float32 moments counted from the plan, inodes, bits."""

import os

import pytest
import torch

from raycpt.errors import RaycptError
from raycpt.models.shards import TRAINED_FILE, ensure_base_shards
from raycpt.train.ckpt import manifest as ck
from raycpt.train.ckpt.checkpoint import read_train_state
from raycpt.train.ckpt.manifest import verify_checkpoint
from raycpt.train.driver.publish import publish_model, verify_model_folder
from raycpt.train.worker.loop import run_loop
from worker_specs import worker_spec
from test_publish_reference import _Blocks, _bits, _tensors
from test_train_loop import _loop_config

PLAN = dict(name="train_deep", split=0.5)
COMMON = dict(max_steps=3, checkpoint_every=1, keep_checkpoints=3, lr=0.01, micro_batch_size=2)


def _run(tiny_dir, root, shards, keep_finished: bool, **extra):
    cfg = _loop_config(tiny_dir, root, PLAN, **{**COMMON, "keep_finished_checkpoints": keep_finished, **extra})
    out = run_loop(worker_spec(cfg), _Blocks(str(root / "ray" / "a1"), 3, str(shards)))
    assert out["status"]["status"] == "finished"
    return out, root / "ray" / "a1"


def _trainable_bytes(tiny_dir) -> int:
    """float32 bytes of layers 2 and 3 (train_deep at 0.5 of the 4-layer tiny model), from the base weights file."""
    base = _tensors(os.path.join(tiny_dir, "model.safetensors"))
    return sum(t.numel() * 4 for k, t in base.items() if k.startswith(("model.layers.2.", "model.layers.3.")))


def test_the_last_checkpoint_of_a_dropping_run_has_no_optimizer_state(tiny_dir, tmp_path):
    shards = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    kept, kroot = _run(tiny_dir, tmp_path / "k", shards, keep_finished=True)
    drop, droot = _run(tiny_dir, tmp_path / "d", shards, keep_finished=False)
    assert drop["losses"] == kept["losses"]  # the same training
    assert read_train_state(droot / "checkpoint_000002")["optimizer"] is not None  # only the last one is final
    assert read_train_state(droot / "checkpoint_000003")["optimizer"] is None
    assert read_train_state(kroot / "checkpoint_000003")["optimizer"] is not None
    saved = (kroot / "checkpoint_000003" / "train_state.pt").stat().st_size - \
        (droot / "checkpoint_000003" / "train_state.pt").stat().st_size
    assert saved >= 2 * _trainable_bytes(tiny_dir)  # AdamW's exp_avg and exp_avg_sq of every trained tensor
    assert verify_checkpoint(droot / "checkpoint_000003") is None


def test_a_final_checkpoint_resumes_to_publish_but_not_to_train_on(tiny_dir, tmp_path):
    shards = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    drop, droot = _run(tiny_dir, tmp_path / "d", shards, keep_finished=False)
    cfg = _loop_config(tiny_dir, tmp_path / "r", PLAN, **{**COMMON, "keep_finished_checkpoints": False})
    cfg["resume_from"] = str(droot / "checkpoint_000003")
    again = run_loop(worker_spec(cfg), _Blocks(str(tmp_path / "r" / "ray" / "a2"), 3, str(shards)))
    assert again["status"]["status"] == "finished" and again["losses"] == drop["losses"]  # nothing trained again
    longer = _loop_config(tiny_dir, tmp_path / "l", PLAN, **{**COMMON, "max_steps": 5})
    longer["resume_from"] = str(droot / "checkpoint_000003")
    with pytest.raises(RaycptError, match="last .no optimizer state.: it cannot train on to train.max_steps=5"):
        run_loop(worker_spec(longer), _Blocks(str(tmp_path / "l" / "ray" / "a2"), 3, str(shards)))


def test_publish_by_link_shares_the_files_and_outlives_the_checkpoint(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    shards = ensure_base_shards(tiny_dir, tmp_path / "root" / "base_shards", "float32")
    _, droot = _run(tiny_dir, tmp_path / "root" / "t", shards, keep_finished=False)
    ckpt = droot / "checkpoint_000003"
    want = {k: _bits(v) for k, v in AutoModelForCausalLM.from_pretrained(
        str(ckpt / "model"), dtype=torch.float32).state_dict().items()}
    dest = tmp_path / "root" / "t" / "final_model"
    info = publish_model(ckpt, dest, base_shards=shards, link=True)
    assert info["how"] == "link" and info["bytes"] == 0
    assert os.stat(dest / TRAINED_FILE).st_ino == os.stat(ckpt / "model" / TRAINED_FILE).st_ino
    links = sorted(p.name for p in dest.iterdir() if p.is_symlink())
    assert links == ["layer-000.safetensors", "layer-001.safetensors", "rest.safetensors"]
    assert all((dest / n).resolve().parent == shards.resolve() for n in links)
    import shutil

    shutil.rmtree(ckpt)  # what a finished trial does next (train.keep_finished_checkpoints: false)
    assert verify_model_folder(dest) is None
    got = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32).state_dict()
    assert {k: _bits(v) for k, v in got.items()} == want


def test_publish_without_link_copies(tiny_dir, tmp_path):
    shards = ensure_base_shards(tiny_dir, tmp_path / "root" / "base_shards", "float32")
    _, kroot = _run(tiny_dir, tmp_path / "root" / "t", shards, keep_finished=True)
    ckpt = kroot / "checkpoint_000003"
    info = publish_model(ckpt, tmp_path / "root" / "t" / "final_model", base_shards=shards, link=False)
    assert info["how"] == "reference"
    assert os.stat(tmp_path / "root" / "t" / "final_model" / TRAINED_FILE).st_ino != \
        os.stat(ckpt / "model" / TRAINED_FILE).st_ino


def test_a_checkpoint_just_written_is_not_hashed_again_until_a_file_changes(tiny_dir, tmp_path, monkeypatch):
    shards = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    _, root = _run(tiny_dir, tmp_path / "d", shards, keep_finished=False)
    ckpt = root / "checkpoint_000003"
    hashed = []
    real = ck.sha256_file
    monkeypatch.setattr(ck, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert verify_checkpoint(ckpt) is None and hashed == []  # written by this process: its manifest stands
    f = ckpt / "model" / TRAINED_FILE
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # one bit of the last weight, the size kept: only the hash can tell
    f.write_bytes(bytes(data))
    assert verify_checkpoint(ckpt) == f"model/{TRAINED_FILE} does not match its sha256 in the manifest"
    assert hashed


def test_layer_l2_read_from_a_referencing_folder_equals_the_whole_models(tiny_dir, tmp_path):
    """The scan's per-layer weight change from the trained file alone equals the full comparison of the two loaded
    models (raycpt.diagnostics.similarity.weight_change), and the linked layers are exactly 0."""
    from transformers import AutoModelForCausalLM

    from raycpt.diagnostics.similarity import weight_change
    from raycpt.jobs.contribution import layer_l2
    from raycpt.models.shards import layer_l2_by_reference

    shards = ensure_base_shards(tiny_dir, tmp_path / "root" / "base_shards", "float32")
    cfg = _loop_config(tiny_dir, tmp_path / "root" / "t", dict(name="single", layer=2),
                       **{**COMMON, "keep_finished_checkpoints": False})
    run_loop(worker_spec(cfg), _Blocks(str(tmp_path / "root" / "t" / "ray" / "a1"), 3, str(shards)))
    dest = tmp_path / "root" / "t" / "final_model"
    publish_model(tmp_path / "root" / "t" / "ray" / "a1" / "checkpoint_000003", dest, base_shards=shards, link=True)
    fast = layer_l2_by_reference(dest, tiny_dir, 4)
    a = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    b = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32)
    slow = [row["total"] for row in weight_change(a, b)]
    assert fast[0] == fast[1] == fast[3] == 0.0 == slow[0] == slow[1] == slow[3]
    assert fast[2] > 0 and fast[2] == pytest.approx(slow[2], rel=1e-12)
    assert layer_l2(str(tiny_dir), str(dest)) == fast
    assert layer_l2_by_reference(tiny_dir, tiny_dir, 4) is None  # not a referencing folder: the caller loads both
