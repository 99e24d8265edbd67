"""C-Eval and CMMLU from local files (``eval.data_dir``), on fixtures in the releases' published layouts.

``tests/data/ceval/val/<subject>_val.csv`` (header ``id,question,A,B,C,D,answer,explanation``) and
``tests/data/cmmlu/test/<subject>.csv`` (header ``,Question,A,B,C,D,Answer``): four subjects each, one
per category, Chinese text, quoted fields with commas and doubled quotes, an option reading ``NA``.

References, none of them raycpt's loader: the CSV text itself (Python's ``csv`` module on the file in
the test); the tiny model's own log-probabilities of each answer letter computed here by hand from
lm-eval's prompt (its subject YAML's description + ``question / A. .. D. / 答案：``, the letter after a
space); lm-eval's *built-in* ``ceval-valid_*`` / ``cmmlu_*`` configs (and raycpt's ``*_gen`` YAMLs)
pointed at the same files through lm-eval's standard ``dataset_path: csv`` + ``data_files``; the
official category of each subject typed from the C-Eval / CMMLU papers' tables.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from tiny import tiny_model, tiny_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
SUBJECTS = {"ceval": ["computer_network", "marxism", "law", "physician"],
            "cmmlu": ["anatomy", "arts", "economics", "agronomy"]}
# the papers' categories (C-Eval Table 7 / subject_mapping.json; CMMLU Table 6), typed here
CATEGORY = {"computer_network": "STEM", "marxism": "Social Science", "law": "Humanities", "physician": "Other",
            "anatomy": "STEM", "economics": "Social Science", "arts": "Humanities", "agronomy": "Other"}
LETTERS = ["A", "B", "C", "D"]


def _cfg(modes=("logit",), **kw) -> EvalConfig:
    return EvalConfig(tasks=["ceval", "cmmlu"], modes=list(modes), data_dir=str(DATA), batch_size=4, max_gen_toks=4,
                      subjects=SUBJECTS, **kw)


def _file(task, subject) -> Path:
    return DATA / "ceval" / "val" / f"{subject}_val.csv" if task == "ceval" else DATA / "cmmlu" / "test" / f"{subject}.csv"


def _rows(task, subject) -> list[dict]:
    with _file(task, subject).open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=5), tiny_tokenizer()


@pytest.fixture(scope="module")
def logit_result(model):
    from raycpt.evaluate import evaluate_model

    return evaluate_model(model[0], _cfg(), tokenizer=model[1])


# ------------------------------------------------------------------------------------------------ reading

def test_rows_read_as_text_with_the_hub_column_names():
    from raycpt.tasks.local import read_subject

    rows = read_subject("ceval", _file("ceval", "computer_network"))
    assert rows[1] == {"id": 1, "question": "TCP协议提供的是____服务。", "A": "无连接", "B": "面向连接, 可靠",
                       "C": "广播", "D": "NA", "answer": "B", "explanation": ""}  # NA stays text, id an int
    arts = read_subject("cmmlu", _file("cmmlu", "arts"))
    assert arts[1] == {"Question": '京剧中"生、旦、净、丑"的"净"指的是', "A": "男性角色", "B": "女性角色", "C": "花脸",
                       "D": "丑角", "Answer": "C"}
    assert [r["Question"] for r in arts] == [r["Question"] for r in _rows("cmmlu", "arts")]


def test_missing_subject_file_is_named(tmp_path):
    from raycpt.evaluate import resolve_eval_tasks

    copy = tmp_path / "bench"
    shutil.copytree(DATA, copy)
    (copy / "cmmlu" / "test" / "arts.csv").unlink()
    with pytest.raises(RaycptError, match=r"CMMLU copy .*cmmlu lacks .*cmmlu/test/arts\.csv; the published layout is "
                                          r"test/<subject>\.csv"):
        resolve_eval_tasks(EvalConfig(tasks=["cmmlu"], data_dir=str(copy), subjects={"cmmlu": SUBJECTS["cmmlu"]}))
    # the rule: without eval.subjects every subject of the benchmark is required (52 for C-Eval)
    with pytest.raises(RaycptError, match=r"lacks .*ceval/val/accountant_val\.csv \(48 of 52 required subject files "
                                          r"missing\)"):
        resolve_eval_tasks(EvalConfig(tasks=["ceval"], data_dir={"ceval": str(copy / "ceval")}))


@pytest.mark.parametrize("text, match", [
    ("id,question,A,B,C,D,answer\n0,q,a,b,c,d,A\n", r"law_val\.csv line 1 is 'id,question,A,B,C,D,answer'; the C-Eval"),
    ("id,question,A,B,C,D,answer,explanation\n0,q,a,b,c,d,E,\n", r"line 2 answer='E', allowed: A, B, C, D"),
    ("id,question,A,B,C,D,answer,explanation\n0,q,a,,c,d,A,\n", r"line 2 has an empty 'B'"),
    ("id,question,A,B,C,D,answer,explanation\nx,q,a,b,c,d,A,\n", r"line 2 id='x' is not an integer"),
])
def test_bad_subject_file_is_one_line(tmp_path, text, match):
    from raycpt.evaluate import resolve_eval_tasks

    (tmp_path / "ceval" / "val").mkdir(parents=True)
    (tmp_path / "ceval" / "val" / "law_val.csv").write_text(text, encoding="utf-8")
    with pytest.raises(RaycptError, match=match):
        resolve_eval_tasks(EvalConfig(tasks=["ceval"], data_dir=str(tmp_path), subjects={"ceval": ["law"]}))


def test_cli_missing_subject_file_exit_2(tmp_path, capsys):
    from raycpt.entry import main

    copy = tmp_path / "bench"
    shutil.copytree(DATA, copy)
    (copy / "ceval" / "val" / "law_val.csv").unlink()
    code = main(["eval", f"tracking.run_root={tmp_path / 'runs'}", f"eval.data_dir={copy}",
                 "eval.subjects={ceval: [law, marxism]}", "--tasks", "ceval"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and "law_val.csv" in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_data_dir_made_absolute_for_workers(tmp_path, monkeypatch):
    from raycpt.evaluate import resolve_eval_tasks

    shutil.copytree(DATA, tmp_path / "bench")
    monkeypatch.chdir(tmp_path)
    cfg = EvalConfig(tasks=["ceval"], data_dir="bench", subjects={"ceval": ["law"]})
    (spec,) = resolve_eval_tasks(cfg)
    assert cfg.data_dir == str(tmp_path / "bench") and spec.path == str(tmp_path / "bench" / "ceval")
    assert spec.kind == "local" and spec.logit == "ceval-valid" and spec.generate == "ceval_gen"


@pytest.mark.parametrize("overrides, match", [
    (["eval.data_dir={mmlu: /x}"], r"eval.data_dir.mmlu='/x': a task with a local layout: ceval, cmmlu"),
    (["eval.subjects={ceval: [law]}"], r"eval.subjects.ceval=\['law'\]: subjects of a local copy only"),
    (["eval.data_dir=/x", "eval.subjects={ceval: [lawyer]}"], r"eval.subjects.ceval: unknown subject 'lawyer'"),
])
def test_bad_data_dir_config(overrides, match):
    from raycpt.config import load_config

    with pytest.raises(RaycptError, match=match):
        load_config(None, overrides)


# ------------------------------------------------------------------------------------------------ logit mode

def _description(task, subject) -> str:
    import lm_eval

    name = f"ceval-valid_{subject}" if task == "ceval" else f"cmmlu_{subject}"
    return yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / task / f"{name}.yaml").read_text())["description"]


def _continuation_logprobs(model, tok, prompt: str, continuations: list[str]) -> list[float]:
    """log P(continuation | prompt) for each, by hand: BOS + prompt + continuation, summed over the
    continuation's tokens."""
    out = []
    with torch.no_grad():
        ctx = tok(prompt)["input_ids"]
        for cont in continuations:
            ids = tok(prompt + cont)["input_ids"]
            assert ids[:len(ctx)] == ctx
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids[:-1]])).logits[0].double(), -1)
            out.append(sum(float(logp[j - 1, ids[j]]) for j in range(len(ctx), len(ids))))
    return out


