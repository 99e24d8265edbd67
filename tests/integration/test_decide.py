"""``raycpt decide`` end to end on the tiny model (Ray Tune, MLflow file store): every arm's rate is the lowest
validation loss of its search, the report's decision accuracy is what a naive count over the trials' own
``result.json`` files gives, every trial is a child run of the one decide run, and the files are written."""

from __future__ import annotations

import itertools
import json
import math

import pytest


def _cfg(tiny_dir, tmp_path):
    from raycpt.config import load_config

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"word {i}: a short definition of thing number {i}."}) + "\n"
                              for i in range(200)))
    return load_config(None, [
        "name=tiny", f"model.ref={tiny_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32", "train.max_steps=2",
        "train.micro_batch_size=2", "train.checkpoint_every=2", "train.cpus_per_worker=0.5", "train.max_failures=0",
        "eval.limit=4", "eval.batch_size=4", "eval.modes=[logit]", "data.max_documents=150", "train.lr=1e-3",
        f"tracking.run_root={tmp_path / 'runs'}", "sweep.cpus_per_trial=0.5", "sweep.heldout_docs=8",
        "sweep.validation_docs=8", "sweep.general_docs=0",
        "decide.arms={full: {plan.name: full}, shallow-r0.5: {plan.name: train_shallow, plan.split: 0.5}}",
        "decide.budget_arms=[]", "decide.horizons=[1,2]", "decide.seeds=[0,1]", "decide.max_extensions=1"])


@pytest.mark.slow
def test_decide_end_to_end(tiny_dir, tmp_path, ray_local):
    import mlflow

    from raycpt.jobs.decide import DECIDE
    from raycpt.jobs.job import Options, run_job

    res = run_job(DECIDE, _cfg(tiny_dir, tmp_path), Options())
    trials = [json.loads(p.read_text()) for p in (res.run_dir / "trials").glob("*/result.json")]
    # the pick per arm and horizon: the lowest validation loss at the search seed (ties: the smaller rate)
    picks = {}
    for group in {t["tune"] for t in trials}:
        runs = [t for t in trials if t["tune"] == group and t["seed"] == 0]
        picks[group] = min(runs, key=lambda t: (t["validation_loss"], t["lr_mult"]))["lr_mult"]
    doc = json.loads((res.run_dir / "summary" / "decision.json").read_text())
    for h, arms in doc["picks"].items():
        for arm, p in arms.items():
            assert p["picked"] == pytest.approx(picks[f"{arm}-h{float(h):g}"])
    # the held-out loss per arm at its pick, seed means, by hand; then decision accuracy over the one pair
    def mean(group):
        vals = [t["heldout_loss"] for t in trials if t["tune"] == group and t["lr_mult"] == picks[group]]
        assert len(vals) == 2  # both seeds at the pick
        return sum(vals) / 2
    short = {a: mean(f"{a}-h1") for a in ("full", "shallow-r0.5")}
    long = {a: mean(f"{a}-h2") for a in ("full", "shallow-r0.5")}
    naive = [(short[a] < short[b]) == (long[a] < long[b]) for a, b in itertools.combinations(short, 2)]
    got = doc["results"]["decision_accuracy_all_pairs"]
    assert got["n"] == 1 and got["value"] == pytest.approx(sum(naive) / len(naive))
    assert all(math.isfinite(x) for x in short.values())
    # every trial a child run of the decide run, in the run root's store
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    children = mlflow.search_runs(search_all_experiments=True,
                                  filter_string=f"tags.mlflow.parentRunId = '{res.parent_run_id}'")
    assert len(children) >= len(trials)
    for f in ("decision.md", "decision.json", "decision.png"):
        assert (res.run_dir / "summary" / f).stat().st_size > 0
