"""configs/recipes.yaml runs seed 002 as written: LoRA (peft) on the chosen blocks against LoRA on every layer at
one rank, alpha and learning rate; the adapters sit only on the chosen blocks (peft's LoRA modules counted per
decoder layer), the full-weight variants stay under their own names."""

from pathlib import Path

import pytest

from raycpt.config import config_with, load_config
from raycpt.models.adapters import inject_lora
from raycpt.strategies import apply_plan, build_plan
from tiny import tiny_model

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "recipes.yaml"
N = 10  # 5 blocks of 2 layers: pattern 01100 -> layers 2..5


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [int(n.split(".")[2]) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


@pytest.mark.parametrize("name,layers", [("lora_mid_01100", [2, 3, 4, 5]), ("lora_mid_01000", [2, 3]),
                                         ("lora_mid_01110", [2, 3, 4, 5, 6, 7]), ("lora_edge_10000", [0, 1]),
                                         ("lora_edge_00001", [8, 9]), ("lora_all", list(range(N)))])
def test_the_adapters_sit_only_on_the_chosen_blocks(name, layers):
    cfg = load_config(RECIPES)
    recipe = cfg.sweep.recipes[name]
    tcfg = config_with(cfg, recipe)
    model = tiny_model("llama", num_layers=N)
    plan = build_plan(tcfg.plan, N, tied_embeddings=True)
    inject_lora(model, plan)
    got = _lora_layers(model)
    assert sorted(set(got)) == layers and len(got) == 7 * len(layers)  # q k v o gate up down per layer
    apply_plan(model, plan)
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains and all("lora_" in n for n in trains)  # the blocks' own weights stay frozen
    assert (plan.lora_rank, plan.lora_alpha, tcfg.train.lr) == (16, 32.0, 3e-4)  # equal treatment, alpha = 2r


def test_every_lora_recipe_has_its_full_weight_variant_under_its_own_name():
    cfg = load_config(RECIPES)
    lora = [n for n in cfg.sweep.strategies if n.startswith("lora_") and n != "lora_all"]
    assert len(lora) == 6
    for n in lora:
        full = cfg.sweep.recipes[n[len("lora_"):]]
        assert "plan.adapter" not in full and full["plan.pattern"] == cfg.sweep.recipes[n]["plan.pattern"]
        assert n[len("lora_"):] in cfg.sweep.strategies
