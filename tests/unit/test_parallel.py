"""raycpt's own wrapping, without processes: names, the one-worker path, the refusals, the hook order."""

import pytest
import torch

from raycpt.errors import RaycptError
from raycpt.train.worker import parallel
from tiny import tiny_model


def test_one_worker_gets_the_bare_model_and_fsdp_needs_two():
    model = tiny_model("llama", num_layers=2)
    assert parallel.wrap_model(model, torch.device("cpu"), "ddp", 1) is model
    with pytest.raises(RaycptError, match=r"^train.distributed=fsdp with train.num_workers=1: FSDP shards over at "
                                          r"least 2 workers"):
        parallel.wrap_model(model, torch.device("cpu"), "fsdp", 1)


def test_plain_names_and_local_tensors():
    assert parallel.plain_name("module.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert parallel.plain_name("model.layers.0._checkpoint_wrapped_module.mlp.w") == "model.layers.0.mlp.w"
    t = torch.ones(3)
    assert parallel.local_tensor(t) is t and parallel.full_tensor(t) is t


def test_mixed_precision_policy_is_bf16_params_fp32_reduce():
    mp = parallel.mixed_precision(True)
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert parallel.mixed_precision(False).param_dtype is None


def test_the_frozen_prefix_hook_runs_before_hooks_registered_earlier():
    """Prepended: under FSDP2 its re-enabling of grad comes before FSDP's own pre-forward of that layer."""
    from raycpt.config import PlanConfig
    from raycpt.strategies import apply_plan, plan_for_model
    from raycpt.train.worker.steps import FrozenPrefix

    model = tiny_model("llama", num_layers=4)
    plan = plan_for_model(PlanConfig(name="train_deep", split=0.5), model)
    apply_plan(model, plan)
    seen = []
    model.get_decoder().layers[2].register_forward_pre_hook(lambda m, a: seen.append(torch.is_grad_enabled()))
    prefix = FrozenPrefix(model, plan)
    model(input_ids=torch.tensor([[5, 6, 7]]))
    prefix.remove()
    assert seen == [True]  # the earlier hook already sees grad mode back on
