"""The held-out loss without full logits equals the full-logit reference, block by block."""

import pytest
import torch

from raycpt.evaluate.heldout import lm_block_losses
from raycpt.train.worker.evaluation import heldout_block_losses
from raycpt.train.worker.loss import chunked_block_losses
from tiny import tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_chunked_block_losses_equal_the_reference(arch):
    model = tiny_model(arch, num_layers=2)
    if arch == "gemma3":
        model.config.final_logit_softcapping = 3.0  # small, so the cap matters
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(4, 128, (5, 20), generator=g).tolist()
    want = lm_block_losses(model, blocks, batch_size=2)
    got = chunked_block_losses(model, blocks, batch_size=2, chunk_tokens=7)  # chunks cross block boundaries
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert len(set(round(x, 4) for x in want)) > 1  # the blocks differ: a per-block mix-up would show
    model.train()
    assert heldout_block_losses(model, blocks, 2) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert model.training  # left as it was


def test_a_model_goes_on_a_gpu_only_where_one_was_reserved():
    from raycpt.train.driver.final_eval import eval_device

    assert eval_device(cuda_available=True, in_ray_worker=True, reserved_gpus=0) == "cpu"  # a CPU-only trial
    assert eval_device(cuda_available=True, in_ray_worker=True, reserved_gpus=1) == "cuda"
    assert eval_device(cuda_available=True, in_ray_worker=False, reserved_gpus=0) == "cuda"  # a driver, own machine
    assert eval_device(cuda_available=False, in_ray_worker=True, reserved_gpus=1) == "cpu"


def test_traces_load_in_float32_unless_asked():
    from raycpt.config import ConfigError, load_config, trace_dtype

    assert trace_dtype(load_config(None, [])) == "float32"
    assert trace_dtype(load_config("configs/qwen3-0.6b.yaml")) == "float32"  # a GPU config too: model.dtype is auto
    assert trace_dtype(load_config(None, ["trace.dtype=bfloat16"])) == "bfloat16"
    assert trace_dtype(load_config(None, ["trace.dtype=auto", "model.dtype=bfloat16"])) == "bfloat16"
    with pytest.raises(ConfigError):
        load_config(None, ["trace.dtype=int8"])
