"""An offline multiple-choice benchmark is one YAML: written into a temporary folder (with its question
file), it evaluates by file name and, registered through ``$RAYCPT_BENCHMARKS``, by its name - with no
``.py`` file anywhere in that folder and no change to raycpt. A bad benchmark YAML is one line."""

import json
from pathlib import Path

import pytest

from raycpt import evaluate as E
from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from test_evaluate import independent_logit_scores

CATS = ["STEM", "Social Science", "Humanities", "Other"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    folder = tmp_path_factory.mktemp("benchmarks")
    words = ["sun", "sea", "sky", "elm", "oak", "fig", "ray", "ice"]
    rows = [{"id": f"f{i:02d}", "question": f"Which word is {words[(i * 5) % 8]}?",
             **dict(zip("ABCD", [words[(i + k) % 8] for k in range(4)])), "answer": "ABCD"[(i * 3) % 4],
             "category": CATS[i % 4]} for i in range(8)]
    (folder / "facts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "tiny_facts.yaml").write_text("# a benchmark in one file\nname: tiny_facts\ndata: facts.jsonl\n")
    return folder, rows


@pytest.fixture(scope="module")
def tiny():
    from tiny import prompt_sensitive_llama, tiny_tokenizer

    return prompt_sensitive_llama(seed=1), tiny_tokenizer()


def test_a_benchmark_yaml_evaluates_with_no_python(bench, tiny, monkeypatch):
    folder, rows = bench
    model, tok = tiny
    assert sorted(p.suffix for p in folder.iterdir()) == [".jsonl", ".yaml"]  # no .py: the YAML is the benchmark
    res = E.evaluate_model(model, EvalConfig(tasks=[str(folder / "tiny_facts.yaml")], modes=["logit"], batch_size=4),
                           tokenizer=tok)
    preds, _ = independent_logit_scores(model, tok, rows)
    qs = {q["id"]: q for q in res.questions["tiny_facts"]}
    assert [qs[r["id"]]["logit"]["prediction"] for r in rows] == preds
    overall = 100.0 * sum(p == r["answer"] for p, r in zip(preds, rows)) / len(rows)
    assert res.scores["tiny_facts"]["logit"]["overall"] == pytest.approx(overall)

    monkeypatch.setenv("RAYCPT_BENCHMARKS", str(folder))  # registered: eval.tasks names it
    assert E.resolve_task("tiny_facts").path == str((folder / "facts.jsonl").resolve())
    again = E.evaluate_model(model, EvalConfig(tasks=["tiny_facts"], modes=["logit"], batch_size=4), tokenizer=tok)
    assert again.scores["tiny_facts"]["logit"] == res.scores["tiny_facts"]["logit"]


def test_the_shipped_benchmarks_are_yamls():
    assert list(E.OFFLINE_TASKS) == ["wordnet_mc", "mmlu"]
    assert E.OFFLINE_TASKS["mmlu"].data_ref == E.MMLU_REF and E.OFFLINE_TASKS["mmlu"].reader == "mmlu"


@pytest.mark.parametrize("text, needle", [
    ("name: x\n", "at least data:"),
    ("data: q.jsonl\nreader: nope\n", "unknown reader 'nope'"),
    ("data: q.jsonl\nprompt: hi\n", "unknown key 'prompt'"),
    ("data: missing.jsonl\n", "question file not found"),
])
def test_a_bad_benchmark_yaml_is_one_line(tmp_path, text, needle):
    p = tmp_path / "b.yaml"
    p.write_text(text)
    with pytest.raises(RaycptError) as e:
        E.resolve_task(str(p))
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RaycptError, match="benchmark file not found"):
        E.resolve_task(str(Path(tmp_path) / "none.yaml"))
