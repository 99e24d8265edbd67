"""One owner per MLflow run, and the run folder as the record.

Each command runs through the console script in its own process (its private Ray, its Tune trials and training
workers in processes of their own), with ``tests/fault_site`` first on PYTHONPATH so that every MLflow client call
that starts or ends a run, in any of those processes, is counted (``RAYCPT_TEST_COUNT_RUNS``). Then
``raycpt runs sync RUN_DIR --tracking-uri OTHER`` replays the folder into an empty store, and the two stores must
hold the same runs: the same tree of runs, each with the same params, the same metric series (every point), the
same artifact files and the same status. A second sync adds nothing.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cli(args, env, timeout=900):
    r = subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=timeout,
                       env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def _env(counts: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": f"{ROOT / 'tests' / 'fault_site'}{os.pathsep}{ROOT}", "RAYCPT_TEST_COUNT_RUNS": str(counts)}
    env.pop("RAY_ADDRESS", None)
    return env


def _tree(uri: str) -> dict:
    """Every run of the store by its path of run names from the top, with its params, metric series, artifact
    files and status."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raycpt")
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}

    def path(r):
        parent = runs.get(r.data.tags.get("mlflow.parentRunId", ""))
        return (path(parent) if parent is not None else ()) + (r.info.run_name,)

    def files(run_id, folder=None):
        out = []
        for a in client.list_artifacts(run_id, folder):
            out += files(run_id, a.path) if a.is_dir else [a.path]
        return out

    out = {}
    for run_id, r in runs.items():
        series = {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in r.data.metrics}
        out[path(r)] = {"params": dict(r.data.params), "metrics": series, "files": sorted(files(run_id)),
                        "status": r.info.status}
    return out


def _counts(path: Path) -> dict:
    calls = collections.defaultdict(list)
    for line in path.read_text().splitlines():
        call, run_id, status = line.split()
        calls[run_id].append((call, status))
    return calls


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"word {i}: a short definition of thing number {i}; example {i}."}) + "\n")
    return corpus


def test_a_sweep_has_one_owner_per_run_and_its_folder_replays_to_the_same_records(tmp_path, tiny_dir):
    counts = tmp_path / "counts.txt"
    env = _env(counts)
    runs = tmp_path / "runs"
    over = [f"model.ref={tiny_dir}", f"data.corpus=[{_corpus(tmp_path)}]", "data.seq_len=32",
            "data.max_documents=50", "sweep.heldout_docs=10", "train.max_steps=2", "train.micro_batch_size=2",
            "train.checkpoint_every=1", "eval.tasks=[wordnet_mc]", "eval.modes=[logit]", "eval.limit=4",
            "eval.batch_size=4", "trace.max_prompts=8", "trace.batch_size=8", f"tracking.run_root={runs}",
            "name=owner"]
    _cli(["sweep", *over, "--splits", "0.5", "--strategies", "train_shallow"], env)
    run_dir = next(runs.glob("sweep-owner-*"))

    # every run the command made was created once and ended once, FINISHED, by one call
    calls = _counts(counts)
    live = _tree(f"sqlite:///{runs / 'mlflow.db'}")
    assert len(calls) == len(live) >= 5  # the sweep, its trace, base (evaluated, not trained), full, train_shallow-r0.5
    for run_id, seq in calls.items():
        assert [c for c, _ in seq] == ["create", "end"] and seq[-1][1] == "FINISHED", (run_id, seq)

    # the folder replays into an empty store as the same records, from the same projection
    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    (tmp_path / "other").mkdir()
    line = _cli(["runs", "sync", str(run_dir), "--tracking-uri", other], env).stdout
    assert "4 nested run(s) (4 new run(s))" in line, line
    synced = _tree(other)
    assert sorted(synced) == sorted(live)
    for key in live:
        assert synced[key] == live[key], key
    assert live[("owner",) if ("owner",) in live else next(k for k in live if len(k) == 1)]["status"] == "FINISHED"
    # the folder's own run id is kept (the other store's is in synced.json); a second sync adds nothing
    assert json.loads((run_dir / "state.json").read_text())["mlflow_run_id"] in calls
    again = _cli(["runs", "sync", str(run_dir), "--tracking-uri", other], env).stdout
    assert ": 0 item(s) added" in again and "(0 new run(s))" in again, again
    assert _tree(other) == synced


