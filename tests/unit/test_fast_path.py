"""The fast-path options (``train.sdpa_backend``, ``train.fused_adamw``, ``train.compile_layers``) reach the model and
the optimizer through raycpt's real training path (:func:`raycpt.train.worker.loop.run_loop`), and each falls back
with one line where the device lacks it."""

import logging

import numpy as np
import pytest
import torch

from raycpt.config import PlanConfig, TrainConfig
from raycpt.strategies import apply_plan, plan_for_model
from raycpt.train.worker.loop import run_loop
from raycpt.train.worker.session import LocalSession
from raycpt.train.worker.step_options import compile_decoder_layers
from raycpt.train.worker.steps import make_optimizer
from test_train_loop import _loop_config
from tiny import tiny_model
from worker_specs import worker_spec

OPTIONS_LOG = "raycpt.train.worker.step_options"


def _run(tiny_dir, tmp_path, **train) -> dict:
    blocks = np.random.default_rng(0).integers(4, 128, size=(8, 16)).astype(np.int32)
    cfg = _loop_config(tiny_dir, tmp_path, dict(name="train_deep", split=0.5), max_steps=1, checkpoint_every=1,
                       micro_batch_size=2, **train)
    return run_loop(worker_spec(cfg), LocalSession(blocks))


@pytest.mark.parametrize("backend,ran,fallback", [
    ("auto", ["flash_cpu"], None),  # torch's CPU flash kernel (aten::_scaled_dot_product_flash_attention_for_cpu)
    ("math", ["math"], None),  # forced: the slow reference path (aten::_scaled_dot_product_attention_math)
    ("cudnn", ["flash_cpu"], "train.sdpa_backend=cudnn: a CUDA kernel; cpu uses torch's own choice (auto)"),
])
def test_sdpa_backend_reaches_the_forward_and_the_kernel_that_ran_is_reported(tiny_dir, tmp_path, caplog, backend,
                                                                              ran, fallback):
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOG):
        out = _run(tiny_dir, tmp_path, sdpa_backend=backend)
    assert out["sdpa_ran"] == ran
    lines = [r.getMessage() for r in caplog.records if r.name == OPTIONS_LOG]
    assert lines == ([fallback] if fallback else [])
    assert out["fallbacks"] == lines


def test_fused_adamw_reaches_the_optimizer(tiny_dir, tmp_path):
    assert _run(tiny_dir, tmp_path / "on", fused_adamw="true")["optimizer_fused"] is True  # torch 2.13 fuses on CPU
    assert _run(tiny_dir, tmp_path / "auto")["optimizer_fused"] is False  # default: fused on CUDA only
    model = tiny_model("llama", num_layers=4)
    plan = plan_for_model(PlanConfig(name="full"), model)
    assert make_optimizer(model, plan, TrainConfig(fused_adamw=True)).defaults["fused"] is True
    assert not make_optimizer(model, plan, TrainConfig(fused_adamw=False)).defaults["fused"]


def test_fused_adamw_falls_back_with_one_line_where_torch_refuses_it(caplog, monkeypatch):
    """torch 2.13 builds a fused AdamW for every device this machine has (cpu, meta): its refusal, as it words it
    for a device without the kernel, stands in for one."""
    real = torch.optim.AdamW

    def refusing(params, fused=None, **kw):
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               "devices: ['cuda', 'xpu', 'privateuseone'] but torch.float32 and cpu")
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", refusing)
    model = tiny_model("llama", num_layers=4)
    plan = plan_for_model(PlanConfig(name="full"), model)
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOG):
        opt = make_optimizer(model, plan, TrainConfig(fused_adamw=True))
    assert isinstance(opt, real) and not opt.defaults["fused"]
    lines = [r.getMessage() for r in caplog.records if r.name == OPTIONS_LOG]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("train.fused_adamw: torch has no fused AdamW for these parameters on cpu (`fused=True`")
    assert lines[0].endswith("; using its default")


def test_compile_layers_falls_back_to_eager_on_a_cpu_with_one_line(tiny_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOG):
        out = _run(tiny_dir, tmp_path, compile_layers="true")
    want = "train.compile_layers=true: torch.compile (inductor) runs on CUDA here; cpu runs the decoder layers eagerly"
    assert [r.getMessage() for r in caplog.records if r.name == OPTIONS_LOG] == [want]
    assert out["fallbacks"] == [want] and out["status"]["status"] == "finished"


def test_compile_layers_compiles_every_decoder_layer_in_place():
    """Through a recording torch.compile backend (runs on a CPU): every layer's forward is traced into graphs that
    hold its projections, the logits are the eager model's, and the state dict's names are unchanged."""
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    eager, model = tiny_model("llama", num_layers=4), tiny_model("llama", num_layers=4)
    apply_plan(model, plan_for_model(PlanConfig(name="train_deep", split=0.5), model))
    keys = list(model.state_dict())
    assert compile_decoder_layers(model, TrainConfig(compile_layers=False), torch.device("cpu"), recording) is None
    assert not graphs and all("forward" not in vars(layer) for layer in model.model.layers)
    assert compile_decoder_layers(model, TrainConfig(compile_layers=True), torch.device("cpu"), recording) is None
    assert all("forward" in vars(layer) for layer in model.model.layers)  # the instance's own (compiled) forward
    ids = torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, eager(ids).logits)
    assert graphs, "no layer went through torch.compile"
    targets = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op in ("call_function", "call_module")}
    assert any("linear" in t for t in targets), sorted(targets)[:20]
    assert list(model.state_dict()) == keys
