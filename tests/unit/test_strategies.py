"""Layer plans: layer maps on tiny models of two architectures, rounding, tied embeddings, errors,
parameter groups. Expected maps are written out by hand (or from the papers' examples)."""

import json
import re

import pytest
import torch

from raycpt.config import PlanConfig
from raycpt.errors import RaycptError
from raycpt.strategies import (PLANS, apply_plan, block_sizes, build_plan, param_groups, plan_for_model, plan_table,
                               read_ranking, split_index, write_ranking)
from tiny import tiny_model

ARCHES = ["llama", "qwen2"]  # llama: tied embeddings; qwen2: untied, with attention biases


def layer_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def trainable_layers_by_name(model):
    """Which decoder layers train, read from parameter names (independent of LayerStack)."""
    on, off = set(), set()
    for n, p in model.named_parameters():
        i = layer_of(n)
        if i is not None:
            (on if p.requires_grad else off).add(i)
    assert not (on & off), "a layer is half trainable"
    return sorted(on)


def expected_map(n, layers):
    return "".join("T" if i in layers else "." for i in range(n))


# (plan config, num_layers, expected trainable layers) - worked by hand
CASES = [
    (dict(name="full"), 5, [0, 1, 2, 3, 4]),
    (dict(name="train_shallow", split=0.5), 5, [0, 1, 2]),       # 2.5 -> 3 (half up; was 2, half to even)
    (dict(name="train_deep", split=0.5), 5, [3, 4]),
    (dict(name="train_shallow", split=0.5), 7, [0, 1, 2, 3]),    # round(3.5) = 4
    (dict(name="train_deep", split=0.5), 7, [4, 5, 6]),
    (dict(name="train_shallow", split=0.3), 5, [0, 1]),          # round(1.5) = 2
    (dict(name="train_deep", split=0.66), 6, [4, 5]),            # round(3.96) = 4
    (dict(name="blocks", pattern="01100"), 5, [1, 2]),
    (dict(name="blocks", pattern="011"), 7, [3, 4, 5, 6]),       # blocks of 3, 2, 2
    (dict(name="blocks", pattern="10"), 5, [0, 1, 2]),           # blocks of 3, 2
    (dict(name="layers", layers=[4, 1, 1]), 5, [1, 4]),
    (dict(name="single", layer=3), 5, [3]),
    (dict(name="middle", k=3), 7, [2, 3, 4]),
    (dict(name="middle", k=3), 6, [1, 2, 3]),                    # (6 - 3) // 2 = 1
    (dict(name="middle", k=1), 5, [2]),
]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("spec,n,layers", CASES)
def test_layer_map_on_model(arch, spec, n, layers):
    model = tiny_model(arch, num_layers=n)
    plan = plan_for_model(PlanConfig(**spec), model)
    assert plan.layer_map() == expected_map(n, layers)
    counts = apply_plan(model, plan)
    assert trainable_layers_by_name(model) == layers
    # naive count: every parameter tensor once, by name
    seen, trainable = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        i = layer_of(name)
        full = spec["name"] == "full"
        if (i is not None and i in layers) or (i is None and full):
            trainable += p.numel()
    assert counts["trainable"] == trainable
    assert counts["trainable"] + counts["frozen"] == sum(p.numel() for p in model.parameters())


def test_every_registered_plan_is_covered():
    # elite: its own tests below; lisa, expand, spectrum, elo: test_lisa.py, test_expand.py, test_spectrum.py, and below
    assert {c[0]["name"] for c in CASES} | {"elite", "lisa", "expand", "spectrum", "elo"} == set(PLANS)


@pytest.mark.parametrize("n,r,b", [(30, 0.5, 15), (30, 0.33, 10), (30, 0.66, 20), (28, 0.5, 14), (5, 0.5, 3),
                                   (7, 0.5, 4), (36, 0.5, 18), (5, 0.7, 4)])
def test_split_index_rounds(n, r, b):
    assert split_index(r, n) == b


def test_paper_examples_on_depth_only():
    # seeds/003: middle-5 of 28 layers = 11..15, of 36 layers = 15..19
    assert build_plan(PlanConfig(name="middle", k=5), 28).trainable_layers == (11, 12, 13, 14, 15)
    assert build_plan(PlanConfig(name="middle", k=5), 36).trainable_layers == (15, 16, 17, 18, 19)
    # seeds/002: 01100 over 5 equal blocks of a 30-layer model = layers 6..17
    assert build_plan(PlanConfig(name="blocks", pattern="01100"), 30).trainable_layers == tuple(range(6, 18))
    # 30 layers in 4 blocks: 8, 8, 7, 7
    assert block_sizes(30, 4) == [8, 8, 7, 7]
    assert build_plan(PlanConfig(name="blocks", pattern="0110"), 30).trainable_layers == tuple(range(8, 23))


