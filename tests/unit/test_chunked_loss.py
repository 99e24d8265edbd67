"""The chunked LM-head loss equals transformers' own loss and gradients (float32, rel 1e-5)."""

from __future__ import annotations

import pytest
import torch

from raycpt.strategies import apply_plan, build_plan
from raycpt.train.worker.loss import chunked_lm_loss, chunked_supported, model_loss, plain_lm_loss, shift_labels
from tiny import tiny_model

RTOL = 1e-5


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        scale = float(b[k].abs().max()) or 1.0
        assert float((a[k] - b[k]).abs().max()) <= RTOL * scale + 1e-9, k


def _run(model, ids, labels, chunk):
    """Loss and parameter gradients: through the model's own HF loss (chunk None) or the chunked one."""
    model.zero_grad(set_to_none=True)
    if chunk is None:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    else:
        h = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        loss = chunked_lm_loss(h, model.get_output_embeddings(), labels, chunk,
                               getattr(model.config, "final_logit_softcapping", None))
    loss.backward()
    return float(loss.detach()), _grads(model)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_equals_hf_loss_and_grads_with_padding(arch, chunk):
    model = tiny_model(arch).train()
    if arch == "gemma3":
        model.config.final_logit_softcapping = 3.0  # exercise the softcap (the tiny init's logits are small)
    torch.manual_seed(1)
    ids = torch.randint(4, 128, (3, 21))
    labels = ids.clone()
    labels[0, 15:] = -100  # padding at the end of one row, a hole in another
    labels[1, 3:6] = -100
    ref_loss, ref = _run(model, ids, labels, None)
    loss, got = _run(model, ids, labels, chunk)
    assert loss == pytest.approx(ref_loss, rel=RTOL)
    _close(got, ref)


def test_frozen_head_gets_no_gradient_and_hidden_gradients_match():
    model = tiny_model("qwen3").train()  # untied head
    plan = build_plan(_plan("train_deep"), 4, tied_embeddings=False)
    apply_plan(model, plan)
    assert not model.lm_head.weight.requires_grad
    ids = torch.randint(4, 128, (2, 17))
    ref_loss, ref = _run(model, ids, ids, None)
    loss, got = _run(model, ids, ids, 5)
    assert loss == pytest.approx(ref_loss, rel=RTOL)
    assert "lm_head.weight" not in got
    _close(got, ref)


def test_tied_head_gradient_sums_both_uses():
    model = tiny_model("llama").train()  # tied embeddings: one Parameter for embed and head
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(4, 128, (2, 13))
    ref_loss, ref = _run(model, ids, ids, None)
    loss, got = _run(model, ids, ids, 4)
    assert loss == pytest.approx(ref_loss, rel=RTOL)
    _close(got, ref)


def test_plain_reference_is_a_hand_computed_cross_entropy():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=True)
    h = torch.randn(2, 5, 8)
    y = torch.randint(0, 11, (2, 5))
    y[1, 2] = -100
    # by hand: position t predicts y[t+1]; -100 and the last position are not counted
    z = head(h)
    terms = [torch.logsumexp(z[b, t], 0) - z[b, t, y[b, t + 1]] for b in range(2) for t in range(4) if y[b, t + 1] != -100]
    by_hand = torch.stack(terms).mean()
    assert float(plain_lm_loss(h, head, y)) == pytest.approx(float(by_hand), rel=1e-6)
    hh = h.clone().requires_grad_(True)
    c = chunked_lm_loss(hh, head, y, chunk_tokens=3)
    assert float(c) == pytest.approx(float(by_hand), rel=1e-6)
    c.backward()
    hr = h.clone().requires_grad_(True)
    head.zero_grad()
    torch.stack([torch.logsumexp(head(hr)[b, t], 0) - head(hr)[b, t, y[b, t + 1]] for b in range(2) for t in range(4)
                 if y[b, t + 1] != -100]).mean().backward()
    assert torch.allclose(hh.grad, hr.grad, rtol=1e-5, atol=1e-7)
    assert shift_labels(y)[0].tolist() == y[0, 1:].tolist() + [-100]


def test_model_loss_through_the_wrapped_forward_matches_and_never_builds_logits():
    model = tiny_model("llama").train()
    ids = torch.randint(4, 128, (2, 19))
    shapes = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: shapes.append(tuple(out.shape)))
    ref_loss, ref = float(model_loss(model, model, ids, None)), None
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    ref = _grads(model)
    model.zero_grad(set_to_none=True)
    loss = model_loss(model, model, ids, 8)
    loss.backward()
    hook.remove()
    assert float(loss) == pytest.approx(ref_loss, rel=RTOL)
    _close(_grads(model), ref)
    assert shapes[-1] == (2, 0, 128)  # the head projected no position in the chunked call
    assert chunked_supported(model) is None


def _plan(name):
    from raycpt.config import PlanConfig

    return PlanConfig(name=name, split=0.5)
