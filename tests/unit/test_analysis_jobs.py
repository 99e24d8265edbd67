"""Job-level helpers of compare / contribution that need no Ray: settings, references, prompts."""

import json

import pytest

from raycpt.config import EvalConfig, ExperimentConfig, config_from_dict
from raycpt.errors import RaycptError


def cfg_with(contribution):
    """The config with a ``contribution`` section, built and validated as a YAML file's would be."""
    return config_from_dict({"contribution": contribution})


def test_scan_settings_layers_and_errors(tmp_path):
    from raycpt.jobs.contribution import scan_plan, scan_trials
    from raycpt.strategies import write_ranking

    assert scan_plan(cfg_with(None), 6)[0] == list(range(6))
    assert scan_plan(cfg_with({"layers": "every:5"}), 30)[0] == [0, 5, 10, 15, 20, 25]
    c = cfg_with({"layers": [4, 1, 4], "top_k": 3})
    assert scan_plan(c, 6)[0] == [1, 4] and c.contribution.top_k == 3
    assert [t.name for t in scan_trials(scan_plan(c, 6)[0])] == ["base", "full", "single-L01", "single-L04"]
    for bad, msg in (({"layers": [6]}, "not a layer of this 6-layer model"), ({"layers": "every:0"}, "every:K"),
                     ({"band": [0.6, 0.4]}, "0 <= lo < hi <= 1"), ({"top_k": 0}, "top_k"),
                     ({"topk": 3}, "unknown key")):
        with pytest.raises(RaycptError, match=msg):
            scan_plan(cfg_with(bad), 6)
    r = write_ranking(tmp_path / "r.json", "m", 30, {3: 1.0, 4: 0.5})
    with pytest.raises(RaycptError, match="is for a 30-layer model, this model has 6 layers"):
        scan_plan(cfg_with({"against": str(r)}), 6)


def test_scan_trial_config_plans():
    from raycpt.jobs.contribution import ScanTrial, scan_trial_config

    c = ExperimentConfig()
    assert scan_trial_config(c, ScanTrial("single-L07", "single", 7)).plan.name == "single"
    assert scan_trial_config(c, ScanTrial("single-L07", "single", 7)).plan.layer == 7
    assert scan_trial_config(c, ScanTrial("full", "full")).plan.name == "full"


def test_elite_control_settings_and_trial_configs(tmp_path):
    from raycpt.jobs.contribution import ScanTrial, elite_trials, scan_plan, scan_trial_config
    from raycpt.jobs.grid import Grid

    c = cfg_with({"elite_lr_control": True, "elite_k": 2, "elite_lr_scale": 3.0, "layers": [0, 1, 2, 3]})
    assert scan_plan(c, 6)[0] == [0, 1, 2, 3]  # 2 x 2 = 4 scanned layers: enough
    with pytest.raises(RaycptError, match=r"needs 2 x 3 = 6 scanned layers; the scan has 4"):
        scan_plan(config_with_contribution(c, elite_k=3), 6)
    assert scan_plan(cfg_with({"elite_k": 3, "layers": [0, 1, 2, 3]}), 6)[0] == [0, 1, 2, 3]  # control off: no check
    for bad, msg in (({"elite_lr_scale": 0}, "elite_lr_scale=0"), ({"elite_lr_scale": -1.0}, "a positive number"),
                     ({"elite_k": 0}, "elite_k=0"), ({"sample_temperature": -0.5}, "sample_temperature=-0.5"),
                     ({"sample_seed": -1}, "sample_seed=-1")):
        with pytest.raises(RaycptError, match=msg):
            cfg_with(bad)
    d = cfg_with(None).contribution
    assert (d.sampled_vote, d.sample_temperature, d.elite_lr_control) == (True, 1.0, False)
    top, bottom = elite_trials()
    assert (top.name, top.kind, bottom.name, bottom.kind) == ("elite-top", "elite_top", "elite-bottom", "elite_bottom")
    for spec, pick in ((top, "top"), (bottom, "bottom")):
        p = scan_trial_config(c, spec, str(tmp_path / "ranking.json")).plan
        assert (p.name, p.k, p.elite_pick, p.elite_train_rest, p.elite_lr_scale) == ("elite", 2, pick, True, 3.0)
        assert p.ranking_file == str(tmp_path / "ranking.json")
    assert scan_trial_config(c, ScanTrial("full", "full")).plan.name == "full"
    assert Grid("x", []).tune_name == "tune"  # existing runs resume from <run>/tune