@pytest.mark.parametrize("spec,msg", [
    (dict(name="layers", layers=[0, 5]), "plan.layers=5 is out of range"),
    (dict(name="layers", layers=[-1]), "out of range"),
    (dict(name="single", layer=9), "plan.layer=9 is out of range"),
    (dict(name="layers", layers=[]), "trains nothing"),
    (dict(name="blocks", pattern="000"), "trains nothing"),
    (dict(name="train_shallow", split=0.05), "leaves the shallow side empty"),
    (dict(name="train_deep", split=0.95), "leaves the deep side empty"),
    (dict(name="blocks", pattern="010101"), "6 blocks"),
    (dict(name="blocks", pattern=""), "needs a 0/1 pattern"),
    (dict(name="middle", k=6), "cannot take 6 layers"),
    (dict(name="elite", k=2), "plan.ranking_file is not set"),
    (dict(name="layers", layers=[1], lr_scales={7: 2.0}), "plan.lr_scales layer=7 is out of range"),
])
def test_bad_plans_are_one_line(spec, msg):
    with pytest.raises(RaycptError) as e:
        build_plan(PlanConfig(**spec), 5)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_nothing_but_head_is_allowed():
    plan = build_plan(PlanConfig(name="layers", layers=[], train_head=True), 4)
    assert plan.trainable_layers == () and plan.train_head and plan.first_trainable == 4


def test_tied_embeddings_are_explicit():
    tied = tiny_model("llama", num_layers=4)      # tie_word_embeddings=True
    untied = tiny_model("qwen2", num_layers=4)
    pc = PlanConfig(name="single", layer=1, train_head=True)
    p_tied = plan_for_model(pc, tied)
    assert p_tied.tied_embeddings and p_tied.train_embeddings and p_tied.train_head
    assert any("tied embeddings" in n and "trains both" in n for n in p_tied.notes)
    apply_plan(tied, p_tied)
    assert tied.get_input_embeddings().weight.requires_grad and tied.lm_head.weight.requires_grad
    p_untied = plan_for_model(pc, untied)
    assert not p_untied.tied_embeddings and not p_untied.train_embeddings and p_untied.train_head
    apply_plan(untied, p_untied)
    assert not untied.get_input_embeddings().weight.requires_grad and untied.lm_head.weight.requires_grad
    # plan_table counts the shared matrix once, under embed
    t = plan_table(tied, p_tied)
    head = next(r for r in t["rows"] if r["part"] == "head")
    assert head["params"] == 0 and head["tied"]
    assert t["total"] == sum(p.numel() for p in tied.parameters())


def test_lr_scales_reach_param_groups():
    model = tiny_model("qwen2", num_layers=4)
    plan = plan_for_model(PlanConfig(name="train_shallow", split=0.5, lr_scales={1: 3.0, 3: 5.0}), model)
    assert plan.lr_scales == {1: 3.0}
    assert any("layer 3 ignored" in n for n in plan.notes)
    apply_plan(model, plan)
    groups = param_groups(model, plan, lr=1e-3, weight_decay=0.1)
    by_param = {id(p): g for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert id(p) not in by_param
            continue
        g = by_param[id(p)]
        want = 3e-3 if layer_of(name) == 1 else 1e-3
        assert g["lr"] == pytest.approx(want)
        assert g["weight_decay"] == (0.0 if p.dim() == 1 else 0.1)  # norms and biases: no decay
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in model.parameters() if p.requires_grad}


def test_ranking_roundtrip_and_elite(tmp_path):
    path = tmp_path / "ranking.json"
    scores = {0: 0.2, 1: 1.14, 2: float("nan"), 3: 1.12, 4: 0.9}
    write_ranking(path, model="tiny", num_layers=5, scores=scores)
    doc = json.loads(path.read_text())
    assert [r["layer"] for r in doc["ranking"]] == [1, 3, 4, 0, 2] and doc["num_layers"] == 5
    assert [r["layer"] for r in read_ranking(path, 5)["ranking"]] == [1, 3, 4, 0, 2]
    plan = build_plan(PlanConfig(name="elite", k=2, ranking_file=str(path), elite_lr_scale=2.0), 5)
    assert plan.trainable_layers == (1, 3) and plan.lr_scales == {1: 2.0, 3: 2.0}
    rest = build_plan(PlanConfig(name="elite", k=2, ranking_file=str(path), elite_lr_scale=2.0,
                                 elite_train_rest=True), 5)
    assert rest.trainable_layers == (0, 1, 2, 3, 4) and rest.lr_scales == {1: 2.0, 3: 2.0}
    with pytest.raises(RaycptError, match="for a 5-layer model, this model has 6"):
        build_plan(PlanConfig(name="elite", k=2, ranking_file=str(path)), 6)
    with pytest.raises(RaycptError, match="lists only 5"):
        build_plan(PlanConfig(name="elite", k=6, ranking_file=str(path)), 5)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ranking": [{"layer": 9, "score": 1}]}))
    with pytest.raises(RaycptError, match="out of range"):
        read_ranking(bad, 5)


