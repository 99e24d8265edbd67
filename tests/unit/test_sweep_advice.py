"""Issue 48: a verdict that says what to do, an MLflow run that explains itself.

The recommendation line on hand-built sweeps of a 30-layer model (layer ranges worked out by hand from
b = floor(r*N + 1/2): r = 0.33 -> b = floor(10.4) = 10, so train_shallow trains layers 0-9 and freezes 10-29), one
run per row (the point estimates' leader, "not a decision", the command that would decide) and three (a strategy
claim, the command that trains it); the trace's untrained split named with its command; and the description tag on
the sweep's parent run in a real SQLite store, replayed from the run folder's records into a second store, with the
run's dataset inputs (digests worked out in the test), the leader's model linked to its trial's folder and the
experiment's kind, read back from the store and from a second one ``raycpt runs sync`` fills."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from raycpt.report.sweep.summary import build_summary
from raycpt.report.sweep.views.advice import layer_words, trial_description
from raycpt.report.sweep.views.terminal import compact_verdict

RNG = np.random.default_rng(48)
BLOCKS = 3.5 + 0.3 * RNG.standard_normal(40)  # the held-out blocks' losses of the untrained model
ROWS = {"full": ("full", None, -0.10), "train_shallow-r0.33": ("train_shallow", 0.33, -0.15),
        "train_deep-r0.33": ("train_deep", 0.33, -0.05), "train_shallow-r0.66": ("train_shallow", 0.66, -0.12)}
NOISE = {name: 0.004 * RNG.standard_normal(40) for name in ROWS}  # each row's own block-level scatter


def _trial(name, seed=None, shift=0.0):
    strategy, split, gain = ROWS[name]
    blocks = BLOCKS + gain + NOISE[name] + shift
    return {"name": name if seed is None else f"{name}-s{seed}", "group": name, "strategy": strategy, "split": split,
            "b": None, "seed": seed or 0, "scores": {"wn/average/logit": 50.0},
            "heldout_blocks": list(blocks), "heldout_weights": [63] * len(blocks), "heldout_loss": float(np.mean(blocks))}


def _summary(trials, recommended=0.3):
    s = build_summary(trials, {"split_scores": {"0.33": 0.4}}, ["wn"], [], resamples=200,
                      report={"primary": "heldout_loss"}, num_layers=30)
    s.update(num_layers=30, recommended_split=recommended)  # what write_summary adds
    return s


def test_layer_ranges_by_hand():
    assert layer_words("train_shallow", 0.33, 30) == "train layers 0–9, freeze 10–29 (train_shallow r = 0.33)"
    assert layer_words("train_deep", 0.66, 30) == "freeze layers 0–19, train 20–29 (train_deep r = 0.66)"  # b = 20
    assert layer_words("train_shallow", 1 / 3, 28).startswith("train layers 0–8, freeze 9–27")  # 004's Table 9: 9
    assert layer_words("train_shallow", 0.04, 30).startswith("train layer 0, freeze layers 1–29")  # b = floor(1.7)
    assert layer_words("full", None, 30) == "train all 30 layers (full)"
    assert trial_description("train_deep", 0.5, 30, 3e-4, 2) == \
        "Sweep trial: freeze layers 0–14, train 15–29 (train_deep r = 0.5); lr 0.0003; seed 2."


def test_one_seed_names_the_leader_as_no_decision_with_the_command_that_decides():
    trials = [_trial(n) for n in ROWS]
    lines = compact_verdict(_summary(trials))
    # the leader, found here by the lowest mean held-out loss over the blocks
    leader = min(ROWS, key=lambda n: np.mean(BLOCKS + ROWS[n][2] + NOISE[n]))
    assert leader == "train_shallow-r0.33"
    d = (BLOCKS + ROWS[leader][2] + NOISE[leader]) - (BLOCKS + ROWS["full"][2] + NOISE["full"])
    ci = st.ttest_rel(BLOCKS + ROWS[leader][2] + NOISE[leader], BLOCKS + ROWS["full"][2] + NOISE["full"]) \
        .confidence_interval(0.95)
    half = f"{(ci.high - ci.low) / 2:.3f}".lstrip("0")
    assert lines[0] == (f"Leader on heldout_loss (point estimate, not a decision): train layers 0–9, freeze 10–29 "
                        f"(train_shallow r = 0.33); Δ vs full: held-out loss {np.mean(d):+.3f}±{half} nats.")
    assert "sweep.seeds=[0,1,2]" in lines[1] and "checkpoints" in lines[1]
    text = "\n".join(lines)
    assert "Recommended" not in text and "strategy claim" not in text and "Best" not in text
    # the trace's r = 0.3: b = floor(9.5) = 9, untrained here
    assert lines[2] == ("The trace's recommended split r = 0.3 (train layers 0–8, freeze 9–29) was not trained in "
                        "this sweep: raycpt sweep CONFIG --splits 0.3")
    assert "Largest S(b)" not in text  # one split with an S(b): nothing to single out
    assert not any("recommended split" in ln for ln in compact_verdict(_summary(trials, recommended=0.33)))


def test_horizon_line_stays_first():
    s = _summary([_trial(n) for n in ROWS])
    s["horizon"] = "Horizon: not measured whether this 8-step ranking holds in a longer run."
    lines = compact_verdict(s)
    assert lines[0] == s["horizon"] and lines[1].startswith("Leader on heldout_loss")


def test_three_seeds_make_it_a_strategy_claim_with_the_command_that_trains_it():
    trials = [_trial(n, seed, shift=0.002 * (seed - 1) + 0.001 * k * seed)
              for seed in (0, 1, 2) for k, n in enumerate(ROWS)]
    s = _summary(trials)
    from raycpt.report.sweep.seeds import strategy_claims_allowed

    assert strategy_claims_allowed(s) and s["verdict"]["best"]["best"] == "train_shallow-r0.33"
    lines = compact_verdict(s)
    mean = {n: np.mean([t["heldout_loss"] for t in trials if t["group"] == n]) for n in ROWS}  # over the 3 runs
    assert lines[0].startswith("Recommended on heldout_loss: train layers 0–9, freeze 10–29 (train_shallow r = "
                               f"0.33); Δ vs full: held-out loss {mean['train_shallow-r0.33'] - mean['full']:+.3f}±")
    assert "A strategy claim" in lines[0] and "3 runs per row" in lines[0] and "not a decision" not in lines[0]
    assert lines[1] == ("Next: train it at scale: raycpt train CONFIG plan.name=train_shallow plan.split=0.33 (a "
                        "larger train.max_steps).")


def test_three_seeds_without_a_clear_best_is_not_a_decision():
    spread = {0: -0.06, 1: 0.0, 2: 0.06}  # run-to-run noise far larger than the rows' differences
    trials = [_trial(n, seed, shift=spread[seed] * (1 if k % 2 else -1) - ROWS[n][2])
              for seed in (0, 1, 2) for k, n in enumerate(ROWS)]
    s = _summary(trials)
    lines = compact_verdict(s)
    assert s["verdict"]["best"]["best"] is None
    assert "(point estimate, not a decision)" in lines[0] and "no row beats every other" in lines[0]
    assert lines[1] == "To decide: more runs per row, raycpt sweep CONFIG sweep.seeds=[0,1,2,3,4,5]."


def test_parent_run_has_its_description_and_a_replay_gives_it_too(tmp_path):
    from mlflow.tracking import MlflowClient

    from fake_run import sqlite_parent
    from raycpt.jobs.sweep import TrialSpec, log_summary
    from raycpt.runs.records import RECORDS, project

    cfg, client, exp, parent, run_at = sqlite_parent(tmp_path)
    s = _summary([_trial(n) for n in ROWS])
    run = run_at()
    log_summary(run, [], None, s)
    note = client.get_run(parent).data.tags["mlflow.note.content"]
    assert note.startswith("### Which decoder layers to train?")
    assert "**Leader (point estimate, not a decision):** train layers 0–9, freeze 10–29 (train_shallow r = 0.33)" \
        in note
    for line in compact_verdict(s):
        assert f"- {line}" in note
    assert f"Rerun: `raycpt sweep {tmp_path / 'run' / 'config.yaml'}`" in note
    child = client.create_run(exp, run_name="t", tags={"mlflow.parentRunId": parent}).info.run_id
    TrialSpec("train_shallow-r0.33", "train_shallow", 0.33, 10).log_params(run_at("trial", child), 0, 3e-4, 30)
    assert client.get_run(child).data.tags["mlflow.note.content"] == \
        "Sweep trial: train layers 0–9, freeze 10–29 (train_shallow r = 0.33); lr 0.0003; seed 0."
    # the folder is the record: projecting its records into another store's run gives the same description
    other = MlflowClient(f"sqlite:///{tmp_path / 'other.db'}")
    again = other.create_run(other.create_experiment("o", artifact_location=(tmp_path / "o").as_uri())).info.run_id
    for ln in (tmp_path / "run" / RECORDS).read_text().splitlines():
        project(other, again, json.loads(ln), tmp_path / "run")
    assert other.get_run(again).data.tags["mlflow.note.content"] == note


def test_a_commands_run_names_its_source(tmp_path):
    from mlflow.tracking import MlflowClient

    from raycpt.config import ExperimentConfig
    from raycpt.runs.run import command_run, git_commit

    cfg = ExperimentConfig()
    cfg.tracking.run_root = str(tmp_path / "runs")
    with command_run(cfg, "sweep") as run:
        run_id = run.run_id
    tags = MlflowClient(cfg.tracking.uri).get_run(run_id).data.tags
    assert tags["mlflow.source.name"] == "raycpt sweep" and tags["mlflow.source.type"] == "LOCAL"
    commit = git_commit()
    assert tags.get("mlflow.source.git.commit") == commit if commit else "mlflow.source.git.commit" not in tags


def test_config_params_are_grouped_by_section():
    import dataclasses

    from raycpt.config import ExperimentConfig
    from raycpt.runs.run import config_params

    cfg = ExperimentConfig()
    sections = {f.name for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))}
    keys = config_params(cfg)
    assert all(k.split(".")[0] in sections for k in keys if "." in k)
    assert {k for k in keys if "." not in k} <= {f.name for f in dataclasses.fields(cfg)} - sections  # e.g. name


QUESTIONS = {"wordnet_mc": [{"id": f"wn-{i}", "question": f"gloss {i}?", "category": "Other",
                             "logit": {"correct": i % 2 == 0}} for i in range(3)],
             "mmlu": [{"id": f"m-{i}", "question": f"q {i}?", "category": "STEM", "logit": {"correct": True}}
                      for i in range(2)]}


def _sweep_folder(tmp_path, cfg):
    """A finished sweep's folder as :func:`raycpt.jobs.sweep.execute` leaves it: the slices' blocks files, each
    trial's eval file and final model folder (two seeds a row: seed 1 a little worse), the corpus's packed store."""
    from raycpt.data.store import store_key, store_root, tokenizer_hash

    run = tmp_path / "run"
    shared = {}
    for key, blocks in (("heldout_path", [[1, 2, 3, 4]] * 3), ("validation_path", [[5, 6, 7, 8]] * 2),
                        ("general_path", [[9, 10, 11, 12], [13, 14, 15, 16]])):
        shared[key] = str(run / f"{key.split('_')[0]}_blocks.json")
        (run / f"{key.split('_')[0]}_blocks.json").write_text(json.dumps(blocks))
    trials = []
    for n in ROWS:
        for seed, shift in ((0, 0.0), (1, 0.01)):
            t = _trial(n, seed, shift)
            folder = tmp_path / "trials" / t["name"]
            (folder / "eval").mkdir(parents=True)
            (folder / "eval" / "eval_result.json").write_text(json.dumps({"questions": QUESTIONS}))
            (folder / "final_model").mkdir()
            trials.append({**t, "eval_file": str(folder / "eval" / "eval_result.json"),
                           "final_model_dir": str(folder / "final_model"), "general_loss": 3.0 + shift})
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text('{"model": "tiny"}')
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b c\n")
    cfg.data.corpus = [str(corpus)]
    store = store_root(cfg.data, Path(cfg.tracking.run_root)) / store_key(cfg.data, tokenizer_hash(str(model)))
    store.mkdir(parents=True)
    files = [{"source": str(corpus), "path": str(corpus), "size": 6, "sha256": "ab" * 32}]
    (store / "manifest.json").write_text(json.dumps({"format": 1, "num_blocks": 12, "seq_len": 16, "num_documents": 5,
                                                     "sources": [str(corpus)], "fingerprints": files}))
    return shared, trials, str(model), store


def test_parent_run_carries_its_inputs_and_the_leaders_model_and_a_sync_replays_them(tmp_path):
    import hashlib

    import mlflow
    from mlflow.tracking import MlflowClient

    from fake_run import sqlite_parent
    from raycpt.config import ExperimentConfig, save_config
    from raycpt.jobs.sweep import SweepPlan, TrialSpec, sweep_inputs
    from raycpt.jobs.sync import sync_run
    from raycpt.runs.folder import write_state

    tcfg, client, exp, parent, run_at = sqlite_parent(tmp_path)
    cfg = ExperimentConfig()
    cfg.tracking, cfg.eval.limit = tcfg, {"wordnet_mc": 3}
    (tmp_path / "run").mkdir()
    shared, trials, model_path, store = _sweep_folder(tmp_path, cfg)
    specs = [TrialSpec(n, ROWS[n][0], ROWS[n][1], None, seed=s) for n in ROWS for s in (0, 1)]
    s = _summary(trials)
    run_at().log_inputs(sweep_inputs(Path(tcfg.run_root), SweepPlan(cfg, model_path, 30, specs), shared, trials, s))

    def inputs(c, run_id):
        return {d.dataset.name: (d.dataset.digest, {t.key: t.value for t in d.tags}["mlflow.data.context"],
                                 json.loads(d.dataset.source)["uri"], json.loads(d.dataset.profile))
                for d in c.get_run(run_id).inputs.dataset_inputs}

    def sha16(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()[:16]

    # the digests worked out here: the store's identity (its key and its files' path, size, sha256), each blocks
    # file's bytes, each benchmark's sorted [id, question] pairs
    corpus_id = sha16(json.dumps([store.name, [[str(tmp_path / "corpus.txt"), 6, "ab" * 32]]]).encode())
    blocks = {k: (tmp_path / "run" / f"{k.split('_')[0]}_blocks.json") for k in shared}
    want = {"training_corpus": (corpus_id, "training", str(store), 12, 12 * 16),
            "heldout_slice": (sha16(blocks["heldout_path"].read_bytes()), "evaluation", str(blocks["heldout_path"]),
                              3, 12),
            "validation_slice": (sha16(blocks["validation_path"].read_bytes()), "validation",
                                 str(blocks["validation_path"]), 2, 8),
            "general_probe": (sha16(blocks["general_path"].read_bytes()), "evaluation", str(blocks["general_path"]),
                              2, 8)}
    got = inputs(client, parent)
    assert sorted(got) == sorted([*want, "wordnet_mc", "mmlu"])
    for name, (digest, context, source, rows, tokens) in want.items():
        assert got[name][:3] == (digest, context, source) and got[name][3]["rows"] == rows, name
        assert got[name][3]["tokens"] == tokens, name
    first_eval = str(tmp_path / "trials" / "full-s0" / "eval" / "eval_result.json")  # the first trial by name
    for task, limit in (("wordnet_mc", 3), ("mmlu", "all")):
        pairs = sorted([q["id"], q["question"]] for q in QUESTIONS[task])
        assert got[task] == (sha16(json.dumps(pairs).encode()), "evaluation", first_eval,
                             {"questions": len(QUESTIONS[task]), "limit": limit})
    # the leader (the lowest mean held-out loss: train_shallow r = 0.33, as above) linked from one seed's folder: the
    # held-out loss never chooses it (a test); these trials have no validation loss, so the lowest seed
    (out,) = client.get_run(parent).outputs.model_outputs
    m = client.get_logged_model(out.model_id)
    (best,) = [t for t in trials if t["group"] == "train_shallow-r0.33" and t["seed"] == 0]
    assert (m.name, m.source_run_id, m.tags["raycpt.model.location"]) == \
        ("train_shallow-r0_33", parent, best["final_model_dir"])
    assert m.tags["mlflow.model.isExternal"] == "true" and m.status.name == "READY"
    assert m.params == {"plan": "train_shallow", "split": "0.33", "layers_trained": "0-9", "seed": "0",
                        "lr": str(cfg.train.lr), "trial": "train_shallow-r0.33-s0"}
    (loss,) = [x for x in m.metrics if x.key == "heldout_loss"]
    assert loss.value == pytest.approx(best["heldout_loss"])
    assert (loss.dataset_name, loss.dataset_digest) == ("heldout_slice", want["heldout_slice"][0])
    assert client.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"
    mlflow.set_tracking_uri(tcfg.uri)  # a user registers it
    version = mlflow.register_model(f"models:/{m.model_id}", "layer-plan")
    registered = client.get_model_version("layer-plan", version.version)
    assert (registered.source, registered.run_id) == (f"models:/{m.model_id}", parent)
    # logged again (a resumed sweep's end): nothing twice
    run_at().log_inputs(sweep_inputs(Path(tcfg.run_root), SweepPlan(cfg, model_path, 30, specs), shared, trials, s))
    assert len(client.get_run(parent).inputs.dataset_inputs) == 6
    assert len(client.get_run(parent).outputs.model_outputs) == 1
    # `raycpt runs sync` into a second store replays the same inputs and model, once
    save_config(cfg, tmp_path / "run" / "config.yaml")
    write_state(tmp_path / "run", command="sweep", status="finished", mlflow_run_id=parent, run_name="parent")
    other_uri = f"sqlite:///{tmp_path / 'other.db'}"
    sync_run(None, [str(tmp_path / "run")], other_uri)
    other = MlflowClient(other_uri)
    (again,) = other.search_runs([e.experiment_id for e in other.search_experiments()])
    assert inputs(other, again.info.run_id) == got
    (out2,) = other.get_run(again.info.run_id).outputs.model_outputs
    m2 = other.get_logged_model(out2.model_id)
    assert (m2.name, m2.source_run_id, m2.tags["raycpt.model.location"], m2.params) == \
        (m.name, again.info.run_id, m.tags["raycpt.model.location"], m.params)
    assert other.get_experiment(again.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert ": 0 item(s) added" in sync_run(None, [str(tmp_path / "run")], other_uri)


def test_a_models_layers_and_name_by_hand_and_an_empty_slice_is_no_input(tmp_path):
    from raycpt.jobs.run_inputs import model_name, slice_datasets, trained_layers

    assert trained_layers("train_deep", 0.66, 30) == "20-29"  # b = floor(19.8 + 1/2) = 20
    assert trained_layers("train_shallow", 0.04, 30) == "0-0" and trained_layers("full", None, 28) == "0-27"
    assert trained_layers("lisa", None, 30) is None
    assert model_name("train_shallow-r0.33 (untuned)") == "train_shallow-r0_33_untuned"  # MLflow refuses . / : in it
    (tmp_path / "h.json").write_text("null")  # raycpt decide writes its slices whether or not it has them
    (tmp_path / "v.json").write_text("[]")
    assert slice_datasets({"heldout_path": str(tmp_path / "h.json"), "validation_path": str(tmp_path / "v.json"),
                           "general_path": None}) == []


def test_the_linked_seed_is_chosen_on_validation_never_on_the_held_out_test():
    from raycpt.jobs.run_inputs import row_model

    rec = {"row": "full", "claim": "strategy", "words": "train all 30 layers (full)"}
    runs = [{"name": f"full-s{s}", "group": "full", "strategy": "full", "split": None, "seed": s, "lr": 3e-5,
             "final_model_dir": f"/m/s{s}", "validation_loss": v, "heldout_loss": h}
            for s, v, h in ((0, 4.2, 3.9), (1, 4.1, 4.3), (2, 4.3, 3.8))]
    # seed 1 has the lowest validation loss (4.1) and the highest held-out loss: it is the one linked
    assert row_model(rec, runs, 30, lambda t: None)["model"]["location"] == "/m/s1"
    # one run without a validation loss: the lowest seed, whatever the held-out losses say
    runs[0]["validation_loss"] = None
    assert row_model(rec, runs, 30, lambda t: None)["model"]["location"] == "/m/s0"


def test_a_training_run_logs_the_sections_training_reads_not_other_commands():
    """Issue 48: a trial's params are the sections its training reads (so MLflow's compare view does not open on
    constants such as compare.alpha); a command's run keeps every section."""
    import dataclasses

    from raycpt.config import ExperimentConfig
    from raycpt.runs.run import TRAINING_SECTIONS, config_params

    cfg = ExperimentConfig()
    cfg.train.lr = 7e-4
    every = config_params(cfg)
    trial = config_params(cfg, TRAINING_SECTIONS)
    assert trial["train.lr"] == "0.0007" and trial["name"] == "default"
    assert not any(k.startswith(("compare.", "contribution.", "report.", "sweep.", "tracking.")) for k in trial)
    # every key of the training sections, counted here from the dataclasses themselves
    expected = {f"{s}.{f.name}" for s in ("train", "plan") for f in dataclasses.fields(getattr(cfg, s))
                if not dataclasses.is_dataclass(v := getattr(getattr(cfg, s), f.name)) and not isinstance(v, dict)}
    assert expected <= set(trial) and set(trial) < set(every) and "compare.alpha" in every


def test_a_nested_command_logs_its_own_section_and_what_it_reads(tmp_path):
    """A sweep's trace (a command run inside the sweep's) logs trace.*, model.*, data.* and the top-level values; the
    sweep's own run keeps the whole config: the parent's children carry no compare.* constants."""
    from mlflow.tracking import MlflowClient

    from raycpt.config import ExperimentConfig
    from raycpt.runs.run import command_run

    cfg = ExperimentConfig()
    cfg.tracking.run_root = str(tmp_path / "runs")
    with command_run(cfg, "sweep") as parent:
        with command_run(cfg, "trace", run_dir=parent.run_dir / "trace", parent=parent) as child:
            child_id = child.run_id
        parent_id = parent.run_id
    client = MlflowClient(parent.location.uri)
    mine, whole = client.get_run(child_id).data.params, client.get_run(parent_id).data.params
    assert {k.split(".")[0] for k in mine if "." in k} == {"trace", "model", "data"}
    assert "compare.alpha" in whole and any(k.startswith("trace.") for k in whole)