def _one_owner_and_replay(tmp_path, argv, prefix, env, units):
    """Run ``argv`` through the console script; every run it made was created once and ended once, FINISHED; its
    folder synced into an empty store equals the live store (params, every metric point, files, status); ``units``
    runs nest under the command's."""
    runs = tmp_path / "runs"
    _cli(argv, env)
    calls = _counts(tmp_path / "counts.txt")
    live = _tree(f"sqlite:///{runs / 'mlflow.db'}")
    assert len(calls) == len(live) == 1 + units, (len(calls), sorted(live))
    for run_id, seq in calls.items():
        assert [c for c, _ in seq] == ["create", "end"] and seq[-1][1] == "FINISHED", (run_id, seq)
    run_dir = next(runs.glob(f"{prefix}-*"))
    other = tmp_path / "other"
    other.mkdir()
    _cli(["runs", "sync", str(run_dir), "--tracking-uri", f"sqlite:///{other / 'mlflow.db'}"], env)
    synced = _tree(f"sqlite:///{other / 'mlflow.db'}")
    assert sorted(synced) == sorted(live)
    for key in live:
        assert synced[key] == live[key], key
    assert any(v["metrics"] for v in live.values())


def _over(tmp_path, tiny_dir, name):
    return [f"model.ref={tiny_dir}", f"data.corpus=[{_corpus(tmp_path)}]", "data.seq_len=32", "train.max_steps=2",
            "train.micro_batch_size=2", "train.checkpoint_every=2", "trace.max_prompts=8", "trace.batch_size=8",
            "eval.tasks=[wordnet_mc]", "eval.modes=[logit]", "eval.limit=4", "eval.batch_size=4",
            f"tracking.run_root={tmp_path / 'runs'}", f"name={name}"]


@pytest.mark.parametrize("command", ["trace", "train", *(pytest.param(c, marks=pytest.mark.slow)
                                                          for c in ("select", "eval", "compare"))])
def test_every_single_model_command_has_one_owner_per_run_and_replays(command, tmp_path, tiny_dir):
    """trace, train, select (the random selector), eval of two models (one child run each) and compare of two
    models: each run made once and ended once; its folder replays to the same records."""
    from tiny import save_tiny

    other = str(save_tiny(tmp_path / "other-model", seed=7))
    argv, units = {"trace": (["trace"], 0), "train": (["train"], 0), "select": (["select", "--method", "random"], 0),
                   "eval": (["eval", "--checkpoints", f"{tiny_dir},{other}"], 2),
                   "compare": (["compare", str(tiny_dir), other, "compare.max_prompts=4", "compare.max_len=16",
                                "compare.swap_blocks=0"], 0)}[command]
    _one_owner_and_replay(tmp_path, [*argv, *_over(tmp_path, tiny_dir, "one")], f"{command}-one",
                          _env(tmp_path / "counts.txt"), units)


@pytest.mark.slow
def test_a_contribution_scan_has_one_owner_per_run_and_replays(tmp_path, tiny_dir):
    """base + full + one single-layer trial: four runs (the scan, three trials), each made and ended once."""
    argv = ["contribution", *_over(tmp_path, tiny_dir, "scan"), "data.max_documents=50", "contribution.score=heldout_loss",
            "contribution.heldout_docs=8", "--layers", "1"]
    _one_owner_and_replay(tmp_path, argv, "contribution-scan", _env(tmp_path / "counts.txt"), 3)


@pytest.mark.slow
def test_a_hybrid_run_has_one_owner_per_run_and_replays(tmp_path, tiny_dir):
    """One build (new_shallow): the command's run, the build's, and the build's trace nested under it."""
    argv = ["hybrid", "run", *_over(tmp_path, tiny_dir, "hyb"), "hybrid.depth=4", "hybrid.new_kind=mamba2",
            "hybrid.builds=[new_shallow]", "trace.splits=[0.5]", "trace.max_prompts=4", "trace.top_k=5"]
    _one_owner_and_replay(tmp_path, argv, "hybrid-hyb", _env(tmp_path / "counts.txt"), 2)
