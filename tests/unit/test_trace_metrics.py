"""LayerTracer metrics against references written here: a naive per-prompt implementation (full
forward with a zeroing hook, once per perturbation layer, no padding, no reuse), scipy's
Jensen-Shannon distance, and hand-worked S(b) values."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from raycpt.diagnostics.prompts import PromptRecord, collate, encode_prompts
from raycpt.diagnostics.scores import (boundary_score, check_split, delta_js, grid_ratios, minmax, profiles, ratio,
                                       recommend_split, split_table, topk_js, tp_interval)
from raycpt.diagnostics.tracer import trace_batch
from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack
from tiny import tiny_model, tiny_tokenizer

EPS = 1e-6
RECORDS = [
    PromptRecord("Example: hot->Cold, big->Small;", " Query: fast->", "antonym"),
    PromptRecord("Example: up->Down;", " Query: in->", "antonym"),
    PromptRecord("Example: big->Large, quick->Fast, end->Finish;", " Query: begin->", "synonym"),
    PromptRecord("Ex: a->B;", " Q: c->", "synonym"),
    PromptRecord("Example: day->Night, wet->Dry;", " Query: good->", "antonym"),
]
# (arch, layers): llama (tied embeddings), qwen3 (q/k norms), gemma3 (sliding + global layers,
# dual rotary tables, scaled embeddings; 6 layers so layer 5 is a global-attention layer)
MODELS = [("llama", 4), ("qwen3", 4), ("gemma3", 6)]


# ------------------------------------------------------------------------------------ references
def naive_distributions(model, ids: list[int], context: list[int]):
    """One prompt, no batching, no reuse: P and P_t from a plain forward with output_hidden_states,
    then Q(i) for i = -1..N-1 from a full forward with a hook zeroing the context after block i."""
    dec = model.get_decoder()
    n = len(dec.layers)
    x = torch.tensor([ids])
    softcap = getattr(model.config, "final_logit_softcapping", None)

    def head(h):
        logits = model.lm_head(dec.norm(h)).double()
        return torch.tanh(logits / softcap) * softcap if softcap else logits

    with torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
        p_full = torch.softmax(out.logits[0, -1].double(), -1)
        t = int(p_full.argmax())
        # hidden_states[-1] already has the final norm applied: P itself gives P_t of the last layer
        pt = [float(torch.softmax(head(out.hidden_states[j][0, -1]), -1)[t]) for j in range(n)] + [float(p_full[t])]
        qs = []
        for i in range(-1, n):
            module = dec.embed_tokens if i < 0 else dec.layers[i]

            def hook(mod, args, output):
                h = output[0] if isinstance(output, tuple) else output
                h = h.clone()
                h[0, context] = 0.0
                return (h, *output[1:]) if isinstance(output, tuple) else h

            handle = module.register_forward_hook(hook)
            try:
                qs.append(torch.softmax(model(input_ids=x, use_cache=False).logits[0, -1].double(), -1))
            finally:
                handle.remove()
    return dict(t_star=t, p_t=np.array(pt), p=p_full.numpy(), qs=[q.numpy() for q in qs])


def naive_metrics(d: dict, top_k: int) -> dict:
    """JS on P's top-k (renormalised) written out from the definition, then Ratio and dJS."""
    p_full = d["p"]
    idx = np.argsort(-p_full, kind="stable")[:top_k] if top_k else np.arange(p_full.size)
    p = p_full[idx] / p_full[idx].sum()
    js = []
    for q_full in d["qs"]:
        q = q_full[idx] / q_full[idx].sum()
        m = 0.5 * (p + q)
        kl = lambda a, b: float(sum(ai * np.log(ai / bi) for ai, bi in zip(a, b) if ai > 0))  # noqa: E731
        js.append(0.5 * kl(p, m) + 0.5 * kl(q, m))
    pt, js = d["p_t"], np.array(js)
    n = len(pt) - 1
    r = [abs(pt[i + 1] - pt[i]) / (pt[i + 1] + EPS) for i in range(n)]
    dj = [abs(js[i + 1] - js[i]) / (js[i] + EPS) for i in range(n)]
    return dict(t_star=d["t_star"], p_t=pt, js=js, ratio=np.array(r), djs=np.array(dj))


@pytest.fixture(scope="module")
def encoded():
    return encode_prompts(RECORDS, tiny_tokenizer())


