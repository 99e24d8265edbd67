"""The held-out loss without full logits equals the full-logit reference, block by block."""

import pytest
import torch

from raycpt.evaluate.heldout import document_block_scores
from raycpt.train.worker.evaluation import heldout_block_scores
from tiny import tiny_model, tiny_tokenizer


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_chunked_block_losses_equal_the_reference(arch):
    model = tiny_model(arch, num_layers=2)
    if arch == "gemma3":
        model.config.final_logit_softcapping = 3.0  # small, so the cap matters
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(5, 99, (5, 20), generator=g)  # printable ASCII characters but the space
    blocks[:, 6] = blocks[1:4, 13] = 2  # documents end inside the blocks (EOS = 2, the tiny tokenizer's)
    blocks = blocks.tolist()
    want = document_block_scores(model, blocks, 2, batch_size=2)
    got = document_block_scores(model, blocks, 2, batch_size=2, chunk_tokens=7)  # chunks cross run boundaries
    assert got.targets == want.targets
    assert got.losses == pytest.approx(want.losses, rel=1e-5, abs=1e-6)
    assert len(set(round(x, 4) for x in want.losses)) > 1  # the blocks differ: a per-block mix-up would show
    model.train()
    tok = tiny_tokenizer()  # puts its BOS (1) first: every document then starts after it
    both = heldout_block_scores(model, tok, blocks, 2)
    assert both.losses == pytest.approx(document_block_scores(model, blocks, 2, 2, prefix_id=1).losses,
                                        rel=1e-5, abs=1e-6)
    assert both.bytes == [2 * k for k in both.targets]  # it decodes ' X' per token: 2 bytes per counted target
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
