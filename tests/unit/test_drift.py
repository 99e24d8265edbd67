"""Drift: weight change / CKA against the start (diagnostics.drift), and the callback inside the real training loop (no Ray)."""

import json
import math

import numpy as np
import pytest
import torch


def test_drift_metrics_start_and_hand_perturbation():
    from tiny import tiny_model

    from raycpt.diagnostics.drift import drift_metrics, layer_params, layer_states

    model = tiny_model("llama", 3)
    ids = torch.tensor([[1, 10, 20, 30, 40, 50], [1, 11, 21, 31, 41, 51]])
    start_p, start_s = layer_params(model), layer_states(model, ids)
    m = drift_metrics(start_p, start_s, model, ids)
    assert all(m[f"drift.dW.L{i:02d}"] == 0.0 for i in range(3))
    assert all(m[f"drift.cka.L{i:02d}"] == pytest.approx(1.0) for i in range(3))
    with torch.no_grad():
        w = model.model.layers[2].mlp.down_proj.weight
        w.add_(0.25)
    m = drift_metrics(start_p, start_s, model, ids)
    assert m["drift.dW.L02"] == pytest.approx(0.25 * math.sqrt(w.numel()), rel=1e-6)
    assert m["drift.dW.L00"] == 0.0 and m["drift.dW.L01"] == 0.0
    assert m["drift.cka.L00"] == pytest.approx(1.0) and m["drift.cka.L01"] == pytest.approx(1.0)
    assert m["drift.cka.L02"] < 1.0


def test_drift_callback_in_training_loop_single_layer(tiny_dir, tmp_path):
    """plan single layer 1: only layer 1 moves; CKA of layer 0 stays 1; steps 0, 2, 4 recorded."""
    from transformers import AutoTokenizer

    from raycpt.config import ExperimentConfig, PlanConfig, TrainConfig, config_to_dict
    from raycpt.diagnostics.drift import probe_ids
    from raycpt.train.worker.callbacks import DriftCallback
    from raycpt.strategies import build_plan
    from raycpt.train.worker.loop import run_loop
    from worker_specs import worker_spec
    from raycpt.train.worker.session import LocalSession

    cfg = ExperimentConfig(train=TrainConfig(max_steps=4, micro_batch_size=2, lr=1e-2, warmup_ratio=0.0,
                                             checkpoint_every=4, drift_every=2),
                           plan=PlanConfig(name="single", layer=1))
    plan = build_plan(cfg.plan, 4)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    probe = probe_ids(tok, ["hello world, a probe text", "another probe sentence here"])
    cb = DriftCallback(2, str(tiny_dir), probe)
    blocks = np.random.default_rng(0).integers(4, 120, size=(16, 16))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_loop(worker_spec({"cfg": config_to_dict(cfg), "model_path": str(tiny_dir), "plan": plan.to_dict(),
              "run_dir": str(run_dir), "mlflow": None, "torch_threads": 1, "callbacks": [cb]}),
             LocalSession(blocks, tmp_path / "ckpts"))
    hist = json.loads((run_dir / "drift.json").read_text())
    assert [h["step"] for h in hist] == [0, 2, 4]
    assert all(h["drift.dW.L00"] == 0 and h["drift.dW.L02"] == 0 and h["drift.dW.L03"] == 0 for h in hist)
    assert hist[0]["drift.dW.L01"] == 0 and hist[1]["drift.dW.L01"] > 0
    assert hist[2]["drift.dW.L01"] > hist[1]["drift.dW.L01"]
    assert all(h["drift.cka.L00"] == pytest.approx(1.0) for h in hist)
    assert (run_dir / "drift.png").is_file()
