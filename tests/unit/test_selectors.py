"""Layer selectors against independent computations: Block Influence = 1 - cos computed by hand from
``output_hidden_states`` (and, for the last layer, from a run whose final norm is an identity), weight SNR =
a numpy SVD reference and a hand-computed spectrum, LayerTracer scores regroup S(b) exactly, random is
seeded; the ranking file they write is what the elite plan trains, and one from another depth is refused."""

import json
import math

import numpy as np
import pytest
import torch

from raycpt.diagnostics.selectors import (block_influence, layertracer_scores, matrix_snr, random_scores, top_k,
                                          weight_snr, write_selection)
from raycpt.diagnostics.scores import boundary_score
from tiny import tiny_model

LLAMA_MATRICES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                  "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def _batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 128, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding on the second row
    ids[1, 6:] = 0
    return ids, mask


def _hand_bi(h_in: np.ndarray, h_out: np.ndarray, mask: np.ndarray) -> float:
    """1 - mean over unmasked tokens of the cosine, in numpy float64."""
    a, b = h_in.astype(np.float64), h_out.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return 1.0 - cos[mask.astype(bool)].mean()


def test_block_influence_equals_one_minus_cos_of_hidden_states():
    model = tiny_model("llama", num_layers=4, hidden=32, seed=1)
    ids, mask = _batch()
    bi = block_influence(model, model.model.layers, [(ids, mask)])
    with torch.no_grad():
        hs = [h.numpy() for h in model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states]
    m = mask.numpy()
    for layer in range(3):  # hs[-1] has the final norm applied: layers 0..N-2 only
        assert bi[layer] == pytest.approx(_hand_bi(hs[layer], hs[layer + 1], m), rel=1e-6, abs=1e-9)
    # the last layer: the same forward with the final norm replaced by an identity exposes its raw output
    norm, model.model.norm = model.model.norm, torch.nn.Identity()
    try:
        with torch.no_grad():
            raw = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    finally:
        model.model.norm = norm
    assert bi[3] == pytest.approx(_hand_bi(hs[3], raw[-1].numpy(), m), rel=1e-6, abs=1e-9)
    # padding counts: ignoring the mask gives a different number (the check can fail)
    assert bi[0] != pytest.approx(_hand_bi(hs[0], hs[1], np.ones_like(m)), rel=1e-9)
    assert np.all((bi > 0) & (bi < 2))


def test_block_influence_pools_tokens_over_batches():
    model = tiny_model("llama", num_layers=2, hidden=32, seed=2)
    ids, mask = _batch()
    both = block_influence(model, model.model.layers, [(ids[:1], mask[:1]), (ids[1:, :6], None)])
    with torch.no_grad():
        h0 = model(input_ids=ids[:1], output_hidden_states=True).hidden_states
        h1 = model(input_ids=ids[1:, :6], output_hidden_states=True).hidden_states
    a = np.concatenate([h0[0].numpy().reshape(-1, 32), h1[0].numpy().reshape(-1, 32)])
    b = np.concatenate([h0[1].numpy().reshape(-1, 32), h1[1].numpy().reshape(-1, 32)])
    assert both[0] == pytest.approx(_hand_bi(a, b, np.ones(len(a))), rel=1e-6)  # 9 + 6 tokens, one mean


def _numpy_snr(w: np.ndarray, normalize: bool = False) -> float:
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    q1, q3 = np.percentile(s, [25, 75])
    sigma = (q3 - q1) / 1.349
    r, c = w.shape
    edge = sigma * (1 + math.sqrt(min(r, c) / max(r, c)))
    snr = s[s > edge].sum() / s[s <= edge].sum()
    return snr / s.max() if normalize else snr


def test_matrix_snr_by_hand():
    # singular values 10, 4, 3, 2, 1, 1, 1, 1 (diagonal, rotated so the SVD has work to do)
    s = np.array([10, 4, 3, 2, 1, 1, 1, 1], dtype=np.float64)
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(8, 8)))
    w = torch.tensor(q @ np.diag(s) @ q.T)
    # sorted 1,1,1,1,2,3,4,10: q25 = 1, q75 = 3.25, sigma = 2.25/1.349, beta = 1, edge = 2*sigma = 3.336:
    # signal 10 + 4, noise 3 + 2 + 4 * 1
    assert matrix_snr(w) == pytest.approx(14 / 9, rel=1e-9)
    assert matrix_snr(w, normalize=True) == pytest.approx(14 / 9 / 10, rel=1e-9)


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (48, 48)])
def test_matrix_snr_equals_numpy_svd_reference(shape):
    rng = np.random.default_rng(sum(shape))
    low_rank = rng.normal(size=(shape[0], 3)) @ rng.normal(size=(3, shape[1])) * 2.0
    w = low_rank + rng.normal(size=shape)
    for normalize in (False, True):
        assert matrix_snr(torch.tensor(w, dtype=torch.float32), normalize) == pytest.approx(
            _numpy_snr(w.astype(np.float32), normalize), rel=1e-6)
    # the planted rank-3 signal lifts the SNR above pure noise of the same shape
    assert _numpy_snr(w) > _numpy_snr(rng.normal(size=shape))