def test_elite_bottom_pick_is_the_lowest_contribution_layers(tmp_path):
    """003's control: the k layers with the LOWEST contribution, at the same k and scale, on their groups."""
    path = tmp_path / "ranking.json"
    # by hand: finite scores ascending -> layer 5 (-0.3), then 0 and 4 tie at 0.2 (the lower layer first: 0),
    # then 4, 2 (0.7), ...; layer 3 has no score and is never picked
    scores = {0: 0.2, 1: 1.14, 2: 0.7, 3: float("nan"), 4: 0.2, 5: -0.3}
    write_ranking(path, model="tiny", num_layers=6, scores=scores)
    from raycpt.strategies import ranked_pick
    rows = read_ranking(path, 6)["ranking"]
    assert ranked_pick(rows, 2, "bottom") == [0, 5] and ranked_pick(rows, 3, "bottom") == [0, 4, 5]
    assert ranked_pick(rows, 2, "top") == [1, 2]
    with pytest.raises(RaycptError, match="lists only 5 layers with a score"):
        ranked_pick(rows, 6, "bottom")
    model = tiny_model("qwen2", num_layers=6)
    pcfg = PlanConfig(name="elite", k=2, ranking_file=str(path), elite_lr_scale=2.0, elite_train_rest=True)
    top = plan_for_model(pcfg, model)
    bottom = plan_for_model(PlanConfig(**{**vars(pcfg), "elite_pick": "bottom"}), model)
    assert top.lr_scales == {1: 2.0, 2: 2.0} and bottom.lr_scales == {0: 2.0, 5: 2.0}
    assert bottom.trainable_layers == tuple(range(6)) and any("bottom" in n for n in bottom.notes)
    apply_plan(model, bottom)
    by_param = {id(p): g for g in param_groups(model, bottom, lr=1e-3, weight_decay=0.0) for p in g["params"]}
    for name, p in model.named_parameters():  # the layer read from the parameter's name, not from the plan
        if p.requires_grad:
            assert by_param[id(p)]["lr"] == pytest.approx(2e-3 if layer_of(name) in (0, 5) else 1e-3), name
    with pytest.raises(RaycptError, match="plan.elite_pick"):
        PlanConfig(name="elite", elite_pick="lowest")


def test_plan_roundtrips_through_dict():
    from raycpt.strategies import LayerPlan

    plan = build_plan(PlanConfig(name="layers", layers=[0, 2], lr_scales={2: 4.0}, train_final_norm=True), 4)
    assert LayerPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_meta_device_counts_match_real_model():
    from transformers import AutoModelForCausalLM

    real = tiny_model("llama", num_layers=4)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(real.config)
    pc = PlanConfig(name="train_deep", split=0.5)
    a = plan_table(real, plan_for_model(pc, real))
    b = plan_table(meta, plan_for_model(pc, meta))
    assert (a["trainable"], a["frozen"]) == (b["trainable"], b["frozen"])


def test_plan_show_cli(tiny_dir, capsys):
    from raycpt.entry import main

    rc = main(["plan", "show", f"model.ref={tiny_dir}", "plan.name=train_deep", "plan.split=0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "layer map (layer 0 first, T = trains): ..TT" in out
    model = tiny_model("llama", num_layers=4)  # save_tiny's model: the same config and seed
    deep = sum(p.numel() for n, p in model.named_parameters() if layer_of(n) in (2, 3))
    assert f"trainable {deep:,} / frozen {sum(p.numel() for p in model.parameters()) - deep:,}" in out
    rc = main(["plan", "show", f"model.ref={tiny_dir}", "plan.name=single", "plan.layer=4"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: plan.layer=4 is out of range: this model has layers 0..3"


def test_elo_plan_trains_the_first_and_the_last_layers():
    assert build_plan(PlanConfig(name="elo"), 30).trainable_layers == (0, 29)
    assert build_plan(PlanConfig(name="elo", elo_layers=2), 6).trainable_layers == (0, 1, 4, 5)
    with pytest.raises(RaycptError, match="plan.elo_layers=4: .* 8 of this 6-layer model"):
        build_plan(PlanConfig(name="elo", elo_layers=4), 6)