def _letter_logprobs(model, tok, task, subject, row) -> list[float]:
    """log P(" X" | prompt) for X in A-D, lm-eval's prompt: description, question, lettered options, 答案："""
    q = row["question" if task == "ceval" else "Question"].strip()
    prompt = _description(task, subject) + f"{q}\nA. {row['A']}\nB. {row['B']}\nC. {row['C']}\nD. {row['D']}\n答案："
    return _continuation_logprobs(model, tok, prompt, [" " + letter for letter in LETTERS])


def test_logit_predictions_equal_the_models_own_letter_logprobs(model, logit_result):
    m, tok = model
    for task in ("ceval", "cmmlu"):
        got = {q["id"]: q for q in logit_result.questions[task]}
        assert len(got) == sum(len(_rows(task, s)) for s in SUBJECTS[task])
        for subject in SUBJECTS[task]:
            for i, row in enumerate(_rows(task, subject)):
                q = got[f"{subject}-{i:04d}"]
                want = _letter_logprobs(m, tok, task, subject, row)
                assert q["logit"]["logprobs"] == pytest.approx(want, rel=1e-5, abs=1e-5)
                best = LETTERS[max(range(4), key=lambda k: (want[k], -k))]
                assert q["logit"]["prediction"] == best
                assert q["gold"] == row["answer" if task == "ceval" else "Answer"]
                assert q["category"] == CATEGORY[subject] and q["subject"] == subject


