"""Every shipped lm-eval task YAML loads; category maps cover the benchmarks exactly. No hub access:
hub tasks are checked as configs only (TaskConfig), the offline ones are built with their data."""

from __future__ import annotations

from pathlib import Path

import pytest

from raycpt import evaluate as E
from raycpt.evaluate.lm_tasks import TASKS_DIR
from raycpt.tasks import CATEGORIES, CEVAL_CATEGORIES, CMMLU_CATEGORIES, CMMLU_CHINA_SPECIFIC, subject_category

YAMLS = sorted(p for p in TASKS_DIR.rglob("*.yaml"))


def test_yaml_count():
    # wordnet_mc x3 (logit, generate, cloze), ceval_gen 52 + group, cmmlu_gen 67 + group, mmlu 3 x (57 + group)
    assert len(YAMLS) == 3 + 53 + 68 + 3 * 58


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_shipped_yaml_loads(path: Path):
    from lm_eval.api.task import TaskConfig
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(path, resolve_func=True)
    tm = E.task_manager()
    if "group" in cfg:
        assert cfg["group"] in tm.all_groups
        for sub in cfg["task"]:
            assert sub in tm.all_subtasks, sub
        return
    assert cfg["task"] in tm.all_subtasks
    conf = TaskConfig(**{k: v for k, v in cfg.items() if k not in ("group", "tag", "task_list")})
    if conf.output_type == "generate_until":
        assert conf.generation_kwargs == {"until": ["\n\n"], "max_gen_toks": 16, "do_sample": False}
        fn = conf.filter_list[0]["filter"][0]["function"]
        assert callable(fn) and fn.__name__ == "ChoiceFilter"
        assert [m["metric"] for m in conf.metric_list] == ["exact_match"]
    elif "cloze" in conf.task:
        assert conf.output_type == "multiple_choice" and conf.doc_to_choice == "{{[A, B, C, D]}}"
        assert conf.doc_to_text == "Question: {{question.strip()}}\nAnswer:"
    else:
        assert conf.output_type == "multiple_choice" and conf.doc_to_choice == ["A", "B", "C", "D"]
    assert conf.doc_to_text.endswith(("答案：\"", "答案：", "Answer:"))


def test_lm_eval_logit_groups_present():
    tm = E.task_manager()
    assert "ceval-valid" in tm.all_groups and "cmmlu" in tm.all_groups
    assert "ceval_gen" in tm.all_groups and "cmmlu_gen" in tm.all_groups


def test_offline_tasks_build_with_data():
    tm = E.task_manager()
    loaded = tm.load(["wordnet_mc", "wordnet_mc_gen"])["tasks"]
    for name in ("wordnet_mc", "wordnet_mc_gen"):
        docs = list(loaded[name].validation_docs())
        assert len(docs) == 400 and {"question", "A", "B", "C", "D", "answer", "category"} <= set(docs[0])


def test_category_maps():
    ceval = {p.stem[len("ceval_gen_"):] for p in (TASKS_DIR / "ceval_gen").glob("ceval_gen_*.yaml")}
    cmmlu = {p.stem[len("cmmlu_gen_"):] for p in (TASKS_DIR / "cmmlu_gen").glob("cmmlu_gen_*.yaml")}
    assert set(CEVAL_CATEGORIES) == ceval and len(ceval) == 52
    assert set(CMMLU_CATEGORIES) == cmmlu and len(cmmlu) == 67
    assert set(CEVAL_CATEGORIES.values()) == set(CATEGORIES) == set(CMMLU_CATEGORIES.values())
    # C-Eval's official split: 20 STEM, 10 Social Science, 11 Humanities, 11 Other
    counts = {c: sum(v == c for v in CEVAL_CATEGORIES.values()) for c in CATEGORIES}
    assert counts == {"STEM": 20, "Social Science": 10, "Humanities": 11, "Other": 11}
    assert len(CMMLU_CHINA_SPECIFIC) == 15 and CMMLU_CHINA_SPECIFIC <= set(CMMLU_CATEGORIES)
    # spot checks against the upstream tables
    assert CEVAL_CATEGORIES["clinical_medicine"] == "Other" and CEVAL_CATEGORIES["logic"] == "Humanities"
    assert CMMLU_CATEGORIES["chinese_history"] == "Humanities"      # history (+ china specific, folded)
    assert CMMLU_CATEGORIES["ancient_chinese"] == "Social Science"  # linguistics
    assert CMMLU_CATEGORIES["computer_security"] == "Other"
    assert subject_category("ceval-valid_law") == "Humanities" == subject_category("ceval_gen_law")
    assert subject_category("cmmlu_arts") == "Humanities" == subject_category("cmmlu_gen_arts")
    assert subject_category("wordnet_mc") is None


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(), reason="needs Debian's wordnet-base (apt-get install -y wordnet-base; "
                    ".ci/run installs it): regenerates the shipped benchmark from /usr/share/wordnet")
@pytest.mark.skipif(not (E.WORDNET_MC_FILE.parent / "wordnet_glosses.jsonl.gz").is_file(),
                    reason="training corpus asset not present")
def test_wordnet_benchmark_regenerates_identically():
    """The shipped file is what the generator writes, and every question's definition is a record
    of the shipped training corpus (``word, ... (pos): definition; ...``)."""
    import gzip
    import json
    import runpy

    from raycpt.evaluate import WORDNET_MC_FILE

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_wordnet_benchmark.py"
    build = runpy.run_path(str(script))["build_questions"]
    rows = build()
    shipped = [json.loads(line) for line in WORDNET_MC_FILE.read_text(encoding="utf-8").splitlines()]
    assert rows == shipped
    corpus = gzip.open(E.WORDNET_MC_FILE.parent / "wordnet_glosses.jsonl.gz", "rt", encoding="utf-8").read()
    pos_name = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
    for q in shipped:
        definition = q["question"].split('"', 1)[1].rsplit('"', 1)[0]
        assert f"({pos_name[q['pos']]}): {definition}" in corpus, q["id"]
