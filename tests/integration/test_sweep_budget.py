"""``raycpt sweep --budget B`` on the tiny model, up to the grid (no Ray): the trials are the equal-budget rows,
each row's predicted trainable count equals what its plan really trains (the plan code counts it on the model),
the LoRA rank and the splits are the ones a hand count of the tiny Llama gives; a budget below one layer or
above the model, and ``auto`` without the trace, are one line, exit 2; ``auto`` = the recommended
train_shallow's count, by hand."""

import pytest


def _cfg(tmp_path, tiny_dir, budget):
    from raycpt.config import load_config

    return load_config(None, [f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", "data.seq_len=16",
                              "select.samples=4", f"sweep.budget={budget}", "sweep.lr_grid=[1]"])


def test_budget_trials_train_what_they_promise(tiny_dir, tmp_path):
    from raycpt.jobs.sweep import prepare, trial_config
    from raycpt.train.driver.prepare import prepare_plan
    from tiny import tiny_model

    model = tiny_model("llama", num_layers=4)  # save_tiny's model
    layer = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.layers.0."))
    cfg = _cfg(tmp_path, tiny_dir, 2 * layer)
    plan = prepare(cfg)
    names = [t.name for t in plan.specs]
    # base (the untrained model, evaluated for gain and forgetting), full, then shallow, deep, bi, snr_layer,
    # gradnorm, elo, 3 random, lisa, lora, expand, spectrum
    assert names[:2] == ["base", "full"] and len(names) == 2 + 13
    # LISA trains gamma layers + the tied embedding (128 x 32) + the final norm (32): gamma 1 -> layer + 4128,
    # gamma 2 -> 2 layers + 4128 (nearer 2 layers, as a layer here has 9280 parameters)
    assert layer == 9280
    assert {"layertracer-shallow", "layertracer-deep", "bi-top2", "snr_layer-top2", "gradnorm-top2", "elo-top2",
            "lisa-g2", "expand-p2"} <= set(names)
    # LoRA per unit of rank, by hand: hidden 32, 4 heads of 8, 2 kv heads, MLP 64 -> q 32+32, k 32+16, v 32+16,
    # o 32+32, gate 32+64, up 32+64, down 64+32 = 512 per layer, 2048 on 4 layers; 2 layers = 2 * layer params
    lora = next(n for n in names if n.startswith("lora-r"))
    assert lora == f"lora-r{min(16, round(2 * layer / 2048))}"
    by_name = {t.name: t for t in plan.specs}
    for name in names[2:]:
        tcfg = trial_config(plan.cfg, by_name[name])
        if name.startswith(("lisa", "expand", "spectrum")):  # LISA draws per interval; expand trains an expanded
            continue  # model; Spectrum trains embeddings + head + its matrices (tests/unit/test_spectrum.py)
        _, counts, _ = prepare_plan(tcfg, plan.model_path)
        want = 2 * layer if not name.startswith("lora") else int(lora[6:]) * 2048
        assert counts["trainable"] == want, (name, counts["trainable"], want)
    assert by_name["layertracer-shallow"].recipe == {"plan.name": "train_shallow", "plan.split": 0.5}
    assert by_name["layertracer-deep"].recipe == {"plan.name": "train_deep", "plan.split": 0.5}


@pytest.mark.parametrize("budget,line", [
    ("5", "error: --budget 5 is below one layer's parameters ({layer:,}): no plan fits it"),
    ("999999999", "error: --budget 999,999,999 is above the model's {total:,} parameters"),
    ("auto sweep.trace_first=false", "error: --budget auto is the recommended train_shallow's count: it needs "
                                     "the trace (sweep.trace_first=true), or give a trainable-parameter count")])
def test_bad_budget_is_one_line(tiny_dir, tmp_path, capsys, budget, line):
    from raycpt.entry import main
    from tiny import tiny_model

    model = tiny_model("llama", num_layers=4)
    layer = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.layers.0."))
    total = sum(p.numel() for p in model.parameters())
    word, *over = budget.split()
    rc = main(["sweep", f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", *over, "--budget", word])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.strip() == line.format(layer=layer, total=total)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("sweep-*"))


def _e2e_config(tiny_dir, tmp_path, budget):
    import json

    from raycpt.config import load_config

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"word {i}: a short definition of thing number {i}."}) + "\n"
                              for i in range(60)))
    return load_config(None, [
        "name=tiny", f"model.ref={tiny_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32", "train.max_steps=2",
        "train.micro_batch_size=2", "train.checkpoint_every=2", "train.cpus_per_worker=0.5", "train.max_failures=0",
        "eval.limit=4", "eval.max_gen_toks=4", "eval.batch_size=4", "trace.max_prompts=8", "trace.batch_size=8",
        "trace.cpus_per_actor=0.5", f"tracking.run_root={tmp_path / 'runs'}", "sweep.cpus_per_trial=0.5",
        "select.samples=4", f"sweep.budget={budget}", "sweep.lr_grid=[1]"])


@pytest.mark.slow
def test_budget_auto_sweep_trains_at_the_recommended_shallow_count(tiny_dir, tmp_path, ray_local):
    from raycpt.jobs.sweep import run_sweep
    from raycpt.splits import split_index
    from tiny import tiny_model

    layer = sum(p.numel() for n, p in tiny_model("llama", num_layers=4).named_parameters()
                if n.startswith("model.layers.0."))
    res = run_sweep(_e2e_config(tiny_dir, tmp_path, "auto"))
    b = split_index(res.trace["recommended_split"], 4)
    got = {t["name"]: t["trainable_params"] for t in res.trials}
    assert len(got) == 14 and got["layertracer-shallow"] == b * layer


@pytest.mark.slow
def test_budget_sweep_end_to_end(tiny_dir, tmp_path, ray_local):
    """Every equal-budget trial trains and evaluates in the sweep's grid; the summary has a row per trial with
    the trainable count the budget rows predicted (LoRA, layers, splits, expand; LISA's per-interval count)."""
    from raycpt.jobs.sweep import run_sweep
    from tiny import tiny_model

    layer = sum(p.numel() for n, p in tiny_model("llama", num_layers=4).named_parameters()
                if n.startswith("model.layers.0."))
    cfg = _e2e_config(tiny_dir, tmp_path, 2 * layer)
    res = run_sweep(cfg)
    got = {t["name"]: t["trainable_params"] for t in res.trials}
    assert len(got) == 14 and got["full"] == 4 * layer  # sweep.equal_footing: full trains the layers only
    for name in ("layertracer-shallow", "layertracer-deep", "bi-top2", "snr_layer-top2", "elo-top2", "expand-p2"):
        assert got[name] == 2 * layer, (name, got[name])
    lora = next(n for n in got if n.startswith("lora-r"))
    assert got[lora] == int(lora[6:]) * 2048


def test_auto_budget_is_the_recommended_train_shallow_count():
    from raycpt.jobs.sweep import auto_budget

    sizes = [10, 20, 30, 40, 50]
    assert auto_budget(0.5, sizes) == 10 + 20 + 30  # b = floor(0.5 * 5 + 1/2) = 3
    assert auto_budget(0.2, sizes) == 10  # b = floor(1.5) = 1
    assert auto_budget(0.66, sizes) == 60  # b = floor(3.3 + 0.5) = 3
    assert auto_budget(0.8, sizes) == 100  # b = floor(4.5) = 4
