"""Spectrum as its authors run it, against a hand computation: per weight type, Spectrum's value (SNR / s_max)
from a numpy SVD, the top int(n * percent / 100) of each type, the embeddings and head always, an infinite SNR
(all singular values equal: nothing at or below the Marchenko-Pastur edge) first in its type; the plan trains
exactly those tensors (requires_grad, the freeze check, the plan table's count)."""

import numpy as np
import pytest
import torch

from raycpt.config import PlanConfig
from raycpt.diagnostics.spectrum import matrix_names, spectrum_order, spectrum_pick, spectrum_snr
from raycpt.errors import RaycptError
from raycpt.strategies import apply_plan, build_plan, plan_table
from raycpt.train.worker import verify
from raycpt.train.worker.steps import make_optimizer
from raycpt.config import TrainConfig
from tiny import tiny_model

TYPES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")


def _hand_value(w: np.ndarray) -> float:
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    sigma = (np.percentile(s, 75) - np.percentile(s, 25)) / 1.349
    edge = sigma * (1 + np.sqrt(min(w.shape) / max(w.shape)))
    noise = s[s <= edge].sum()
    return (np.inf if noise == 0 else s[s > edge].sum() / noise) / s.max()


def _model():
    model = tiny_model("llama", num_layers=6, seed=3)
    with torch.no_grad():  # layer 4's q_proj: an orthogonal matrix x 3, every singular value 3 -> SNR = +inf
        q, _ = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(0)))
        model.model.layers[4].self_attn.q_proj.weight.copy_(3 * q)
    return model


def test_per_type_selection_equals_a_hand_computation():
    model = _model()
    got = spectrum_snr(model.model.layers)
    assert sorted({t for _, t in got}) == sorted(TYPES) and len(got) == 6 * 7  # 2-D weights only, no norms
    hand = {(i, t): _hand_value(model.model.layers[i].get_submodule(t).weight.detach().numpy())
            for i in range(6) for t in TYPES}
    for k, v in hand.items():
        assert got[k] == pytest.approx(v, rel=1e-9) or (np.isinf(v) and np.isinf(got[k])), k
    assert np.isinf(got[(4, "self_attn.q_proj")])
    picked = spectrum_pick(got, 50)  # int(6 * 0.5) = 3 per type
    for t in TYPES:
        order = sorted(range(6), key=lambda i: (-hand[(i, t)], i))  # +inf sorts first here: -inf is smallest
        assert sorted(i for i, tt in picked if tt == t) == sorted(order[:3]), t
    assert (4, "self_attn.q_proj") in picked
    assert len(spectrum_pick(got, 10)) == 0 and len(spectrum_pick(got, 17)) == 7  # int(6 * 0.17) = 1 per type


def test_the_order_of_infinite_and_undefined_values_is_defined():
    vals = {0: 0.5, 1: float("nan"), 2: float("inf"), 3: 0.5, 4: 0.9, 5: float("-inf")}
    assert spectrum_order(vals) == [2, 4, 0, 3, 1, 5]


def test_the_plan_trains_exactly_the_named_matrices_with_embeddings_and_head():
    model = _model()
    names = matrix_names([(1, "mlp.down_proj"), (4, "self_attn.q_proj"), (4, "mlp.up_proj")])
    assert names == ["1.mlp.down_proj", "4.mlp.up_proj", "4.self_attn.q_proj"]
    plan = build_plan(PlanConfig(name="spectrum", matrices=names), 6, tied_embeddings=True)
    counts = apply_plan(model, plan)
    trains = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trains == ["model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight",
                      "model.layers.4.mlp.up_proj.weight", "model.layers.4.self_attn.q_proj.weight"]
    L = model.model.layers
    want = (model.model.embed_tokens.weight.numel() + L[1].mlp.down_proj.weight.numel()
            + L[4].mlp.up_proj.weight.numel() + L[4].self_attn.q_proj.weight.numel())
    assert counts["trainable"] == want == plan_table(model, plan)["trainable"]
    opt = make_optimizer(model, plan, TrainConfig())
    assert all(r.problem() is None for r in verify.build_table(model, plan, opt))
    with torch.no_grad():
        L[1].mlp.down_proj.weight.requires_grad_(False)  # a fault: one named matrix left frozen
    with pytest.raises(RaycptError, match="layers.1"):
        verify.raise_on_mismatch(verify.build_table(model, plan, opt), "test")


def test_bad_spectrum_plans_are_one_line():
    model = _model()
    with pytest.raises(RaycptError, match="plan.matrices is empty"):
        build_plan(PlanConfig(name="spectrum"), 6)
    plan = build_plan(PlanConfig(name="spectrum", matrices=["2.mlp.nope"]), 6)
    with pytest.raises(RaycptError, match="layer 2 has no module 'mlp.nope'"):
        apply_plan(model, plan)
