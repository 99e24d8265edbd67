"""The main job end to end on a tiny model: Tune results, one MLflow child run per trial under the
parent, the summary's deltas recomputed from the child runs' metrics, artifacts present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raycpt.config import load_config


def tiny_sweep_config(tmp_path: Path, model_dir: Path, extra: list[str] | None = None):
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"word {i}: a short definition of thing number {i}; example {i}."}) + "\n")
    over = [
        "name=tiny", f"model.ref={model_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32",
        "train.max_steps=3", "train.micro_batch_size=2", "train.checkpoint_every=2", "train.cpus_per_worker=0.5",
        "train.max_failures=0", "eval.limit=4", "eval.max_gen_toks=4", "eval.batch_size=4",
        "trace.max_prompts=8", "trace.batch_size=8", "trace.cpus_per_actor=0.5",
        f"tracking.run_root={tmp_path / 'runs'}", "sweep.cpus_per_trial=0.5",
        "sweep.include_base=false",  # the tests of other mechanics count the trained rows; the end-to-end one has it
    ]
    return load_config(None, over + list(extra or []))


def test_tiny_sweep_end_to_end(tmp_path, tiny_dir, ray_local):
    import mlflow

    from raycpt.jobs.sweep import run_sweep
    from raycpt.report.sweep.cells import summary_table

    # the first 50 documents train; 10 after them give every trial's held-out loss
    # sweep.keep_checkpoints: the store check below reads each finished trial's checkpoints (a finished trial
    # drops them by default and keeps only final_model/, which links its frozen layers to the base shards)
    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["data.max_documents=50", "sweep.heldout_docs=10",
                                                 "sweep.keep_checkpoints=true", "sweep.include_base=true"])
    res = run_sweep(cfg, splits=[0.25, 0.5], strategies=["train_shallow", "train_deep"])
    names = {t["name"] for t in res.trials}
    assert names == {"base", "full", "train_shallow-r0.25", "train_shallow-r0.5", "train_deep-r0.25",
                     "train_deep-r0.5"}
    trained = [t for t in res.trials if t["name"] != "base"]

    # Tune saw every trial finish
    from ray import tune

    from raycpt.jobs.grid import tune_trainable

    grid = tune.Tuner.restore(str(res.run_dir / "tune"), trainable=tune_trainable).get_results()
    assert len(grid) == 6 and not grid.errors

    # MLflow: one parent FINISHED, one child per trial under it, all FINISHED
    client = mlflow.tracking.MlflowClient(cfg.tracking.uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == res.parent_run_id
                and r.data.tags.get("raycpt.trial")]
    assert sorted(r.data.tags["raycpt.trial"] for r in children) == sorted(names)
    assert all(r.info.status == "FINISHED" for r in runs)
    parent = client.get_run(res.parent_run_id)
    assert parent.info.status == "FINISHED"
    # the embedded default's local SQLite store also holds the system metrics and the version tags
    import ray

    assert cfg.tracking.uri == f"sqlite:///{Path(cfg.tracking.run_root) / 'mlflow.db'}"
    assert all("system/cpu_utilization_percentage" in r.data.metrics for r in children
               if r.data.tags["raycpt.trial"] != "base")  # the base row trains nothing
    assert parent.data.tags["raycpt.ray_version"] == ray.__version__ and parent.data.metrics["sweep_wall_time_s"] > 0
    # issue 48: the parent run explains itself, each trial's run says its plan; the verdict says what to do
    from raycpt.report.sweep.views.terminal import compact_verdict

    lines = compact_verdict(res.summary)
    assert parent.data.tags["mlflow.source.name"] == "raycpt sweep"
    assert parent.data.tags["mlflow.note.content"].startswith("### Which decoder layers to train?")
    assert all(f"- {ln}" in parent.data.tags["mlflow.note.content"] for ln in lines)
    assert lines[1].startswith(("Leader on heldout_loss (point estimate, not a decision): ", "Recommended on "))
    notes = {r.data.tags["raycpt.trial"]: r.data.tags.get("mlflow.note.content", "") for r in children}
    assert notes["train_shallow-r0.5"].startswith("Sweep trial: train layers 0–1, freeze 2–3 (train_shallow r = 0.5)")
    assert notes["base"].startswith("The untrained model")
    rec = res.trace["recommended_split"]
    assert (rec in (0.25, 0.5)) != any(f"--splits {rec:g}" in ln for ln in lines)

    # the summary's deltas, recomputed from the child runs' own metrics
    by_name = {r.data.tags["raycpt.trial"]: r.data.metrics for r in children}
    for task, rows in res.summary["tables"].items():
        for row in rows:
            for cat, modes in row["cells"].items():
                for mode, cell in modes.items():
                    key = f"{task}/{cat}/{mode}"
                    assert cell["value"] == pytest.approx(by_name[row["name"]][key])
                    if row["name"] != "full":
                        assert cell["delta"] == pytest.approx(by_name[row["name"]][key] - by_name["full"][key])
    # S(b) from the trace for each split
    assert set(res.trace["split_scores"]) == {"0.25", "0.5"}

    # artifacts in the run folder and on the parent run
    summary = res.run_dir / "summary"
    for f in ("summary.md", "summary.json", "loss_curves.png"):
        assert (summary / f).is_file()
    logged = {a.path for a in client.list_artifacts(res.parent_run_id, "summary")}
    assert "summary/summary.md" in logged and "summary/loss_curves.png" in logged
    assert any(a.path.startswith("trace/") for a in client.list_artifacts(res.parent_run_id, "trace"))

    # the evaluation ran inside each training worker on the in-memory weights: the same scores come
    # back from a fresh evaluation of the published final model folder
    from raycpt.evaluate import evaluate_model

    full = next(t for t in res.trials if t["name"] == "full")
    again = evaluate_model(full["final_model_dir"], cfg.eval).metrics()
    assert again == pytest.approx(full["scores"])

    # held-out loss: documents 50..59, packed by hand into blocks of 32, then each document scored on its own
    # (issue 50): a block cut at EOS into runs, each run its own forward (after the tokenizer's BOS when it puts one
    # before every text), every token after a run's first counted, computed here with torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(full["final_model_dir"])
    docs = [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()[50:60]]
    flat = [t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    blocks = [flat[i:i + 32] for i in range(0, len(flat) - 31, 32)]
    bos = [tok.bos_token_id] if tok.bos_token_id is not None and tok("a")["input_ids"][:1] == [tok.bos_token_id] \
        else []
    runs = []
    for b in blocks:
        cur = []
        for x in b + [tok.eos_token_id]:
            if x == tok.eos_token_id:
                if len(cur) >= 2:
                    runs.append(cur)
                cur = []
            else:
                cur.append(x)
    for t in res.trials:
        model = AutoModelForCausalLM.from_pretrained(t["final_model_dir"], torch_dtype=torch.float32).eval()
        nats, n = 0.0, 0
        with torch.no_grad():
            for r in runs:
                ids = torch.tensor([bos + r])
                logits = model(ids).logits[0, len(bos):-1]
                nats += float(torch.nn.functional.cross_entropy(logits, ids[0, len(bos) + 1:], reduction="sum"))
                n += len(r) - 1
        assert t["heldout_loss"] == pytest.approx(nats / n, rel=1e-4)
        assert by_name[t["name"]]["heldout_loss"] == pytest.approx(nats / n, rel=1e-4)
    assert "held-out loss" in (summary / "summary.md").read_text()
    # the base row (the untrained model, its final_model_dir the model folder): every row's gain against it is
    # its held-out loss below base's, by the hand losses above
    base = next(t for t in res.trials if t["name"] == "base")
    assert base["final_model_dir"] == str(tiny_dir) or Path(base["final_model_dir"]) == Path(tiny_dir).resolve()
    gains = {r["name"]: r["cells"][0] for r in res.summary["base"]["rows"]}
    assert set(gains) == names - {"base"} and res.summary["base"]["metrics"][0]["task"] == "heldout_loss"
    for t in trained:
        assert gains[t["name"]]["shown"] == pytest.approx(base["heldout_loss"] - t["heldout_loss"], abs=1e-9)

    # the corpus was tokenised exactly once for the whole sweep: one packed store, built once (the
    # pack log has one line), holding the first 50 documents; every trial read it
    from raycpt.data.store import builds_logged, list_stores

    root = tmp_path / "runs" / "packed"
    (store,) = list_stores(root)
    assert store.manifest["build"] == 1 and len(builds_logged(root)) == 1
    assert store.manifest["num_documents"] == 50 and store.manifest["seq_len"] == 32
    for t in trained:
        ck = sorted((res.run_dir / "trials").glob(f"{t['name']}/**/checkpoint_*/train_state.json"))
        assert ck and json.loads(ck[-1].read_text())["data"]["store_build"] == store.build_id
    assert (summary / "heldout_loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "summary/heldout_loss.png" in logged


def test_trial_fallback_evaluation_matches_the_bridge_and_a_hand_loss(tmp_path, tiny_dir):
    """A trial whose worker did not evaluate (FSDP) evaluates the saved folder in the trial process:
    the same scores as the eval bridge, and the held-out loss of a hand computation."""
    import torch
    from transformers import AutoModelForCausalLM

    from raycpt.evaluate import evaluate_model
    from raycpt.train.driver.final_eval import final_evaluation
    from raycpt.train.worker.evaluation import EvalRequest

    cfg = tiny_sweep_config(tmp_path, tiny_dir)
    blocks = [[(7 * i + j) % 50 + 3 for j in range(16)] for i in range(3)]
    path = tmp_path / "heldout.json"
    path.write_text(json.dumps(blocks))
    ev, heldout = final_evaluation(str(tiny_dir), cfg.eval, EvalRequest(str(tmp_path / "eval"), "t", str(path)),
                                   threads=2)
    cells = ev.metrics()
    assert cells == pytest.approx(evaluate_model(str(tiny_dir), cfg.eval).metrics())
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    # no EOS (2) in these blocks: each is one document's piece, scored after the tokenizer's BOS (1), which it
    # puts before every text; the targets are the block's tokens after its first
    ids = torch.tensor([[1] + b for b in blocks])
    labels = ids.clone()
    labels[:, :2] = -100
    with torch.no_grad():
        each = [float(model(input_ids=ids[i:i + 1], labels=labels[i:i + 1]).loss) for i in range(3)]
    assert heldout == pytest.approx(sum(each) / 3, rel=1e-5)
    # the fallback writes the worker's eval_result.json, per-block held-out losses included (for the
    # paired bootstrap over blocks), and a second call reads it instead of evaluating again
    saved = json.loads((tmp_path / "eval" / "eval_result.json").read_text())
    assert saved["heldout_block_losses"] == pytest.approx(each, rel=1e-5)
    assert saved["heldout_block_weights"] == [15, 15, 15] and saved["questions"] == ev.questions
    again, heldout2 = final_evaluation(str(tmp_path / "nowhere"), cfg.eval,
                                       EvalRequest(str(tmp_path / "eval"), "t", str(path)))
    assert heldout2 == heldout and again.metrics() == cells