@pytest.fixture(scope="module", params=MODELS, ids=[m[0] for m in MODELS])
def model_and_ref(request, encoded):
    arch, layers = request.param
    model = tiny_model(arch, num_layers=layers, hidden=32, seed=1)
    return model, [naive_distributions(model, e.input_ids, e.context) for e in encoded]


@pytest.mark.parametrize("schedule,max_rows,top_k", [("stacked", None, 10), ("per_layer", None, 0),
                                                     ("stacked", 12, 50), ("shared_context", 12, 10)])
def test_trace_batch_matches_naive_reference(model_and_ref, encoded, schedule, max_rows, top_k):
    model, refs = model_and_ref
    out = trace_batch(LayerStack(model), collate(encoded, pad_id=0), top_k=top_k, eps=EPS, schedule=schedule,
                      max_rows=max_rows)
    n = model.config.num_hidden_layers
    assert out["p_t"].shape == (len(encoded), n + 1) and out["ratio"].shape == (len(encoded), n)
    for b, d in enumerate(refs):
        ref = naive_metrics(d, top_k)
        assert out["t_star"][b] == ref["t_star"]
        np.testing.assert_allclose(out["p_t"][b], ref["p_t"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(out["p_final"][b], ref["p_t"][-1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(out["js"][b], ref["js"], rtol=1e-3, atol=1e-8)
        np.testing.assert_allclose(out["ratio"][b], ref["ratio"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["djs"][b], ref["djs"], rtol=1e-3, atol=1e-4)
        assert abs(out["js"][b, -1]) < 1e-12  # after the last block only context positions change: Q = P


def test_perturbation_changes_something(encoded):
    # guard against a reference and an implementation that both perturb nothing
    out = trace_batch(LayerStack(tiny_model("llama", 4, 32, seed=1)), collate(encoded), top_k=10)
    assert (out["js"][:, :-1] > 1e-6).mean() > 0.5


def test_repeat_run_identical(encoded):
    stack = LayerStack(tiny_model("qwen3", 4, 32, seed=3))
    batch = collate(encoded)
    a = trace_batch(stack, batch, top_k=10)
    b = trace_batch(stack, batch, top_k=10)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


# ------------------------------------------------------------------------------------ JS
@pytest.mark.parametrize("k", [1, 3, 10, 0])
def test_topk_js_equals_scipy_jensenshannon_squared(k):
    g = torch.Generator().manual_seed(k)
    p_logits = torch.randn(4, 40, generator=g) * 3
    q_logits = p_logits + torch.randn(4, 40, generator=g)
    got = topk_js(p_logits, q_logits, k).numpy()
    for b in range(4):
        p = torch.softmax(p_logits[b].double(), -1).numpy()
        q = torch.softmax(q_logits[b].double(), -1).numpy()
        idx = np.argsort(-p)[:k] if k else np.arange(p.size)
        expect = jensenshannon(p[idx], q[idx]) ** 2  # scipy renormalises; natural log by default
        assert got[b] == pytest.approx(expect, rel=1e-9, abs=1e-15)


def test_topk_js_zero_for_equal_and_log2_bound():
    x = torch.randn(3, 20)
    assert np.allclose(topk_js(x, x.clone(), 5).numpy(), 0.0)
    # disjoint mass within the support: JS -> ln 2
    p = torch.tensor([[20.0, -20.0]])
    q = torch.tensor([[-20.0, 20.0]])
    assert topk_js(p, q, 0).item() == pytest.approx(np.log(2), rel=1e-6)


def test_negative_k_is_a_user_error():
    with pytest.raises(RaycptError, match="top_k=-1"):
        topk_js(torch.zeros(1, 4), torch.zeros(1, 4), -1)


# ------------------------------------------------------------------------------------ Ratio, dJS, TP
def test_ratio_and_delta_js_by_hand():
    p_t = np.array([0.1, 0.2, 0.05, 0.05])
    np.testing.assert_allclose(ratio(p_t, EPS), [0.1 / (0.2 + EPS), 0.15 / (0.05 + EPS), 0.0])
    js = np.array([0.0, 0.3, 0.1, 0.0])
    np.testing.assert_allclose(delta_js(js, EPS), [0.3 / EPS, 0.2 / (0.3 + EPS), 0.1 / (0.1 + EPS)])


def test_tp_interval():
    assert tp_interval(np.array([0.0, 0.2, 0.0, 0.5, 0.0]), 0.0) == (1, 3, 2)
    assert tp_interval(np.array([0.0, 0.2, 0.0, 0.5]), 0.3) == (3, 3, 1)
    assert tp_interval(np.zeros(4), 0.0) == (-1, -1, 0)


def test_profiles_overall_and_per_group():
    r = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0], [0.0, 0.0, 6.0]])
    d = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    prof = profiles(r, d, ["a", "a", "b"])
    np.testing.assert_allclose(prof["tp"], [4 / 3, 4 / 3, 10 / 3])
    np.testing.assert_allclose(prof["tp_norm"], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(prof["ls_norm"], [0.0, 0.0, 0.0])  # flat profile -> zeros
    assert list(prof["groups"]) == ["a", "b"]
    np.testing.assert_allclose(prof["groups"]["a"]["tp"], [2.0, 2.0, 2.0])
    assert prof["groups"]["b"]["n"] == 1


def test_profiles_median():
    r = np.array([[1.0, 0.0], [2.0, 5.0], [100.0, 1.0]])
    prof = profiles(r, r, aggregate="median")
    np.testing.assert_allclose(prof["tp"], [2.0, 1.0])
    np.testing.assert_allclose(prof["tp_norm"], [1.0, 0.0])


def test_minmax():
    np.testing.assert_allclose(minmax(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])


# ------------------------------------------------------------------------------------ S(b)
# Hand-worked: TP = [0, 0, 1, 4] -> TP^ = [0, 0, .25, 1]; LS = [5, 1, 1, 0] -> LS^ = [1, .2, .2, 0]
#   S(1) = 1 + (0 + .25 + 1)/3 - 0 - (.2 + .2 + 0)/3              = 77/60
#   S(2) = (1 + .2)/2 + (.25 + 1)/2 - 0 - (.2 + 0)/2                = 9/8
#   S(3) = (1 + .2 + .2)/3 + 1 - (0 + 0 + .25)/3 - 0                = 83/60
TP_HAND = minmax(np.array([0.0, 0.0, 1.0, 4.0]))
LS_HAND = minmax(np.array([5.0, 1.0, 1.0, 0.0]))


def test_boundary_score_hand_worked():
    assert boundary_score(TP_HAND, LS_HAND, 1) == pytest.approx(77 / 60)
    assert boundary_score(TP_HAND, LS_HAND, 2) == pytest.approx(9 / 8)
    assert boundary_score(TP_HAND, LS_HAND, 3) == pytest.approx(83 / 60)


def test_split_table_and_recommendation_hand_worked():
    rows = split_table(TP_HAND, LS_HAND, [0.25, 0.5, 0.75])
    assert [r["split_layer"] for r in rows] == [1, 2, 3]  # round(1.0), round(2.0), round(3.0)
    assert [r["S"] for r in rows] == pytest.approx([77 / 60, 9 / 8, 83 / 60])
    assert rows[1]["ls_shallow"] == pytest.approx(0.6) and rows[1]["tp_deep"] == pytest.approx(0.625)
    rec = recommend_split(TP_HAND, LS_HAND, [0.2, 0.8, 0.05])
    # b = round(4r): 0.2..0.35 -> 1, 0.4..0.6 -> 2, 0.65..0.8 -> 3; the first ratio reaching S(3) wins
    assert rec["split_layer"] == 3 and rec["ratio"] == pytest.approx(0.65) and rec["S"] == pytest.approx(83 / 60)
    assert len(rec["scores"]) == 13


def test_reverse_pattern_gives_negative_scores():
    # TP mass shallow and LS deep is the opposite of the paper's pattern: every S(b) < 0
    rows = split_table(LS_HAND, TP_HAND, [0.25, 0.5, 0.75])
    assert all(r["S"] < 0 for r in rows)


def test_grid_ratios_inclusive():
    assert grid_ratios([0.2, 0.8, 0.05]) == pytest.approx([0.2 + 0.05 * k for k in range(13)])
    assert grid_ratios([0.5, 0.5, 0.1]) == [0.5]


@pytest.mark.parametrize("r,n,msg", [(0.0, 30, "strictly between 0 and 1"), (1.0, 30, "strictly between 0 and 1"),
                                     (1.5, 30, "strictly between 0 and 1"), (0.1, 4, "shallow side empty"),
                                     (0.9, 4, "deep side empty")])
def test_check_split_rejects(r, n, msg):
    with pytest.raises(RaycptError, match=msg):
        check_split(r, n)


def test_check_split_accepts():
    assert check_split(0.5, 30) == 15
    assert check_split(0.33, 30) == 10
    assert check_split(0.66, 30) == 20


def test_s_b_table_carries_a_bootstrap_interval_over_prompts():
    """The trace's S(b) table: the interval columns hold the percentile bootstrap over prompts (the same
    draws recomputed here by a plain loop), the markdown prints them and explains them."""
    from raycpt.report.trace import add_s_intervals, table_markdown

    rng = np.random.default_rng(2)
    r_rows, d_rows = rng.lognormal(size=(12, 4)), rng.lognormal(size=(12, 4))
    prof = profiles(r_rows, d_rows)
    rows = split_table(prof["tp_norm"], prof["ls_norm"], [0.25, 0.5])
    for row in rows:
        row["S_median"] = 0.0
    add_s_intervals(rows, r_rows, d_rows, resamples=300, seed=4, aggregate="mean")
    idx = np.random.default_rng(4).integers(0, 12, size=(300, 12))
    from naive_stats import naive_bca

    def s_of(r, d, b):
        p = profiles(r, d)
        return boundary_score(p["tp_norm"], p["ls_norm"], b)

    for row in rows:
        b = row["split_layer"]
        reps = np.array([s_of(r_rows[i], d_rows[i], b) for i in idx])
        jack = np.array([s_of(np.delete(r_rows, k, 0), np.delete(d_rows, k, 0), b) for k in range(12)])
        # was the percentile interval of the replicates; now BCa holding the point (issue 24), by hand
        assert (row["S_lo"], row["S_hi"]) == pytest.approx(naive_bca(row["S"], reps, jack), abs=1e-12)
        assert row["like_best"] in (True, False)
    from raycpt.report.trace import fmt_cell

    assert fmt_cell("S_ci", (rows[0]["S_lo"], rows[0]["S_hi"])) == f"[{rows[0]['S_lo']:.3f}, {rows[0]['S_hi']:.3f}]"
    assert fmt_cell("S_ci", (None, None)) == "-"  # a table from before the intervals
    md = table_markdown(rows)
    assert "S(b) 2.5%" in md and f"{rows[0]['S_lo']:.3f}" in md and "jackknife standard error" in md


def test_s_b_default_is_scaled_profiles_with_a_jackknife_t_interval():
    """The default S(b) (trace.sb_aggregate = scaled): each prompt's row divided by its own mean over layers,
    averaged, min-max, eq. 7; the interval S -+ t(n-1) * jackknife SE. Recomputed here by plain loops and
    scipy's t quantile; a prompt's overall scale does not move it."""
    from scipy.stats import t

    from raycpt.report.trace import add_s_intervals

    rng = np.random.default_rng(7)
    r_rows, d_rows = rng.lognormal(size=(15, 6)), rng.lognormal(size=(15, 6))

    def s_scaled(r, d, b):
        tp = np.array([row / row.mean() for row in r]).mean(0)
        ls = np.array([row / row.mean() for row in d]).mean(0)
        tp, ls = (tp - tp.min()) / (tp.max() - tp.min()), (ls - ls.min()) / (ls.max() - ls.min())
        return ls[:b].mean() + tp[b:].mean() - tp[:b].mean() - ls[b:].mean()

    sc = profiles(r_rows, d_rows, aggregate="scaled")
    rows = split_table(sc["tp_norm"], sc["ls_norm"], [1 / 3, 0.5])
    add_s_intervals(rows, r_rows, d_rows)
    for row in rows:
        b = row["split_layer"]
        assert row["S"] == pytest.approx(s_scaled(r_rows, d_rows, b), abs=1e-12)
        jack = np.array([s_scaled(np.delete(r_rows, k, 0), np.delete(d_rows, k, 0), b) for k in range(15)])
        se = np.sqrt(14 / 15 * ((jack - jack.mean()) ** 2).sum())
        half = t.ppf(0.975, 14) * se
        assert (row["S_lo"], row["S_hi"]) == pytest.approx((row["S"] - half, row["S"] + half), abs=1e-12)
    bumped = r_rows.copy()
    bumped[3] *= 1e5  # one exploding prompt: the paper's mean moves, the scaled profile does not
    sc2 = profiles(bumped, d_rows, aggregate="scaled")
    assert sc2["tp_norm"] == pytest.approx(sc["tp_norm"], abs=1e-12)
    assert not np.allclose(profiles(bumped, d_rows)["tp_norm"], profiles(r_rows, d_rows)["tp_norm"])


def test_jackknife_t_of_a_mean_is_the_one_sample_t_interval():
    from scipy import stats

    from raycpt.stats import jackknife_t_interval

    x = np.random.default_rng(1).standard_normal(9) + 3.0
    jack = np.array([np.delete(x, k).mean() for k in range(9)])
    want = stats.t.interval(0.95, 8, loc=x.mean(), scale=stats.sem(x))
    assert jackknife_t_interval(x.mean(), jack) == pytest.approx(want, abs=1e-12)
    lo, hi = jackknife_t_interval(x.mean(), jack, one_sided=True)
    assert lo == pytest.approx(x.mean() - stats.t.ppf(0.95, 8) * stats.sem(x), abs=1e-12) and hi == np.inf


# ------------------------------------------------------------------------------ issue 24: 004 §4.1 readings
def test_task_particle_under_each_layers_top_k_is_not_every_layer():
    import torch

    from raycpt.diagnostics.scores import topk_target_prob

    # 3 layers, vocabulary 6, t* = 5: layer 0 ranks it last, layer 1 third, layer 2 first
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0],
                           [5.0, 4.0, 3.0, 0.0, 0.0, 3.5],
                           [0.0, 1.0, 0.0, 0.0, 0.0, 6.0]])
    tgt = torch.tensor([5, 5, 5])
    p = topk_target_prob(logits, tgt, 3).numpy()
    # by hand: layer 0: t* not in its top-3 -> 0; layer 1: top-3 = {5, 4, 3.5}: e^3.5 / (e^5 + e^4 + e^3.5);
    # layer 2: top-3 = {6, 1, 0}: e^6 / (e^6 + e^1 + e^0)
    e = np.exp
    assert p == pytest.approx([0.0, e(3.5) / (e(5) + e(4) + e(3.5)), e(6) / (e(6) + e(1) + 1)])
    full = torch.softmax(logits.double(), -1)[:, 5].numpy()
    assert (ratio(np.r_[full[0], full])[1:] > 0).all()  # full softmax: every layer in the interval
    # Ratio over [layer 0 again as the embedding, layers 0..2] with the top-k reading: layer 0 drops out
    assert tp_interval(ratio(np.r_[p[0], p]), 0.0) == (1, 2, 2)


