"""Job-level helpers of compare / contribution that need no Ray: settings, references, prompts."""

import json

import pytest

from raycpt.config import ExperimentConfig, EvalConfig
from raycpt.errors import RaycptError


def cfg_with(contribution):
    return ExperimentConfig(contribution=contribution)


def test_scan_settings_layers_and_errors(tmp_path):
    from raycpt.jobs.contribution import scan_settings, trial_names
    from raycpt.strategies import write_ranking

    assert scan_settings(cfg_with(None), 6).layers == list(range(6))
    assert scan_settings(cfg_with({"layers": "every:5"}), 30).layers == [0, 5, 10, 15, 20, 25]
    s = scan_settings(cfg_with({"layers": [4, 1, 4], "top_k": 3}), 6)
    assert s.layers == [1, 4] and s.top_k == 3
    assert [t["name"] for t in trial_names(s)] == ["base", "full", "single-L01", "single-L04"]
    for bad, msg in (({"layers": [6]}, "not a layer of this 6-layer model"), ({"layers": "every:0"}, "every:K"),
                     ({"band": [0.6, 0.4]}, "0 <= lo < hi <= 1"), ({"top_k": 0}, "top_k"),
                     ({"topk": 3}, "unknown key")):
        with pytest.raises(RaycptError, match=msg):
            scan_settings(cfg_with(bad), 6)
    r = write_ranking(tmp_path / "r.json", "m", 30, {3: 1.0, 4: 0.5})
    with pytest.raises(RaycptError, match="is for a 30-layer model, this model has 6 layers"):
        scan_settings(cfg_with({"against": str(r)}), 6)


def test_scan_trial_config_plans():
    from raycpt.jobs.contribution import scan_trial_config

    c = ExperimentConfig()
    assert scan_trial_config(c, {"kind": "single", "layer": 7}).plan.name == "single"
    assert scan_trial_config(c, {"kind": "single", "layer": 7}).plan.layer == 7
    assert scan_trial_config(c, {"kind": "full", "layer": None}).plan.name == "full"


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
