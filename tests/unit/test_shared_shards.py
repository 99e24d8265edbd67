"""Issue 41: shared base shards no one damages by accident. Two trials of one run root reference the base model's
shards; the shard files are read-only; a byte flipped through one trial's link (as root, who ignores the mode) is
named as a damaged *shared* shard with the models that share it; a moved shards folder is named as links leading
nowhere; ``raycpt runs export`` writes a standalone folder that loads bit for bit like the trial's model; a weight
file cut short beside (or without) a manifest is one line before transformers reads it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from raycpt.errors import RaycptError
from raycpt.models.shards import config_weights_problem, ensure_base_shards, safetensors_problem, weights_problem
from raycpt.train.driver.publish import publish_model, verify_model_folder
from test_publish_reference import trained  # noqa: F401 - the fixture


@pytest.fixture
def two_trials(tiny_dir, trained, tmp_path):  # noqa: F811
    root = tmp_path / "runs"
    shards = ensure_base_shards(tiny_dir, root / "base_shards", "float32")
    models = []
    for name in ("a", "b"):
        dest = root / "sweep-x-1" / "trials" / name / "train" / "final_model"
        dest.parent.mkdir(parents=True)
        publish_model(trained, dest, base_shards=shards)
        models.append(dest)
    return root, shards, models


def _state(folder) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            out.update({k: sf.get_tensor(k) for k in sf.keys()})
    return out


def test_base_shard_files_are_read_only(two_trials):
    _, shards, models = two_trials
    files = list(shards.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o444 for f in files)
    if os.geteuid() != 0:  # as root the mode does not stop a write: the damage check below is what catches it
        with pytest.raises(PermissionError):
            open(models[0] / "rest.safetensors", "r+b")


def test_a_byte_flipped_through_one_trials_link_names_the_shared_shard_and_its_users(two_trials):
    root, shards, (a, b) = two_trials
    assert verify_model_folder(b) is None
    target = os.path.realpath(a / "rest.safetensors")
    os.chmod(target, 0o644)  # what a careless tool (or root) does
    with open(a / "rest.safetensors", "r+b") as f:  # through trial A's link
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 0xFF]))
    why = verify_model_folder(b)  # trial B was never touched
    assert why.startswith(f"rest.safetensors is a link to the base model's shard {target}, which is damaged "
                          f"(shared by 2 model(s) of {root}: sweep-x-1/trials/a/train/final_model, "
                          "sweep-x-1/trials/b/train/final_model")
    assert f"delete {shards} and the next sweep or scan of this run root writes it again" in why
    from raycpt.jobs.eval import check_model_files

    with pytest.raises(RaycptError) as e:
        check_model_files(b, str(b))
    assert "evaluate another checkpoint" not in str(e.value) and "shared by 2 model(s)" in str(e.value)


def test_the_shards_folder_moved_aside_is_named_as_links_leading_nowhere(two_trials):
    root, shards, (a, _) = two_trials
    shutil.move(str(shards), str(root / "elsewhere"))
    why = verify_model_folder(a)
    assert why.startswith("layer-000.safetensors is a link to the base model's shard") and "which is missing" in why
    assert f"{shards} is not a cache; put it back" in why


def test_runs_export_writes_a_standalone_folder_that_loads_like_the_trial(two_trials, tmp_path):
    from transformers import AutoModelForCausalLM

    root, shards, (a, _) = two_trials
    out = tmp_path / "exported"
    r = subprocess.run([sys.executable, "-m", "raycpt", "runs", "export", str(a.parent.parent), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith(f"exported {a} to {out}: "), r.stderr[-2000:]
    assert not any(p.is_symlink() for p in out.rglob("*"))
    shutil.rmtree(root)  # the run root, shards and all, gone: the export stands alone
    got = AutoModelForCausalLM.from_pretrained(out).state_dict()
    want = _state(tmp_path / "a" / "ckpts" / "checkpoint_000002" / "model")  # the trained checkpoint's own file
    assert set(got) >= set(want)
    for k, t in want.items():
        assert torch.equal(got[k], t), k
    again = subprocess.run([sys.executable, "-m", "raycpt", "runs", "export", str(out), str(out)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists and is not empty" in again.stderr


def _cut(path, keep):
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_a_cut_short_weight_file_beside_a_verified_manifest_is_one_line(two_trials, tiny_dir, tmp_path):
    _, _, (a, _) = two_trials
    stray = a / "model.safetensors"  # not in the manifest, and transformers would read it
    shutil.copy(os.path.join(tiny_dir, "model.safetensors"), stray)
    _cut(stray, stray.stat().st_size // 2)
    assert verify_model_folder(a) == ("model.safetensors is not in its manifest (a weight file added after the model "
                                      "was written, which transformers would load): remove it")
    plain = tmp_path / "plain"  # no manifest: the header and the file's length decide
    shutil.copytree(tiny_dir, plain)
    size = (plain / "model.safetensors").stat().st_size
    _cut(plain / "model.safetensors", size - 100)
    assert weights_problem(plain) == (f"model.safetensors has {size - 100:,} bytes, its header lays out {size:,} "
                                      "(cut short or damaged)")
    _cut(plain / "model.safetensors", 5)
    assert "is not a whole safetensors file" in safetensors_problem(plain / "model.safetensors")
    from raycpt.models.sources import load_model

    with pytest.raises(RaycptError, match=r"^model folder .*plain: model.safetensors is not a whole safetensors"):
        load_model(str(plain), device="cpu")
    assert weights_problem(tiny_dir) is None


def test_a_config_that_does_not_belong_to_its_weights_is_refused_before_a_plan(tiny_dir, tmp_path):
    from raycpt.config import ModelConfig
    from raycpt.models.sources import resolve_model_path

    odd = tmp_path / "odd"
    shutil.copytree(tiny_dir, odd)
    conf = json.loads((odd / "config.json").read_text())
    conf["num_hidden_layers"] = 30
    (odd / "config.json").write_text(json.dumps(conf))
    assert config_weights_problem(tiny_dir) is None
    with pytest.raises(RaycptError) as e:
        resolve_model_path(ModelConfig(ref=str(odd)))
    assert str(e.value) == (f"model folder {odd}: config.json declares 30 decoder layers, its weights hold 4 (layers "
                            "0..3): the config does not belong to these weights")