def test_weight_snr_is_the_mean_over_the_layers_matrices():
    model = tiny_model("llama", num_layers=3, hidden=32, seed=4)
    got = weight_snr(model.model.layers)
    sd = model.state_dict()
    for i in range(3):
        want = np.mean([_numpy_snr(sd[f"model.layers.{i}.{name}"].numpy()) for name in LLAMA_MATRICES])
        assert got[i] == pytest.approx(want, rel=1e-6)


def test_layertracer_scores_regroup_s_of_b():
    tp = np.array([0.0, 0.2, 1.0, 0.6, 0.3])
    ls = np.array([1.0, 0.7, 0.0, 0.1, 0.4])
    d = layertracer_scores(tp, ls)
    assert d.tolist() == pytest.approx([1.0, 0.5, -1.0, -0.5, 0.1])
    for b in range(1, 5):
        assert boundary_score(tp, ls, b) == pytest.approx(d[:b].mean() - d[b:].mean())
    assert top_k(d, 2) == [0, 1]  # the sensitive, non-task shallow layers rank first
    assert top_k([0.5, math.nan, 0.5, 0.9], 3) == [0, 2, 3]  # ties: lower layer; NaN last


def test_random_scores_are_seeded():
    a, b, c = random_scores(30, 7), random_scores(30, 7), random_scores(30, 8)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert sorted(np.argsort(a)) == list(range(30))


def test_ranking_file_is_what_elite_trains(tmp_path):
    from raycpt.config import PlanConfig
    from raycpt.strategies import build_plan, read_ranking

    scores = np.array([0.1, 0.9, 0.3, 0.8])
    path = write_selection(tmp_path / "ranking.json", "tiny", "bi", scores, k=2)
    doc = json.loads(path.read_text())
    assert doc["metric"] == "block_influence" and doc["top_k"] == [1, 3] and doc["num_layers"] == 4
    assert [r["layer"] for r in read_ranking(path, num_layers=4)["ranking"]] == [1, 3, 2, 0]
    plan = build_plan(PlanConfig(name="elite", k=2, ranking_file=str(path)), 4)
    assert plan.trainable_layers == (1, 3)