def config_with_contribution(cfg, **kw):
    from raycpt.config import config_with

    return config_with(cfg, {f"contribution.{k}": v for k, v in kw.items()})


def test_flat_metrics_names_the_nested_numbers():
    from raycpt.jobs.contribution import flat_metrics

    d = {"k": 5, "vote_acc": 60.0, "ok": True, "layers": [1, 2], "note": "x", "none": None,
         "paired": {"top-full": {"delta": 2.5, "p": 0.25}}}
    assert flat_metrics(d, "elite") == {"elite.k": 5.0, "elite.vote_acc": 60.0, "elite.paired.top_full.delta": 2.5,
                                        "elite.paired.top_full.p": 0.25}


def test_control_lines_show_both_controls():
    from raycpt.report.contribution import control_lines

    pair = {"delta": 25.0, "lo": -5.0, "hi": 50.0, "p": 0.5}
    a = {"vote": {"vote_acc": 75.0}, "score_key": "acc",
         "sampled_vote": {"k": 3, "temperature": 1.0, "seed": 0, "vote_acc": 50.0, "sample_acc": 45.0,
                          "greedy_acc": 50.0, "num_questions": 4, "paired": pair},
         "elite_lr_control": {"k": 2, "lr_scale": 2.0, "full_score": 50.0, "top_score": 75.0, "bottom_score": 25.0,
                              "top_minus_bottom": 50.0, "top_layers": [1, 2], "bottom_layers": [0, 3],
                              "accuracy": {"num_questions": 4, "full": 50.0, "top": 75.0, "bottom": 25.0},
                              "paired": {"top-bottom": pair}}}
    text = "\n".join(control_lines(a))
    assert "top-3 vote 75.00 vs full's sampled vote 50.00" in text
    assert "+25.00 points [-5.00, +50.00], exact McNemar p = 0.5" in text
    assert "top (layers [1, 2]) 75, bottom (layers [0, 3]) 25; top - bottom +50" in text
    assert "- top-bottom: +25.00 points" in text
    assert "not computed (why)" in "\n".join(control_lines({"sampled_vote": {"unavailable": "why"}}))
    assert control_lines({}) == []


def test_primary_score_picks_overall_of_first_task_and_mode():
    from raycpt.jobs.compare import primary_score

    cells = {"wordnet_mc/stem/logit": 10.0, "wordnet_mc/average/logit": 20.0, "wordnet_mc/overall/logit": 30.0,
             "wordnet_mc/overall/generate": 40.0}
    assert primary_score(cells, EvalConfig(modes=["logit", "generate"])) == ("wordnet_mc/overall/logit", 30.0)
    assert primary_score(cells, EvalConfig(modes=["generate"])) == ("wordnet_mc/overall/generate", 40.0)


