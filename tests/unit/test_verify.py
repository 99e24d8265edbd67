"""The freeze check fails when a run would not train its plan: each way of going wrong is caught, named by part."""

import pytest
import torch

from raycpt.config import PlanConfig, TrainConfig
from raycpt.errors import RaycptError
from raycpt.strategies import apply_plan, plan_for_model
from raycpt.train.worker import verify
from raycpt.train.worker.steps import FrozenPrefix, make_optimizer
from tiny import tiny_model


def _setup(spec=dict(name="train_deep", split=0.5)):
    model = tiny_model("llama", num_layers=4)
    model.train()
    plan = plan_for_model(PlanConfig(**spec), model)
    apply_plan(model, plan)
    opt = make_optimizer(model, plan, TrainConfig(lr=1e-2))
    return model, plan, opt


def _backward(model):
    ids = torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()


def test_a_correct_setup_and_step_pass_and_the_table_counts_by_hand():
    model, plan, opt = _setup()
    rows = {r.part: r for r in verify.check_setup(model, plan, opt, "after wrapping")}
    n_layer = len(list(model.get_decoder().layers[2].parameters()))
    assert rows["layers.2"].planned == rows["layers.2"].trainable == rows["layers.2"].in_optimizer == n_layer
    assert rows["layers.0"].planned == rows["layers.0"].in_optimizer == 0
    prefix = FrozenPrefix(model, plan)
    _backward(model)
    prefix.remove()
    grads, before = verify.grad_presence(model), verify.frozen_fingerprints(model)
    opt.step()
    rows = {r.part: r for r in verify.check_step(model, plan, opt, grads, before)}
    assert rows["layers.3"].got_grad == n_layer and rows["layers.1"].got_grad == 0
    assert all(r.frozen_changed == 0 for r in rows.values())
    text = verify.table_text(list(rows.values()), "after the first step")
    assert "layers.3" in text and "got_grad" in text


def test_a_layer_whose_gradient_is_dropped_is_named():
    model, plan, opt = _setup()
    _backward(model)
    for p in model.get_decoder().layers[2].parameters():
        p.grad = None  # what the FSDP1 frozen-prefix bug did to the first trainable layer
    grads, before = verify.grad_presence(model), verify.frozen_fingerprints(model)
    with pytest.raises(RaycptError, match=r"^freeze check after the first step: layers\.2: .* but 0 received a "
                                          r"gradient") as e:
        verify.check_step(model, plan, opt, grads, before)
    assert "\n" not in str(e.value)


def test_a_parameter_missing_from_the_optimizer_is_named():
    model, plan, opt = _setup()
    drop = model.get_decoder().layers[3].mlp.up_proj.weight
    for g in opt.param_groups:
        g["params"] = [p for p in g["params"] if p is not drop]
    with pytest.raises(RaycptError, match=r"layers\.3: .* the optimizer holds"):
        verify.check_setup(model, plan, opt, "after wrapping")


def test_a_frozen_parameter_that_changes_is_caught_to_the_bit():
    model, plan, opt = _setup()
    _backward(model)
    grads, before = verify.grad_presence(model), verify.frozen_fingerprints(model)
    w = model.get_decoder().layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        bits = w.view(torch.int32)
        bits[3, 5] ^= 1  # one bit of one element
    with pytest.raises(RaycptError, match=r"layers\.0: 1 of its frozen tensors changed"):
        verify.check_step(model, plan, opt, grads, before)


def test_requires_grad_that_disagrees_with_the_plan_is_named():
    model, plan, opt = _setup()
    model.get_decoder().layers[1].input_layernorm.weight.requires_grad_(True)
    with pytest.raises(RaycptError, match=r"layers\.1: the plan trains 0 .* but 1 require grad"):
        verify.check_setup(model, plan, opt, "after wrapping")


def test_a_resumed_optimizer_without_state_for_a_trainable_tensor_is_refused():
    model, plan, opt = _setup()
    _backward(model)
    opt.step()
    opt.state.pop(model.get_decoder().layers[2].mlp.down_proj.weight)
    with pytest.raises(RaycptError, match=r"layers\.2: 1 trainable tensors have no optimizer state"):
        verify.check_setup(model, plan, opt, "after loading the checkpoint", resumed=True)


def test_fingerprint_differs_for_a_permutation_and_ignores_nothing():
    t = torch.arange(6, dtype=torch.float32)
    assert verify.fingerprint(t) == verify.fingerprint(t.clone())
    assert verify.fingerprint(t) != verify.fingerprint(t.flip(0))
    assert verify.fingerprint(t.to(torch.bfloat16)) != verify.fingerprint((t + 1).to(torch.bfloat16))


def test_a_tied_head_planned_to_train_is_counted_under_embed_and_checked_against_apply_plan():
    """A hand-built plan (build_plan never makes one: it sets both flags for tied embeddings) asking for the head
    only: the shared matrix is counted under embed, and apply_plan, which finds no tensor of its own under head,
    leaves it frozen; the check says so instead of training without the head."""
    from raycpt.strategies import LayerPlan

    model = tiny_model("llama", num_layers=4)  # tied
    plan = LayerPlan(name="layers", num_layers=4, trainable_layers=(3,), train_head=True, tied_embeddings=True)
    apply_plan(model, plan)
    opt = make_optimizer(model, plan, TrainConfig(lr=1e-2))
    with pytest.raises(RaycptError, match=r"after wrapping: embed: the plan trains 1 of its 1 tensors but 0 require"):
        verify.check_setup(model, plan, opt, "after wrapping")
    both = LayerPlan(name="layers", num_layers=4, trainable_layers=(3,), train_head=True, train_embeddings=True,
                     tied_embeddings=True)
    apply_plan(model, both)
    opt = make_optimizer(model, both, TrainConfig(lr=1e-2))
    rows = {r.part: r for r in verify.check_setup(model, both, opt, "after wrapping")}
    assert rows["embed"].planned == rows["embed"].trainable == 1 and rows["head"].tensors == 0
