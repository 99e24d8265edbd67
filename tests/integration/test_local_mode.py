"""Train V2's local mode (issue 28) and a run folder sized to the work (issue 27 item 5), on a local Ray:
one CPU worker run in the calling process trains the same per-step losses as a worker group, its checkpoints
land where a worker group's do, its reference-published final_model/ equals the copied one bit for bit, it
keeps no checkpoint once finished, and --resume of the finished run still returns it."""

import json

import torch

from raycpt.config import load_config
from test_train import _base


def _state(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()


def test_local_mode_same_losses_reference_publish_and_resume_after_finish(ray_local, tmp_path, tiny_dir):
    from train_runs import train_command

    base = _base(tmp_path, tiny_dir, num_workers=1, max_steps=4, checkpoint_every=2)
    group = train_command(load_config(None, base + ["name=group"]))
    lean = base + ["name=local", "train.publish=reference", "train.keep_finished_checkpoints=false"]
    local = train_command(load_config(None, lean), in_process=True)

    assert local.steps == group.steps == [1, 2, 3, 4]
    assert local.losses == group.losses  # the same loop, the same threads: the same floats
    state = json.loads((local.run_dir / "state.json").read_text())
    assert state["clock"]["local_mode"] is True
    group_state = json.loads((group.run_dir / "state.json").read_text())
    assert group_state["clock"]["local_mode"] is False
    assert sorted(p.name for p in (group.run_dir / "ray").glob("*/checkpoint_*") if p.is_dir()) == \
        ["checkpoint_000002", "checkpoint_000004"]
    assert [p for p in (local.run_dir / "ray").glob("*/checkpoint_*") if p.is_dir()] == []  # finished: nothing to resume from

    a, b = _state(group.final_model_dir), _state(local.final_model_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    links = sorted(p.name for p in local.final_model_dir.iterdir() if p.is_symlink())
    assert links == ["layer-000.safetensors", "layer-001.safetensors", "rest.safetensors"]  # train_deep of 4 layers

    again = train_command(load_config(None, lean), resume=True, in_process=True)
    assert again.reused and again.losses == local.losses and again.final_model_dir == local.final_model_dir