def test_find_model_in_run_and_prompts(tmp_path):
    from tiny import save_tiny

    from raycpt.jobs.compare import find_model_in_run, load_prompt_texts

    run = tmp_path / "train-x"
    save_tiny(run / "final_model")
    (run / "train_result.json").write_text(json.dumps({"final_model_dir": str(run / "final_model")}))
    assert find_model_in_run(run) == run / "final_model"
    assert find_model_in_run(tmp_path / "nothing") is None
    p = tmp_path / "p.jsonl"
    p.write_text('{"text": "one two"}\n{"s1": "a->b; ", "s2": "c->"}\n')
    assert load_prompt_texts(str(p), 10) == ["one two", "a->b; c->"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    with pytest.raises(RaycptError, match="line 1 has none of the fields"):
        load_prompt_texts(str(bad), 10)
    with pytest.raises(RaycptError, match="file not found"):
        load_prompt_texts(str(tmp_path / "missing.jsonl"), 10)
    texts = load_prompt_texts(None, 12)
    assert len(texts) == 12 and len(set(texts)) == 12
    # the default is the shipped glosses asset (no Debian WordNet): 3 of each part of speech, in turn
    import gzip

    from raycpt.diagnostics.prompts import GLOSSES_FILE

    with gzip.open(GLOSSES_FILE, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    by_pos = {pos: [d for d in docs if d.split(":", 1)[0].endswith(f"({pos})")][:3]
              for pos in ("noun", "verb", "adjective", "adverb")}
    assert texts == [by_pos[pos][i] for i in range(3) for pos in ("noun", "verb", "adjective", "adverb")]
    assert load_prompt_texts("builtin:wordnet-glosses", 12) == texts


def test_trial_score_gold_prob_from_saved_questions(tmp_path):
    import math

    from raycpt.jobs.contribution import gold_prob_of, scan_plan, trial_score

    qs = [{"gold": "B", "logit": {"logprobs": [math.log(0.2), math.log(0.6), math.log(0.1), math.log(0.1)]}},
          {"gold": "A", "logit": {"logprobs": [0.0, 0.0, 0.0, 0.0]}}]
    assert gold_prob_of(qs) == pytest.approx(100 * (0.6 + 0.25) / 2)
    d = tmp_path / "trials" / "full" / "eval"
    d.mkdir(parents=True)
    (d / "eval-full_questions.json").write_text(json.dumps([{"questions": {"wordnet_mc": qs}}]))
    t = {"name": "full", "score": 31.25}
    assert trial_score(t, "accuracy", tmp_path, "wordnet_mc") == 31.25
    assert trial_score(t, "gold_prob", tmp_path, "wordnet_mc") == pytest.approx(42.5)
    with pytest.raises(RaycptError, match="one of accuracy, gold_prob"):
        scan_plan(cfg_with({"score": "loss"}), 4)
    c = config_from_dict({"contribution": {"score": "gold_prob"}, "eval": {"modes": ["generate"]}})
    with pytest.raises(RaycptError, match="needs the logit mode"):
        scan_plan(c, 4)


def test_heldout_blocks_and_lm_loss(tiny_dir, tmp_path):
    import torch

    from tiny import tiny_model

    from raycpt.config import DataConfig
    from raycpt.evaluate.heldout import lm_loss
    from raycpt.jobs.grid import heldout_blocks

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {i} " * 3}) + "\n" for i in range(10)))
    cfg = ExperimentConfig(data=DataConfig(corpus=[str(corpus)], seq_len=16, max_documents=8))
    blocks = heldout_blocks(cfg, str(tiny_dir), 5, "contribution.score=heldout_loss",
                            "contribution.heldout_docs")  # only documents 8 and 9 exist after the first 8
    text = "".join(f"document number {i} " * 3 + "</s>" for i in (8, 9))
    assert len(blocks) == (len(text) - 2 * len("</s>") + 2) // 16 and all(len(b) == 16 for b in blocks)
    model = tiny_model("llama", 2)
    eos = 2  # "</s>"
    # per block: each piece of a document between EOS tokens is its own forward (transformers' labels path), its
    # tokens after the first the targets; the block's loss is their mean
    sums, counts = [], []
    with torch.no_grad():
        for b in blocks:
            cuts = [-1] + [i for i, t in enumerate(b) if t == eos] + [len(b)]
            pieces = [b[x + 1:y] for x, y in zip(cuts, cuts[1:]) if y - x - 1 >= 2]
            sums.append(sum(float(model(input_ids=torch.tensor([p]), labels=torch.tensor([p])).loss) * (len(p) - 1)
                            for p in pieces))
            counts.append(sum(len(p) - 1 for p in pieces))
    assert lm_loss(model, blocks, eos, batch_size=1) == pytest.approx(sum(sums) / sum(counts), rel=1e-5)
    from raycpt.evaluate.heldout import lm_block_losses

    assert lm_block_losses(model, blocks, eos, batch_size=2) == pytest.approx(
        [x / n for x, n in zip(sums, counts)], rel=1e-5)
    cfg.data.max_documents = 10
    with pytest.raises(RaycptError, match="no documents after the first 10"):
        heldout_blocks(cfg, str(tiny_dir), 5, "contribution.score=heldout_loss", "contribution.heldout_docs")


def test_sweep_pairs_reads_finished_trials(tmp_path):
    from tiny import save_tiny

    from raycpt.config import save_config
    from raycpt.jobs.compare import _sweep_pairs

    sweep = tmp_path / "sweep-x"
    base = save_tiny(tmp_path / "base")
    save_config(_cfg_ref(str(base)), sweep / "config.yaml")
    m = save_tiny(sweep / "trials" / "full" / "train" / "final_model")
    (sweep / "trials" / "full" / "result.json").write_text(json.dumps({"final_model_dir": str(m)}))
    (sweep / "trials" / "train_shallow-r0.5").mkdir(parents=True)  # unfinished: skipped
    ref, pairs = _sweep_pairs(sweep, ExperimentConfig())
    assert ref == str(base) and pairs == [("full", str(m))]
    with pytest.raises(RaycptError, match="not a sweep run folder"):
        _sweep_pairs(tmp_path, ExperimentConfig())


def _cfg_ref(ref):
    from raycpt.config import load_config

    return load_config(None, [f"model.ref={ref}"])
