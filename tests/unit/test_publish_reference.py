"""A published model that references the base model's per-layer shards instead of copying its frozen layers
(issue 27 item 5): it loads with ``from_pretrained`` bit for bit equal to the trained checkpoint, stores only the
layers that trained, verifies against its manifest, and a publish killed mid-way leaves nothing on the next start."""

import json
import os

import pytest
import torch
from safetensors import safe_open

from raycpt.models.shards import INDEX_FILE, TRAINED_FILE, ensure_base_shards, group_of
from raycpt.train.driver.publish import publish_model, verify_model_folder
from raycpt.train.worker.loop import run_loop
from worker_specs import worker_spec
from raycpt.train.worker.session import InProcessSession, LocalSession
from test_train_loop import _blocks, _loop_config


@pytest.fixture
def trained(tiny_dir, tmp_path):
    """train_deep at r=0.5 of the 4-layer tiny model: layers 2 and 3 train, the rest stays the base's."""
    cfg = _loop_config(tiny_dir, tmp_path / "a", dict(name="train_deep", split=0.5), max_steps=2, checkpoint_every=2,
                       lr=0.01, micro_batch_size=2)
    out = run_loop(worker_spec(cfg), LocalSession(_blocks(), tmp_path / "a" / "ckpts"))
    assert out["status"]["status"] == "finished"
    return tmp_path / "a" / "ckpts" / "checkpoint_000002"


def _tensors(path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_group_of_names_layers_and_the_rest():
    assert group_of("model.layers.7.mlp.up_proj.weight") == "layer-007"
    assert group_of("backbone.layers.12.mixer.A_log") == "layer-012"
    assert group_of("model.embed_tokens.weight") == "rest" and group_of("model.norm.weight") == "rest"
    assert group_of("model.layers_extra.weight") == "rest"


def test_reference_publish_loads_bitwise_and_stores_only_trained_layers(tiny_dir, trained, tmp_path):
    from transformers import AutoModelForCausalLM

    shards = ensure_base_shards(tiny_dir, tmp_path / "root" / "base_shards", "float32")
    assert ensure_base_shards(tiny_dir, tmp_path / "root" / "base_shards", "float32") == shards  # written once
    dest = tmp_path / "trial" / "final_model"
    dest.parent.mkdir()
    info = publish_model(trained, dest, base_shards=shards)
    assert info["how"] == "reference"

    ckpt = _tensors(trained / "model" / "model.safetensors")  # the trained weights, as the worker saved them
    base = _tensors(os.path.join(tiny_dir, "model.safetensors"))
    changed = {k.split(".")[2] for k in ckpt if k.startswith("model.layers.") and _bits(ckpt[k]) != _bits(base[k])}
    assert changed == {"2", "3"}  # the plan's layers moved, the others did not (the naive reading of the files)

    stored = _tensors(dest / TRAINED_FILE)
    assert sorted(stored) == sorted(k for k in ckpt if k.startswith(("model.layers.2.", "model.layers.3.")))
    links = sorted(p.name for p in dest.iterdir() if p.is_symlink())
    assert links == ["layer-000.safetensors", "layer-001.safetensors", "rest.safetensors"]
    assert all(not os.path.isabs(os.readlink(dest / n)) for n in links)  # relative: the run root can move
    weight_map = json.loads((dest / INDEX_FILE).read_text())["weight_map"]
    assert sorted(weight_map) == sorted(ckpt)

    loaded = AutoModelForCausalLM.from_pretrained(str(dest), dtype=torch.float32).state_dict()
    assert all(_bits(loaded[k]) == _bits(ckpt[k]) for k in ckpt)  # every tensor, bit for bit
    real = sum(p.stat().st_size for p in dest.iterdir() if p.is_file() and not p.is_symlink())
    assert real < 0.75 * (trained / "model" / "model.safetensors").stat().st_size
    assert verify_model_folder(dest) is None
    os.remove(shards / "layer-000.safetensors")  # a base shard gone: the published folder no longer verifies
    assert verify_model_folder(dest).startswith("layer-000.safetensors is a link to the base model's shard "
                                                f"{shards / 'layer-000.safetensors'}, which is missing")


def test_a_publish_killed_midway_is_swept_on_the_next_start(tiny_dir, trained, tmp_path):
    from raycpt.config import load_config
    from raycpt.runs.location import locate
    from raycpt.train.driver.launch import _open_run

    run_dir = tmp_path / "train"
    left = run_dir / ".final_model.1a2b3c4d"  # what kill -9 during the publish leaves
    (left / "sub").mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"x" * 1000)
    keep = run_dir / ".final_model_notes"  # not a publish leftover (no ".<id>" after the name): kept
    keep.write_text("mine")
    cfg = load_config(None, [f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}"])
    _open_run(cfg, locate(cfg.tracking, check=False), run_dir, resume=True)
    assert not left.exists() and keep.is_file()
    (run_dir / ".final_model.deadbeef").mkdir()
    publish_model(trained, run_dir / "final_model")  # a publish also sweeps first
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".final_model")) == [".final_model_notes"]
    assert verify_model_folder(run_dir / "final_model") is None


class _Blocks(InProcessSession):
    """The in-process session of Train V2's local mode, reading test blocks instead of a packed store."""

    def batches(self, config):
        from raycpt.data.stream import ArrayBlocks

        return ArrayBlocks(_blocks())


def test_in_process_checkpoints_link_frozen_layers_and_resume_exactly(tiny_dir, tmp_path):
    """InProcessSession with base shards: checkpoints renamed into place, frozen layers linked, the newest
    ``keep`` kept; the same losses as the plain session; a resume from a linked checkpoint continues exactly."""
    from raycpt.train.ckpt.manifest import verify_checkpoint

    common = dict(max_steps=4, checkpoint_every=1, keep_checkpoints=2, lr=0.01, micro_batch_size=2)
    plain = run_loop(worker_spec(_loop_config(tiny_dir, tmp_path / "p", dict(name="train_deep", split=0.5), **common)),
                     LocalSession(_blocks(), tmp_path / "p" / "ckpts"))
    shards = ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    root = tmp_path / "r" / "ray" / "attempt"
    cfg = _loop_config(tiny_dir, tmp_path / "r", dict(name="train_deep", split=0.5), **common)
    linked = run_loop(worker_spec(cfg), _Blocks(str(root), 2, str(shards)))
    assert linked["losses"] == plain["losses"]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_000003", "checkpoint_000004"]  # nothing hidden left
    c3 = root / "checkpoint_000003"
    assert verify_checkpoint(c3) is None
    assert sorted(p.name for p in (c3 / "model").iterdir() if p.is_symlink()) == \
        ["layer-000.safetensors", "layer-001.safetensors", "rest.safetensors"]
    ref = _tensors(tmp_path / "p" / "ckpts" / "checkpoint_000003" / "model" / "model.safetensors")
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(str(c3 / "model"), dtype=torch.float32).state_dict()
    assert all(_bits(got[k]) == _bits(ref[k]) for k in ref)
    cfg_b = _loop_config(tiny_dir, tmp_path / "b", dict(name="train_deep", split=0.5), **common)
    cfg_b["resume_from"] = str(c3)
    resumed = run_loop(worker_spec(cfg_b), _Blocks(str(tmp_path / "b" / "ray" / "a2"), 2, str(shards)))
    assert resumed["losses"] == plain["losses"]  # the step-4 loss after a resume from the linked step-3 checkpoint
