"""Checkpoints without Ray: the manifest catches every kind of damage, state loads with
weights_only, bf16 checkpoints keep float32 master weights (exact resume), non-finite weights are
never checkpointed, the published model is a verified copy, Tune's restore folder must be private."""

import copy
import json
import math
import os
import pickle

import numpy as np
import pytest
import torch

from raycpt.errors import RaycptError
from raycpt.train.ckpt.checkpoint import json_safe, read_train_state
from raycpt.train.ckpt.manifest import STATE_PT, find_checkpoints, verify_checkpoint
from raycpt.train.driver.publish import publish_model, verify_model_folder
from raycpt.train.worker.callbacks import StepCallback
from raycpt.train.worker.loop import run_loop
from raycpt.train.worker.session import LocalSession
from worker_specs import worker_spec
from test_train_loop import _blocks, _loop_config


@pytest.fixture
def finished(tiny_dir, tmp_path):
    cfg = _loop_config(tiny_dir, tmp_path / "a", dict(name="train_deep", split=0.5), max_steps=4, checkpoint_every=2,
                       lr=0.01, micro_batch_size=2)
    out = run_loop(worker_spec(cfg), LocalSession(_blocks(), tmp_path / "a" / "ckpts"))
    assert out["status"]["status"] == "finished"
    return cfg, out, tmp_path / "a" / "ckpts"


def test_manifest_catches_truncation_edit_missing_file_and_absent_manifest(finished):
    _, _, root = finished
    c2, c4 = root / "checkpoint_000002", root / "checkpoint_000004"
    assert verify_checkpoint(c2) is None and verify_checkpoint(c4) is None
    assert [s for s, _ in find_checkpoints(root)] == [2, 4]
    w = c4 / "model" / "model.safetensors"
    size = w.stat().st_size
    with open(w, "r+b") as f:  # truncate half of the newest weights, as the tryout did
        f.truncate(size // 2)
    failed = []
    assert [s for s, _ in find_checkpoints(root, failed)] == [2]
    assert failed == [(c4, f"model/model.safetensors has {size // 2} bytes, the manifest says {size}")]
    # same size, one byte flipped
    p = c2 / "train_state.json"
    data = bytearray(p.read_bytes())
    data[-2] ^= 1
    p.write_bytes(bytes(data))
    assert verify_checkpoint(c2) == "train_state.json does not match its sha256 in the manifest"
    p.unlink()
    assert verify_checkpoint(c2) == "train_state.json is missing"
    (c2 / "manifest.json").unlink()
    assert "no readable manifest.json" in verify_checkpoint(c2)


def test_state_is_tensors_and_json_and_a_pickle_is_refused(finished, tmp_path):
    _, out, root = finished
    c4 = root / "checkpoint_000004"
    raw = torch.load(c4 / STATE_PT, weights_only=True)  # raises if anything but tensors/containers
    assert set(raw) == {"optimizer", "scheduler", "rng"}
    meta = json.loads((c4 / "train_state.json").read_text())
    assert meta["losses"] == out["losses"] and meta["weights_dtype"] == "float32"
    assert len(meta["rng"][0]["numpy"][1]) == 624 and len(meta["rng"][0]["python"][1]) == 625
    state = read_train_state(c4)
    assert state["step"] == 4 and state["master"] is None

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train_state.json").write_text((c4 / "train_state.json").read_text())
    with open(bad / STATE_PT, "wb") as f:
        torch.save({"optimizer": Evil()}, f, pickle_module=pickle)
    with pytest.raises(RaycptError, match="holds more than tensors"):
        read_train_state(bad)
    assert not (tmp_path / "pwned").exists()


def test_bf16_checkpoint_has_bf16_weights_float32_master_and_resumes_exactly(tiny_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    common = dict(max_steps=4, checkpoint_every=2, lr=0.01, micro_batch_size=2, precision="bf16")
    cfg = _loop_config(tiny_dir, tmp_path / "a", dict(name="train_deep", split=0.5), **common)
    full = run_loop(worker_spec(cfg), LocalSession(_blocks(), tmp_path / "a" / "ckpts"))
    c2 = tmp_path / "a" / "ckpts" / "checkpoint_000002"
    w = load_file(str(c2 / "model" / "model.safetensors"))
    assert {v.dtype for v in w.values()} == {torch.bfloat16}
    master = read_train_state(c2)["master"]
    assert master and {v.dtype for v in master.values()} == {torch.float32}
    assert all(torch.equal(master[k].to(torch.bfloat16), w[k]) for k in master if k in w)
    # the float32 checkpoint of the same run is twice the size on disk
    assert json.loads((c2 / "manifest.json").read_text())["weights_dtype"] == "bfloat16"
    m = AutoModelForCausalLM.from_pretrained(str(c2 / "model"))
    assert next(m.parameters()).dtype == torch.bfloat16
    cfg_b = copy.deepcopy(cfg)
    cfg_b.update(run_dir=str(tmp_path / "b"), resume_from=str(c2))
    resumed = run_loop(worker_spec(cfg_b), LocalSession(_blocks(), tmp_path / "b" / "ckpts"))
    assert resumed["losses"] == full["losses"]  # master weights kept: the resume is bitwise exact
    ma = read_train_state(tmp_path / "a" / "ckpts" / "checkpoint_000004")["master"]
    mb = read_train_state(tmp_path / "b" / "ckpts" / "checkpoint_000004")["master"]
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


class _Poison(StepCallback):
    """Sets one weight to inf after the step-2 update (as an overflowing update would), before the checkpoint."""

    every = 1

    def on_step_end(self, state):
        if state.step == 2:
            with torch.no_grad():
                next(p for p in state.model.parameters() if p.requires_grad)[0, 0] = math.inf
        return {"poisoned": math.inf if state.step == 2 else 0.0}


def test_nonfinite_weights_are_never_checkpointed(tiny_dir, tmp_path):
    cfg = _loop_config(tiny_dir, tmp_path, dict(name="train_shallow", split=0.5), max_steps=4, checkpoint_every=1,
                       lr=0.01, micro_batch_size=2)
    cfg["callbacks"] = [_Poison()]
    out = run_loop(worker_spec(cfg), LocalSession(_blocks(), tmp_path / "ckpts"))
    from transformers import AutoModelForCausalLM

    n = sum(v.is_floating_point() for v in AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict().values())
    assert out["status"] == {"status": "nonfinite", "step": 2, "what": "weights",
                             "value": f"1 of {n} weight tensors are not finite", "last_checkpoint_step": 1}
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["checkpoint_000001"]
    lines = (tmp_path / "train_metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in train_metrics.jsonl"))
            for line in lines]  # strict JSON: no bare NaN/Infinity
    assert [r["poisoned"] for r in recs if "poisoned" in r] == [0.0, "inf"]


