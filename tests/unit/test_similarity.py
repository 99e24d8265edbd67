"""Similarity metrics against naive references written here (no Ray)."""

import math

import numpy as np
import pytest
import torch

from raycpt.diagnostics import similarity as S
from raycpt.errors import RaycptError


def naive_cka(x, y):
    """HSIC with explicit centering matrices: tr(K H L H) / sqrt(tr(K H K H) tr(L H L H))."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_cka_self_is_one(rng):
    x = rng.normal(size=(50, 12))
    assert S.linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_orthogonal_and_scale_invariance(rng):
    x = rng.normal(size=(40, 10))
    y = rng.normal(size=(40, 10)) + 0.5 * x
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    base = S.linear_cka(x, y)
    assert S.linear_cka(x @ q, y) == pytest.approx(base, abs=1e-10)
    assert S.linear_cka(x, 7.5 * y) == pytest.approx(base, abs=1e-10)
    assert S.linear_cka(3.0 * (x @ q), y) == pytest.approx(base, abs=1e-10)


def test_cka_matches_naive_hsic(rng):
    x = rng.normal(size=(30, 8))
    y = np.tanh(x @ rng.normal(size=(8, 5))) + 0.1 * rng.normal(size=(30, 5))
    assert S.linear_cka(x, y) == pytest.approx(naive_cka(x, y), rel=1e-10)
    assert S.linear_cka(torch.tensor(x, dtype=torch.float32), y) == pytest.approx(naive_cka(x, y), rel=1e-5)


def test_cosine_and_mean_shift_hand_values():
    x = np.array([[1.0, 0.0], [0.0, 2.0]])
    y = np.array([[1.0, 1.0], [0.0, -3.0]])
    # cos = (1/sqrt2 + -1) / 2
    assert S.mean_cosine(x, y) == pytest.approx((1 / math.sqrt(2) - 1) / 2)
    # means (0.5, 1.0) and (0.5, -1.0) -> distance 2
    assert S.mean_shift(x, y) == pytest.approx(2.0)


def test_effective_rank_known_rank(rng):
    u, _ = np.linalg.qr(rng.normal(size=(20, 20)))
    v, _ = np.linalg.qr(rng.normal(size=(9, 9)))
    for r in (1, 3, 7):
        s = np.zeros(9)
        s[:r] = 4.0
        m = u[:, :9] @ np.diag(s) @ v.T
        assert S.effective_rank(m) == pytest.approx(r, rel=1e-9)
    # unequal singular values: exp of the Shannon entropy of s / sum(s)
    s = np.array([3.0, 1.0, 0, 0, 0, 0, 0, 0, 0])
    m = u[:, :9] @ np.diag(s) @ v.T
    p = np.array([0.75, 0.25])
    assert S.effective_rank(m) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)


def test_entropy_known_spectra(rng):
    n = 6
    # identity Gram: Z with orthonormal rows -> K = I -> log n (any alpha)
    q, _ = np.linalg.qr(rng.normal(size=(10, 10)))
    z = q[:n]
    for alpha in (0.5, 1.0, 2.0):
        assert S.matrix_entropy(z, alpha) == pytest.approx(math.log(n), rel=1e-9)
    assert S.matrix_entropy(z, 1.0, normalized=True) == pytest.approx(1.0)
    # rank-one Gram -> 0
    assert S.matrix_entropy(np.outer(rng.normal(size=5), rng.normal(size=4)), 1.0) == pytest.approx(0.0, abs=1e-9)
    # a spectrum (1/2, 1/4, 1/4): von Neumann and Renyi-2 by hand
    lam = np.array([0.5, 0.25, 0.25])
    z = np.diag(np.sqrt(lam))
    assert S.matrix_entropy(z, 1.0) == pytest.approx(-(lam * np.log(lam)).sum(), rel=1e-9)
    assert S.matrix_entropy(z, 2.0) == pytest.approx(-math.log((lam ** 2).sum()), rel=1e-9)


def test_prompt_and_dataset_entropy(rng):
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    prompts = [q[:4], q[4:7]]  # orthonormal rows: each prompt's Gram is the identity
    assert S.prompt_entropy(prompts, normalized=False) == pytest.approx((math.log(4) + math.log(3)) / 2)
    assert S.prompt_entropy(prompts, normalized=True) == pytest.approx(1.0)
    # two identical pooled rows -> rank one -> 0
    assert S.dataset_entropy([q[:2], q[:2]], normalized=False) == pytest.approx(0.0, abs=1e-9)


def test_param_groups():
    g = S.param_group
    assert [g(f"self_attn.{p}_proj.weight") for p in "qkvo"] == ["q", "k", "v", "o"]
    assert g("mlp.down_proj.weight") == "mlp"
    assert g("input_layernorm.weight") == "norm"
    assert g("mixer.in_proj.weight") == "ssm"
    assert g("mixer.out_proj.weight") == "ssm"
    assert g("mixer.A_log") == "ssm"
    assert g("mixer.q_proj.weight") == "q"
    assert g("mixer.up_proj.weight") == "mlp"


def test_weight_change_zero_and_hand_value():
    from tiny import tiny_model

    a = tiny_model("llama", num_layers=3, hidden=32, seed=0)
    b = tiny_model("llama", num_layers=3, hidden=32, seed=0)
    wc = S.weight_change(a, b)
    assert len(wc) == 3
    assert all(v == 0.0 for row in wc for k, v in row.items() if not k.startswith("rel_"))
    with torch.no_grad():
        q = b.model.layers[1].self_attn.q_proj.weight
        q.add_(0.5)  # every entry +0.5 -> ||dW||_F = 0.5 * sqrt(numel)
        b.model.layers[1].mlp.up_proj.weight[0, 0] += 3.0
    wc = S.weight_change(a, b)
    expect_q = 0.5 * math.sqrt(q.numel())
    assert wc[1]["q"] == pytest.approx(expect_q, rel=1e-6)
    assert wc[1]["k"] == 0.0 and wc[1]["o"] == 0.0
    assert wc[1]["attn"] == pytest.approx(expect_q, rel=1e-6)
    assert wc[1]["mlp"] == pytest.approx(3.0, rel=1e-6)
    assert wc[1]["total"] == pytest.approx(math.sqrt(expect_q ** 2 + 9.0), rel=1e-6)
    assert wc[0]["total"] == 0.0 and wc[2]["total"] == 0.0


def test_mismatch_raises():
    from tiny import tiny_model

    with pytest.raises(RaycptError, match="layer counts"):
        S.weight_change(tiny_model("llama", 3), tiny_model("llama", 4))
    with pytest.raises(RaycptError, match="architectures"):
        S.weight_change(tiny_model("llama", 3), tiny_model("qwen3", 3))
    with pytest.raises(RaycptError, match="shape"):
        S.check_compatible(tiny_model("llama", 2, hidden=32), tiny_model("llama", 2, hidden=64))


def test_swap_layers_and_blocks():
    from tiny import tiny_model

    a = tiny_model("llama", 4, seed=0)
    b = tiny_model("llama", 4, seed=1)
    S.swap_layers(a, b, [1, 2])
    wc = S.weight_change(a, b)
    assert [round(r["total"], 9) for r in wc][1:3] == [0.0, 0.0]
    assert wc[0]["total"] > 0 and wc[3]["total"] > 0
    assert S.layer_blocks(10, 5) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert sum(S.layer_blocks(30, 4), []) == list(range(30))
    with pytest.raises(RaycptError):
        S.layer_blocks(3, 5)


def test_collect_states_probe_matches_naive():
    """Probe accuracy vs a naive loop over output_hidden_states with the final norm applied by hand."""
    from tiny import tiny_model

    torch.manual_seed(0)
    model = tiny_model("llama", 3)
    seqs = [[1, 5, 9, 22, 40, 7], [1, 8, 8, 8], [1, 30, 31, 32, 33, 34, 35]]
    st = S.collect_states(model, seqs, batch_size=2, drop_first=True)
    assert len(st.layers) == 3 and [x.shape[0] for x in st.layers[0]] == [5, 3, 6]
    correct = np.zeros(3)
    total = 0
    for s in seqs:
        ids = torch.tensor([s])
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        hs = out.hidden_states
        for l in range(3):
            h = hs[l + 1] if l < 2 else None
            logits = model.lm_head(model.model.norm(h)) if h is not None else out.logits
            correct[l] += int((logits[0, :-1].argmax(-1) == ids[0, 1:]).sum())
            if l == 0:
                np.testing.assert_allclose(st.layers[0][seqs.index(s)], hs[1][0, 1:].numpy(), rtol=1e-4, atol=1e-5)
        total += len(s) - 1
    assert st.probe_total == total
    np.testing.assert_array_equal(st.probe_correct, correct)
    pm = S.pair_metrics(st, st)
    assert all(r["cka"] == pytest.approx(1.0) and r["mean_shift"] == pytest.approx(0.0) for r in pm)
    mm = S.model_metrics(st)
    assert len(mm) == 3 and all(0 <= r["prompt_entropy"] <= 1 for r in mm)


def test_massive_tokens_left_out(rng):
    """One token at 1000x norm decides raw CKA; pair_metrics leaves it out and matches CKA on the rest."""
    x = rng.normal(size=(40, 6))
    y = x @ rng.normal(size=(6, 6)) + rng.normal(size=(40, 6))
    x[7] *= 1000.0
    y[7] = x[7] * 3.0
    assert S.massive_rows(x).tolist() == [i == 7 for i in range(40)]
    assert S.massive_rows(x, 0).sum() == 0
    raw = S.linear_cka(x, y)
    rest = np.delete(np.arange(40), 7)
    st_a = S.ModelStates(layers=[[x[:20].astype(np.float32), x[20:].astype(np.float32)]],
                         probe_correct=np.zeros(1), probe_total=1)
    st_b = S.ModelStates(layers=[[y[:20].astype(np.float32), y[20:].astype(np.float32)]],
                         probe_correct=np.zeros(1), probe_total=1)
    pm = S.pair_metrics(st_a, st_b)[0]
    assert raw > 0.999 and pm["massive_tokens_pair"] == 1
    assert pm["cka"] == pytest.approx(naive_cka(x[rest], y[rest]), rel=1e-5) and pm["cka"] < 0.99
    assert S.pair_metrics(st_a, st_b, outlier_factor=0)[0]["cka"] == pytest.approx(raw, rel=1e-5)
    mm = S.model_metrics(st_a)[0]
    assert mm["massive_tokens"] == 1
    assert mm["effective_rank"] == pytest.approx(S.effective_rank(x[rest].astype(np.float32)), rel=1e-5)
