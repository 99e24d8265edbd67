"""``raycpt compare`` and ``raycpt contribution`` end to end on tiny models (local Ray)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny import save_tiny

    root = tmp_path_factory.mktemp("pair")
    return save_tiny(root / "base", "llama", 4, 32, 0), save_tiny(root / "tuned", "llama", 4, 32, 1), root


def test_compare_cli_end_to_end(ray_local, pair, capsys):
    """Table rows per layer, swaps, plots, MLflow run FINISHED; CKA of a model with itself is 1."""
    import mlflow

    from raycpt.entry import main

    base, tuned, root = pair
    # no --prompts: the shipped WordNet glosses (no Debian package); overrides given like every command's
    rc = main(["compare", str(base), str(tuned), "--swap-blocks", "2", "--max-prompts", "8",
               f"tracking.run_root={root / 'runs'}", "eval.limit=4", "eval.modes=logit"])
    assert rc == 0
    run = next((root / "runs").glob("compare-*"))
    s = json.loads((run / "summary.json").read_text())
    assert len(s["layers"]) == 4 and len(s["swaps"]) == 4
    assert {p.name for p in (run / "plots").glob("*.png")} >= {"cka.png", "probe_accuracy.png", "swap.png",
                                                                "wc_attn.png", "compare_grid.png"}
    assert all(0 <= r["cka"] <= 1 for r in s["layers"]) and all(r["wc_total"] > 0 for r in s["layers"])
    mlflow.set_tracking_uri(f"sqlite:///{root / 'runs' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["raycpt"])
    assert set(runs["status"]) == {"FINISHED"}
    # the same weights on both sides (a copy: the same path twice is refused): CKA 1, weight change 0 (no swaps)
    import shutil

    twin = shutil.copytree(base, root / "base_copy")
    rc = main(["compare", str(base), str(twin), "--swap-blocks", "0", "--max-prompts", "4", "-c",
               f"tracking.run_root={root / 'runs2'}"])
    assert rc == 0
    s = json.loads((next((root / "runs2").glob("compare-*")) / "summary.json").read_text())
    assert all(r["cka"] == pytest.approx(1.0) and r["wc_total"] == 0 for r in s["layers"])


def test_compare_bad_inputs_one_line(pair, tmp_path, capsys):
    from tiny import save_tiny

    from raycpt.entry import main

    base, _, _ = pair
    three = save_tiny(tmp_path / "three", "llama", 3)
    qwen = save_tiny(tmp_path / "qwen", "qwen3", 4)
    capsys.readouterr()  # drop the progress bars of writing the fixtures
    for other, msg in ((three, "different layer counts: 4 vs 3"), (qwen, "different architectures")):
        rc = main(["compare", str(base), str(other), "-c", f"tracking.run_root={tmp_path / 'r'}"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and msg in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing started


@pytest.mark.slow
def test_contribution_cli_end_to_end(ray_local, pair, tmp_path, capsys):
    """base + full + one single-layer trial on a tiny model: ranking file in the elite format."""
    from raycpt.entry import main
    from raycpt.strategies import read_ranking

    base, _, _ = pair
    rc = main(["contribution", f"model.ref={base}", f"tracking.run_root={tmp_path}", "train.max_steps=3",
               "train.checkpoint_every=3", "train.lr=1e-2", "train.warmup_ratio=0", "data.max_documents=100",
               "data.seq_len=32", "eval.limit=12", "eval.modes=logit", "train.cpus_per_worker=0.5", "contribution.score=heldout_loss",
               "contribution.heldout_docs=16", "--layers", "1"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    run = next(tmp_path.glob("contribution-*"))
    s = json.loads((run / "summary.json").read_text())
    doc = read_ranking(run / "ranking.json", num_layers=4)
    assert [r["layer"] for r in doc["ranking"]] == [1]
    res = {n: json.loads((run / "trials" / n / "result.json").read_text()) for n in ("base", "full", "single-L01")}
    c = (res["base"]["heldout_loss"] - res["single-L01"]["heldout_loss"]) / (
        res["base"]["heldout_loss"] - res["full"]["heldout_loss"])
    assert math.isclose(doc["ranking"][0]["score"], c)
    assert (run / "plots" / "contribution.png").is_file()
    # trained alone, layer 1 moved and no other layer of that model did
    l2 = json.loads((run / "trials" / "single-L01" / "result.json").read_text())["l2"]
    assert l2[1] > 0 and l2[0] == l2[2] == l2[3] == 0


@pytest.mark.slow
def test_contribution_with_both_controls(ray_local, pair, tmp_path, capsys):
    """Two scanned layers, elite_k = 1: the elite-LR pair runs as a second grid (its own Tune folder), raises the
    best / the worst layer, and is reported; the sampled vote at T = 0 is the full model's greedy answer."""
    import mlflow

    from raycpt.entry import main

    base, _, _ = pair
    rc = main(["contribution", f"model.ref={base}", f"tracking.run_root={tmp_path}", "train.max_steps=3",
               "train.checkpoint_every=3", "train.lr=1e-2", "train.warmup_ratio=0", "data.max_documents=100",
               "data.seq_len=32", "eval.limit=12", "eval.modes=logit", "train.cpus_per_worker=0.5",
               "contribution.score=heldout_loss", "contribution.heldout_docs=16", "contribution.elite_lr_control=true",
               "contribution.elite_k=1", "contribution.elite_lr_scale=3", "contribution.sample_temperature=0",
               "--layers", "1,2"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    run = next(tmp_path.glob("contribution-*"))
    assert (run / "tune").is_dir() and (run / "tune-elite").is_dir()
    res = {n: json.loads((run / "trials" / n / "result.json").read_text())
           for n in ("base", "full", "single-L01", "single-L02", "elite-top", "elite-bottom")}
    best, worst = sorted((1, 2), key=lambda l: (res[f"single-L{l:02d}"]["heldout_loss"], l))  # lower loss = better
    s = json.loads((run / "summary.json").read_text())
    e = s["elite_lr_control"]
    assert e["top_layers"] == [best] and e["bottom_layers"] == [worst] and (e["k"], e["lr_scale"]) == (1, 3.0)
    assert math.isclose(e["top_minus_bottom"], res["elite-bottom"]["heldout_loss"] - res["elite-top"]["heldout_loss"])
    assert math.isclose(e["full_score"], -res["full"]["heldout_loss"])
    # every decoder layer trained in both elite trials (the rest at lr x1): more than one layer alone
    assert res["elite-top"]["trainable_params"] == res["elite-bottom"]["trainable_params"] > \
        res["single-L01"]["trainable_params"]
    full_ok = [a["correct"] for a in res["full"]["answers"].values()]
    sv = s["sampled_vote"]
    assert sv["k"] == 2 and math.isclose(sv["vote_acc"], 100 * sum(full_ok) / len(full_ok))  # T = 0: the greedy answer
    assert math.isclose(sv["paired"]["delta"], s["vote"]["vote_acc"] - sv["vote_acc"])
    md = (run / "contribution.md").read_text()
    assert "full's sampled vote" in md and "on the top-1 vs the bottom-1 layers" in md
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = mlflow.search_runs(experiment_names=["raycpt"], filter_string="tags.`raycpt.command` = 'contribution'")
    parent = parent[parent["tags.mlflow.parentRunId"].isna()].iloc[0]
    assert math.isclose(parent["metrics.elite_lr_control.top_minus_bottom"], e["top_minus_bottom"], rel_tol=1e-6)
    assert math.isclose(parent["metrics.sampled_vote.vote_acc"], sv["vote_acc"], rel_tol=1e-6)
