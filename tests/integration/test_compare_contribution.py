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

    from raycpt.cli import main

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
    # the same model on both sides: CKA 1, weight change 0 (no swaps)
    rc = main(["compare", str(base), str(base), "--swap-blocks", "0", "--max-prompts", "4", "-c",
               f"tracking.run_root={root / 'runs2'}"])
    assert rc == 0
    s = json.loads((next((root / "runs2").glob("compare-*")) / "summary.json").read_text())
    assert all(r["cka"] == pytest.approx(1.0) and r["wc_total"] == 0 for r in s["layers"])


def test_compare_bad_inputs_one_line(pair, tmp_path, capsys):
    from tiny import save_tiny

    from raycpt.cli import main

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
    from raycpt.cli import main
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