def test_mass_outside_top_k_sees_what_js_at_k_cannot():
    import torch

    from raycpt.diagnostics.scores import mass_outside, support, topk_js

    # P puts its mass on tokens 0-1; Q keeps their ratio but moves 86% of its mass to tokens 2-5
    p = torch.log(torch.tensor([[0.6, 0.4, 0.0 + 1e-12, 1e-12, 1e-12, 1e-12]]))
    q = torch.log(torch.tensor([[0.6 * 0.14, 0.4 * 0.14, 0.215, 0.215, 0.215, 0.215]]))
    idx = support(p, 2)
    assert float(topk_js(p, q, 2, idx=idx)) == pytest.approx(0.0, abs=1e-9)  # renormalised: identical
    assert float(mass_outside(p, q, idx)) == pytest.approx(0.86, abs=1e-6)
    assert float(topk_js(p, q, 0)) > 0.3  # over the full vocabulary the move shows


def test_the_trace_hot_path_extras_equal_their_float64_references():
    """Issue 41 (trace_speedup): mass_outside's normaliser is taken in the logits' dtype and topk_target_prob reuses
    the caller's log-softmax; both against the float64 softmax computed here, on a 49,152-token vocabulary."""
    from raycpt.diagnostics.scores import mass_outside, support, topk_target_prob

    g = torch.Generator().manual_seed(0)
    p = torch.randn(6, 49152, generator=g) * 3
    q = torch.randn(6, 49152, generator=g) * 3
    idx = support(p, 10)
    ref = 1.0 - torch.softmax(q.double(), -1).gather(-1, idx).sum(-1)
    assert torch.allclose(mass_outside(p, q, idx), ref, rtol=0, atol=1e-8)
    tgt = q.argmax(-1)
    tgt[0] = int(torch.argsort(q[0])[0])  # a target outside its row's top-k: 0
    lp = torch.log_softmax(q.double(), -1)
    assert torch.equal(topk_target_prob(q, tgt, 10, lp=lp), topk_target_prob(q, tgt, 10))
    top = torch.topk(lp, 10, -1).values
    want = torch.exp(lp.gather(-1, tgt[:, None])[:, 0] - torch.logsumexp(top, -1))
    want[0] = 0.0
    assert torch.allclose(topk_target_prob(q, tgt, 10), want, rtol=0, atol=1e-15)