def test_category_scores_from_the_answers(logit_result):
    """Per category: percent correct; average = mean over categories; overall = over all questions."""
    for task in ("ceval", "cmmlu"):
        qs = logit_result.questions[task]
        per = {}
        for q in qs:
            per.setdefault(CATEGORY[q["subject"]], []).append(q["logit"]["prediction"] == q["gold"])
        sc = logit_result.scores[task]["logit"]
        keys = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}
        for cat, oks in per.items():
            assert sc[keys[cat]] == pytest.approx(100 * sum(oks) / len(oks))
        assert sc["average"] == pytest.approx(sum(100 * sum(v) / len(v) for v in per.values()) / 4)
        assert sc["overall"] == pytest.approx(100 * sum(sum(v) for v in per.values()) / len(qs))


def _builtin_reference(model, tok, mode, tmp_path) -> dict[str, dict]:
    """lm-eval's own subject configs (logit) / raycpt's *_gen YAMLs (generate), read by lm-eval's csv builder."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    from raycpt.evaluate.lm_tasks import TASKS_DIR

    lm_tasks = Path(lm_eval.__file__).parent / "tasks"
    confs = []
    for task, split in (("ceval", "val"), ("cmmlu", "test")):
        for s in SUBJECTS[task]:
            if mode == "logit":
                path = lm_tasks / task / (f"ceval-valid_{s}.yaml" if task == "ceval" else f"cmmlu_{s}.yaml")
            else:
                path = TASKS_DIR / f"{task}_gen" / f"{task}_gen_{s}.yaml"
            conf = load_yaml(path)
            conf.pop("fewshot_config", None)
            conf.update(dataset_path="csv", dataset_name=None, fewshot_split=None,
                        dataset_kwargs={"data_files": {split: str(_file(task, s))}, "keep_default_na": False})
            confs.append(conf)
    tm = TaskManager(include_defaults=False, include_path=[str(TASKS_DIR / "wordnet_mc")])
    tasks = list(tm.load(confs)["tasks"].values())
    if mode == "generate":
        for t in tasks:
            t.set_config(key="generation_kwargs", value={"max_gen_toks": 4, "do_sample": False}, update=True)
    out = lm_eval.simple_evaluate(model=HFLM(pretrained=model, tokenizer=tok, batch_size=4), tasks=tasks,
                                  log_samples=True, bootstrap_iters=0, task_manager=tm)
    return out["samples"]


def test_logit_mode_equals_lm_evals_builtin_configs_on_the_same_files(model, logit_result, tmp_path):
    samples = _builtin_reference(*model, "logit", tmp_path)
    ours = {q["id"]: q for t in ("ceval", "cmmlu") for q in logit_result.questions[t]}
    seen = 0
    for name, rows in samples.items():
        subject = name.split("_", 1)[1]
        for s in rows:
            lls = [float(r[0]) for r in s["filtered_resps"]]
            q = ours[f"{subject}-{int(s['doc_id']):04d}"]
            assert q["logit"]["logprobs"] == pytest.approx(lls, rel=1e-6, abs=1e-6)
            assert q["gold"] == LETTERS[int(s["target"])]
            seen += 1
    assert seen == len(ours) == 19


# ------------------------------------------------------------------------------------------------ generate mode

def test_generate_mode_equals_the_gen_yamls_read_by_lm_evals_csv_builder(model, tmp_path):
    from raycpt.evaluate import evaluate_model
    from raycpt.evaluate.answers import extract_choice

    res = evaluate_model(model[0], _cfg(modes=("generate",)), tokenizer=model[1])
    samples = _builtin_reference(*model, "generate", tmp_path)
    ours = {q["id"]: q for t in ("ceval", "cmmlu") for q in res.questions[t]}
    n = 0
    for name, rows in samples.items():
        subject = name.split("_gen_", 1)[1]
        for s in rows:
            q = ours[f"{subject}-{int(s['doc_id']):04d}"]
            assert q["generate"]["text"] == s["resps"][0][0]
            assert q["generate"]["extracted"] == extract_choice(s["resps"][0][0])
            assert q["category"] == CATEGORY[subject] and q["gold"] == s["target"]
            n += 1
    assert n == len(ours) == 19
    for task in ("ceval", "cmmlu"):  # scores from the answers (none extracted from a random tiny model: 0)
        oks = [q["generate"]["correct"] for q in res.questions[task]]
        assert res.scores[task]["generate"]["overall"] == pytest.approx(100 * sum(oks) / len(oks))


def test_generate_scores_of_a_model_that_always_answers_b(model):
    """A tiny model whose head always puts "B" first: greedy 1-token answers are "B", so a question is
    right exactly when its gold letter (read from the CSV here) is B; per-category scores follow."""
    from raycpt.evaluate import evaluate_model

    m, tok = tiny_model("llama", seed=5), model[1]
    head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(m.get_input_embeddings().weight)
        head.bias.zero_()
        head.bias[tok.convert_tokens_to_ids("B")] = 1e4
    m.lm_head = head
    res = evaluate_model(m, EvalConfig(tasks=["ceval", "cmmlu"], modes=["generate"], data_dir=str(DATA), batch_size=4,
                                       max_gen_toks=1, subjects=SUBJECTS), tokenizer=tok)
    keys = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}
    for task in ("ceval", "cmmlu"):
        got = {q["id"]: q for q in res.questions[task]}
        for subject in SUBJECTS[task]:
            golds = [r["answer" if task == "ceval" else "Answer"] for r in _rows(task, subject)]
            for i, gold in enumerate(golds):
                q = got[f"{subject}-{i:04d}"]
                assert q["generate"]["text"] == "B" and q["generate"]["extracted"] == "B"
                assert q["generate"]["correct"] == (gold == "B")
            want = 100 * sum(g == "B" for g in golds) / len(golds)
            assert res.scores[task]["generate"][keys[CATEGORY[subject]]] == pytest.approx(want)


# ------------------------------------------------------------------------------------------------ cloze mode

def _cloze_logprobs(model, tok, task, subject, row) -> list[float]:
    """log P(<option text> | description + question + "\\n答案："): each option's TEXT (not its letter) is the
    continuation, right after the colon (no delimiter)."""
    prompt = _description(task, subject) + row["question" if task == "ceval" else "Question"].strip() + "\n答案："
    return _continuation_logprobs(model, tok, prompt, [row[letter] for letter in LETTERS])


def test_cloze_mode_scores_each_option_text_by_hand(model):
    from raycpt.evaluate import evaluate_model

    m, tok = model
    res = evaluate_model(m, _cfg(modes=("cloze",)), tokenizer=tok)
    for task in ("ceval", "cmmlu"):
        got = {q["id"]: q for q in res.questions[task]}
        per: dict[str, list[bool]] = {}
        for subject in SUBJECTS[task]:
            for i, row in enumerate(_rows(task, subject)):
                q = got[f"{subject}-{i:04d}"]
                want = _cloze_logprobs(m, tok, task, subject, row)
                assert q["cloze"]["logprobs"] == pytest.approx(want, rel=1e-5, abs=1e-5)
                best = LETTERS[max(range(4), key=lambda k: (want[k], -k))]
                assert q["cloze"]["prediction"] == best and q["category"] == CATEGORY[subject]
                per.setdefault(CATEGORY[subject], []).append(best == row["answer" if task == "ceval" else "Answer"])
        keys = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}
        for cat, oks in per.items():
            assert res.scores[task]["cloze"][keys[cat]] == pytest.approx(100 * sum(oks) / len(oks))


def test_cloze_on_hub_ceval_is_refused_but_local_copies_take_it():
    from raycpt.evaluate import resolve_eval_tasks

    with pytest.raises(RaycptError, match="has no cloze variant"):
        resolve_eval_tasks(EvalConfig(tasks=["ceval"], modes=["cloze"]), check_hub=False)
    assert [s.kind for s in resolve_eval_tasks(_cfg(modes=("cloze",)))] == ["local", "local"]