def test_ranking_from_another_depth_is_one_line_exit_2(tiny_dir, tmp_path, capsys):
    from raycpt.entry import main

    path = write_selection(tmp_path / "ranking30.json", "SmolLM2", "snr", random_scores(30, 0))
    rc = main(["plan", "show", f"model.ref={tiny_dir}", "plan.name=elite", "plan.k=2", f"plan.ranking_file={path}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.strip() == f"error: ranking file {path} is for a 30-layer model, this model has 4 layers"


# ------------------------------------------------------------------------------------ equal budget (sweep --budget)
def test_budget_plans_by_hand():
    from raycpt.strategies import budget_plans

    # 4 layers of 10, 20, 30, 40 parameters; 5 outside the layers; LoRA 3 per unit of rank, rank <= 8; budget 47
    rows = {r["name"]: r for r in budget_plans(47, [10, 20, 30, 40], 5, 3, 8, rankings={"bi": [3, 1, 0, 2]},
                                               random_seeds=(0,))}
    # shallow: b=1,2,3 -> 10, 30, 60: 60 is nearest; deep: [3:] 40, [2:] 70, [1:] 90 -> 40
    assert rows["layertracer-shallow"]["settings"] == {"plan.name": "train_shallow", "plan.split": 0.75}
    assert rows["layertracer-shallow"]["trainable"] == 60
    assert rows["layertracer-deep"]["settings"] == {"plan.name": "train_deep", "plan.split": 0.75}
    assert rows["layertracer-deep"]["trainable"] == 40
    # bi order 3, 1, 0, 2: cumulative 40, 60, 70, 100 -> k = 1
    assert rows["bi-top1"]["settings"] == {"plan.name": "layers", "plan.layers": [3]}
    # LISA: gamma largest layers + 5: 45, 75 -> gamma 1; LoRA 3r nearest 47 wants r=16 > 8 -> 8 (24)
    assert rows["lisa-g1"]["trainable"] == 45 and rows["lisa-g1"]["settings"]["plan.lisa_layers"] == 1
    assert rows["lora-r8"]["trainable"] == 24 and rows["lora-r8"]["settings"]["plan.lora_rank"] == 8
    # expand: P=1 copies layer 3 (40); P=2 copies layers 1, 3 (60) -> P = 1
    assert rows["expand-p1"]["trainable"] == 40
    # random seed 0: the top-k of default_rng(0).random(4), k nearest by the cumulative count of that order
    draw = np.random.default_rng(0).random(4)
    order = list(np.argsort(-draw, kind="stable"))
    sizes = [10, 20, 30, 40]
    cum = np.cumsum([sizes[i] for i in order])
    k = int(np.argmin(np.abs(cum - 47))) + 1
    name = f"random0-top{k}"
    assert rows[name]["settings"]["plan.layers"] == sorted(int(i) for i in order[:k])
    assert len(rows) == 7
    assert "plan.lisa_interval" not in rows["lisa-g1"]["settings"]  # derived from the run (max_steps // 4)
    assert "plan.lora_alpha" not in rows["lora-r8"]["settings"]  # alpha null = 2r
    lr = {r["name"]: r for r in budget_plans(47, [10, 20, 30, 40], 5, 3, 8, random_seeds=(), lora_lr=3e-4)}
    assert lr["lora-r8"]["settings"]["train.lr"] == 3e-4 and "train.lr" not in lr["lisa-g1"]["settings"]


def test_spectrum_budget_row_by_hand():
    """Two types over 4 layers; embeddings + head 20. Percent q picks int(4q/100) per type: 25 -> 1 each, 50 -> 2
    each, 75 -> 3, 100 -> 4. Counts 20 + {1: 7+3, 2: 7+7+3+3, ...}: budget 41 is nearest 2 each (40)."""
    from raycpt.diagnostics.spectrum import spectrum_pick
    from raycpt.strategies.budget import spectrum_row

    snr = {(i, "a"): v for i, v in enumerate([0.1, 0.9, float("inf"), 0.5])}
    snr.update({(i, "b"): v for i, v in enumerate([0.3, float("nan"), 0.2, 0.1])})
    sizes = {k: 7 if k[1] == "a" else 3 for k in snr}
    row = spectrum_row(41, {"pick": lambda q: spectrum_pick(snr, q), "sizes": sizes, "base": 20})
    assert row["name"] == "spectrum-p50" and row["trainable"] == 40
    # a: inf (layer 2) then 0.9 (layer 1); b: 0.3 (layer 0), 0.2 (layer 2), NaN last
    assert row["settings"] == {"plan.name": "spectrum", "plan.matrices": ["0.b", "1.a", "2.a", "2.b"]}


@pytest.mark.parametrize("budget,msg", [(9, "below one layer's parameters (10)"),
                                        (106, "above the model's 105 parameters")])
def test_budget_out_of_range_is_one_line(budget, msg):
    from raycpt.errors import RaycptError
    from raycpt.strategies import budget_plans

    with pytest.raises(RaycptError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        budget_plans(budget, [10, 20, 30, 40], 5, 3, 8)


def test_the_registry_is_the_one_path_and_the_configs_names():
    """Every selector ``raycpt select`` and ``--budget`` use is registered once, in the one registry; the config
    accepts exactly its names (it reads the registry; the names and metrics are spelled here); the registered Block
    Influence over equal-length corpus blocks, 2 at a time, equals one hand mean of 1 - cos over all 5 x 7 tokens;
    the best-first order puts NaN and an infinity last, ties by the lower layer."""
    from raycpt.config.analysis import SelectConfig
    from raycpt.diagnostics.selectors import SelectorInputs, ranking_order, select_scores
    from raycpt.errors import RaycptError
    from raycpt.registry import SELECTORS

    names = ("bi", "snr", "layertracer", "random", "elo", "gradnorm")
    assert SELECTORS.names() == names
    assert {n: SELECTORS.info(n, "metric") for n in names} == {
        "bi": "block_influence", "snr": "weight_snr", "layertracer": "ls_norm_minus_tp_norm", "random": "random",
        "elo": "distance_from_middle", "gradnorm": "gradient_norm"}
    for n in names:
        assert SelectConfig(method=n).method == n
    with pytest.raises(RaycptError, match="select.method") as e:
        SelectConfig(method="adagrad")
    assert str(e.value) == ("config error: select.method='adagrad': one of bi, snr, layertracer, random, elo, "
                            "gradnorm")
    model = tiny_model("llama", num_layers=3, hidden=32, seed=4)
    blocks = np.random.default_rng(0).integers(4, 128, size=(5, 7))
    seen = []
    x = SelectorInputs(num_layers=3, model=model, layers=model.model.layers, blocks=blocks, batch=2,
                       advance=seen.append)
    bi = select_scores("bi", x)
    assert seen == [2, 2, 1]
    with torch.no_grad():
        hs = model(input_ids=torch.as_tensor(blocks), output_hidden_states=True).hidden_states
    for layer in range(2):
        a, b = hs[layer].numpy().reshape(-1, 32), hs[layer + 1].numpy().reshape(-1, 32)
        assert bi[layer] == pytest.approx(_hand_bi(a, b, np.ones(len(a))), rel=1e-5)
    assert np.array_equal(select_scores("snr", x), weight_snr(model.model.layers))
    assert np.array_equal(select_scores("random", x), np.random.default_rng(0).random(3))
    assert ranking_order([0.5, float("nan"), 0.5, float("inf"), 0.9]) == [4, 0, 2, 1, 3]
    with pytest.raises(RuntimeError, match="for 2 layers"):  # profiles of another depth: refused, not ranked
        select_scores("layertracer", SelectorInputs(num_layers=2, tp_norm=[0.0, 1.0, 0.5], ls_norm=[1.0, 0.0, 0.5]))


def test_elo_ranks_the_first_and_the_last_layers_first():
    from raycpt.diagnostics.selectors import elo_scores, ranking_order
    from raycpt.errors import RaycptError

    assert list(elo_scores(5)) == [2.0, 1.0, 0.0, 1.0, 2.0]  # |l - 2|, by hand
    assert top_k(elo_scores(30), 2) == [0, 29]
    assert ranking_order(elo_scores(6))[:4] == [0, 5, 1, 4]  # ties: the lower layer first
    with pytest.raises(RaycptError, match="has 1 layer"):
        elo_scores(1)


def test_gradient_norm_selector_equals_per_layer_gradient_norms_by_hand():
    """Per batch: the LM loss recomputed here (shifted cross-entropy of the logits, by hand), its gradient per
    parameter by backward(), the layer's norm sqrt(sum g^2) in numpy; averaged over batches weighted by size."""
    from raycpt.diagnostics.selectors import SelectorInputs, select_scores

    model = tiny_model("llama", num_layers=3, hidden=32, seed=5)
    blocks = np.random.default_rng(1).integers(4, 128, size=(5, 8))
    frozen_before = [p.requires_grad for p in model.parameters()]
    got = select_scores("gradnorm", SelectorInputs(num_layers=3, model=model, layers=model.model.layers,
                                                   blocks=blocks, batch=2))
    assert [p.requires_grad for p in model.parameters()] == frozen_before
    want, weights = [], []
    for s in range(0, 5, 2):
        ids = torch.as_tensor(blocks[s:s + 2])
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        want.append([math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in layer.parameters()))
                     for layer in model.model.layers])
        weights.append(len(ids))
    model.zero_grad(set_to_none=True)
    hand = np.average(np.array(want), axis=0, weights=weights)
    assert got == pytest.approx(hand, rel=1e-6)
    assert len(set(np.round(got, 8))) == 3  # the layers differ: the check can tell them apart


def test_singular_values_are_computed_once_per_weight_and_again_when_it_changes(monkeypatch):
    """--budget's layer SNR and Spectrum share one SVD per matrix; a weight changed in place (through .data too)
    is decomposed again and gives the fresh numpy value, never the stale one."""
    import numpy as np

    from raycpt.diagnostics import selectors

    calls = []
    real = torch.linalg.svdvals
    monkeypatch.setattr(torch.linalg, "svdvals", lambda x: calls.append(1) or real(x))
    w = torch.nn.Parameter(torch.randn(12, 8, generator=torch.Generator().manual_seed(0)))
    first = matrix_snr(w)
    assert matrix_snr(w, normalize=True) == pytest.approx(first / float(np.linalg.svd(w.detach().double().numpy(),
                                                                                      compute_uv=False).max()))
    assert len(calls) == 1
    w.data.mul_(3.0)  # .data: no version bump
    w.data[0, 0] += 5.0
    want = np.linalg.svd(w.detach().double().numpy(), compute_uv=False)
    assert selectors.singular_values(w).numpy() == pytest.approx(want, rel=1e-12)
    assert len(calls) == 2