def test_json_safe():
    assert json_safe({"a": [1.0, math.nan], "b": math.inf, "c": "x"}) == {"a": [1.0, "nan"], "b": "inf", "c": "x"}


def test_publish_is_a_verified_copy_that_the_checkpoint_cannot_change(finished, tmp_path):
    _, _, root = finished
    c4 = root / "checkpoint_000004"
    dest = tmp_path / "final_model"
    info = publish_model(c4, dest)
    assert info["how"] in ("reflink", "copy") and info["files"] >= 2
    a, b = c4 / "model" / "model.safetensors", dest / "model.safetensors"
    assert os.stat(a).st_ino != os.stat(b).st_ino and os.stat(b).st_nlink == 1
    assert verify_model_folder(dest) is None
    with open(a, "r+b") as f:  # corrupting the checkpoint leaves the published model intact
        f.truncate(a.stat().st_size // 2)
    assert verify_model_folder(dest) is None
    with pytest.raises(RaycptError, match="fails its manifest check"):
        publish_model(c4, tmp_path / "again")
    assert not (tmp_path / "again").exists()


def test_private_folder_check(tmp_path):
    from raycpt.runs import assert_private_folder

    d = tmp_path / "tune"
    (d / "exp").mkdir(parents=True)
    (d / "exp" / "tuner.pkl").write_bytes(b"x")
    for p in (d, d / "exp"):
        os.chmod(p, 0o755)
    os.chmod(d / "exp" / "tuner.pkl", 0o644)
    assert assert_private_folder(d) == d
    os.chmod(d / "exp" / "tuner.pkl", 0o664)
    with pytest.raises(RaycptError, match=r"tuner.pkl is writable by group or others \(mode 664\)"):
        assert_private_folder(d)
    os.chmod(d / "exp" / "tuner.pkl", 0o644)
    os.chmod(d / "exp", 0o777)
    with pytest.raises(RaycptError, match="exp is writable by group or others"):
        assert_private_folder(d)
