"""raycpt.evaluate: answer extraction, category scores, question files, and lm-eval runs on a tiny model
checked against an independent scorer written here in plain torch."""

from __future__ import annotations

import math
import json

import pytest
import torch

from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from raycpt import evaluate as E
from raycpt.report import eval as RE

# The prompt of the offline benchmark, written out here independently of the YAML.
DESCRIPTION = "The following are multiple choice questions about the meanings of English words. Choose the correct answer.\n\n"
CATS = ["STEM", "Social Science", "Humanities", "Other"]


def prompt_of(q: dict) -> str:
    return f"{DESCRIPTION}{q['question']}\nA. {q['A']}\nB. {q['B']}\nC. {q['C']}\nD. {q['D']}\nAnswer:"


# ---------------------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("text, expected", [
    ("B", "B"),
    (" B.", "B"),
    ("答案：C", "C"),
    ("答案是 D。", "D"),
    ("The answer is (D)", "D"),
    ("The answer is: A", "A"),
    ("Answer: C. dull", "C"),
    ("（Ｂ）", "B"),                      # full-width letters and brackets
    ("选B", "B"),
    (" A. plant\nB. thief", "A"),        # model echoes the options: the first standalone letter
    ("A or B", "A"),                     # two letters: the first standalone one counts
    ("B. dog\nAnswer: C", "C"),          # an explicit answer statement wins over a leading letter
    ("AB", None),                        # glued letters are no answer
    ("The", None),
    ("DNA is a molecule", None),
    ("a", None),                         # lower case never counts
    ("", None),
    (None, None),
    (" : : :", None),
])
def test_extract_choice(text, expected):
    assert E.extract_choice(text) == expected


# ---------------------------------------------------------------------------------------- category scores
def test_category_scores_by_hand():
    # STEM 2/3, Social Science 1/1, Humanities 0/2, Other 1/4  (10 questions, 4 right)
    items = ([("STEM", True), ("STEM", False), ("STEM", True), ("Social Science", True)]
             + [("Humanities", False)] * 2 + [("Other", True)] + [("Other", False)] * 3)
    scores, counts = E.category_scores(items)
    assert scores["stem"] == pytest.approx(200 / 3)
    assert scores["social_science"] == pytest.approx(100.0)
    assert scores["humanities"] == pytest.approx(0.0)
    assert scores["other"] == pytest.approx(25.0)
    # average = mean over the four categories (the paper's Average column), not over questions
    assert scores["average"] == pytest.approx((66.6666667 + 100 + 0 + 25) / 4)
    assert scores["overall"] == pytest.approx(40.0)
    assert counts == {"stem": 3, "social_science": 1, "humanities": 2, "other": 4, "total": 10}


def test_category_scores_skip_empty_categories_and_paper_row():
    scores, _ = E.category_scores([("STEM", True), ("Other", False)])
    assert set(scores) == {"stem", "other", "average", "overall"}
    assert scores["average"] == pytest.approx(50.0)
    # The paper's Table 1 first row: 26.60 / 27.19 / 26.18 / 26.53 -> Average 26.62
    assert round(sum([26.60, 27.19, 26.18, 26.53]) / 4, 2) == pytest.approx(26.62, abs=0.006)


def test_metrics_names():
    r = E.EvalResult("m", "x", scores={"wordnet_mc": {"logit": {"stem": 50.0, "average": 40.0}},
                                       "ceval": {"generate": {"other": 10.0}}})
    assert r.metrics() == {"wordnet_mc/stem/logit": 50.0, "wordnet_mc/average/logit": 40.0,
                           "ceval/other/generate": 10.0}
    assert RE.cell(r, "wordnet_mc", "stem") == "- / 50.00"


# ---------------------------------------------------------------------------------------- question files
def _write(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


GOOD = {"question": "q?", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "A", "category": "STEM"}


@pytest.mark.parametrize("rows, needle", [
    (["{not json"], "line 1 is not JSON"),
    ([GOOD, {k: v for k, v in GOOD.items() if k != "C"}], "line 2 lacks C"),
    ([{**GOOD, "answer": "E"}], "answer='E', allowed: A, B, C, D"),
    ([{**GOOD, "category": "Science"}], "category='Science', allowed: STEM, Social Science, Humanities, Other"),
    ([{**GOOD, "B": ""}], "empty or non-text 'B'"),
    ([], "no questions"),
])
def test_malformed_question_file(tmp_path, rows, needle):
    p = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RaycptError) as e:
        E.read_questions(p)
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RaycptError):
        E.resolve_task(str(p))


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(RaycptError, match="unknown task 'mmlu_pro'; allowed: wordnet_mc, mmlu"):
        E.resolve_task("mmlu_pro")
    with pytest.raises(RaycptError, match="question file not found"):
        E.resolve_task(str(tmp_path / "nope.jsonl"))


def test_hub_task_offline_names_offline_task(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(E, "_hub_cached", lambda spec: False)
    with pytest.raises(RaycptError) as e:
        E.resolve_task("ceval")
    msg = str(e.value)
    assert "ceval/ceval-exam" in msg and "HF_HUB_OFFLINE=1" in msg and "'wordnet_mc'" in msg and "\n" not in msg
    with pytest.raises(RaycptError, match="haonan-li/cmmlu"):
        E.resolve_tasks(["wordnet_mc", "cmmlu"])


def test_shipped_benchmark_file():
    rows = E.read_questions(E.WORDNET_MC_FILE)
    assert len(rows) >= 400
    first = rows[:8]
    assert [r["category"] for r in first] == CATS * 2            # interleaved: any limit is balanced
    for c in CATS:
        sub = [r for r in rows if r["category"] == c]
        assert len(sub) == len(rows) // 4
        assert sorted({r["answer"] for r in sub}) == list("ABCD")
        assert max(sum(r["answer"] == L for r in sub) for L in "ABCD") == len(sub) // 4  # letters balanced
    raw = [json.loads(line) for line in E.WORDNET_MC_FILE.read_text().splitlines()]
    for r in raw:
        opts = [r[L] for L in "ABCD"]
        assert len(set(opts)) == 4 and r[r["answer"]] == r["word"]
        definition = r["question"].split('"')[1].lower()
        assert r["word"] not in definition.split()
    assert len({r["id"] for r in raw}) == len(raw)


# ---------------------------------------------------------------------------------------- lm-eval on a tiny model
@pytest.fixture(scope="module")
def tiny():
    """A tiny Llama whose matrices are redrawn with std 1 (seeded): a freshly initialised tiny model
    picks the same letter for every question, this one's choice depends on the prompt."""
    from tiny import prompt_sensitive_llama, tiny_tokenizer

    return prompt_sensitive_llama(seed=1), tiny_tokenizer()


@pytest.fixture(scope="module")
def qfile(tmp_path_factory):
    words = ["cat", "dog", "eel", "fox", "owl", "ant", "bee", "cow"]
    rows = []
    for i in range(12):
        opts = [words[(i + k) % 8] for k in range(4)]
        rows.append({"id": f"t{i:02d}", "question": f"Which is {words[(i * 3) % 8]}?",
                     **dict(zip("ABCD", opts)), "answer": "ABCD"[(i * 7) % 4], "category": CATS[i % 4]})
    return _write(tmp_path_factory.mktemp("q") / "tiny_q.jsonl", rows), rows


def independent_logit_scores(model, tok, rows):
    """argmax over the four letters of log P(' L' | prompt), plain torch, one question at a time.

    The text is encoded the way the tokenizer does by default (here: with its BOS), as lm-eval does.
    """
    return _argmax_continuations(model, tok, [(prompt_of(q), [" " + L for L in "ABCD"]) for q in rows])


def _argmax_continuations(model, tok, items):
    """For each (prompt, four continuations): log P(continuation | prompt) summed over its tokens, plain
    torch, one sequence at a time; and the argmax letter (ties to the first, as lm-eval)."""
    preds, lps = [], []
    with torch.no_grad():
        for prompt, conts in items:
            ctx = tok(prompt)["input_ids"]
            per = []
            for cont in conts:
                ids = tok(prompt + cont)["input_ids"]
                assert ids[:len(ctx)] == ctx
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
                per.append(sum(float(logp[p - 1, ids[p]]) for p in range(len(ctx), len(ids))))
            lps.append(per)
            preds.append("ABCD"[max(range(4), key=lambda i: (per[i], -i))])
    return preds, lps


def test_logit_mode_equals_independent_scorer(tiny, qfile, tmp_path):
    model, tok = tiny
    path, rows = qfile
    res = E.evaluate_model(model, EvalConfig(tasks=[str(path)], modes=["logit"], batch_size=5), tokenizer=tok,
                           out_dir=tmp_path, name="tiny")
    preds, lps = independent_logit_scores(model, tok, rows)
    qs = {q["id"]: q for q in res.questions["tiny_q"]}
    assert len(set(preds)) >= 3  # the scorer is exercised, not a constant letter
    assert [qs[r["id"]]["logit"]["prediction"] for r in rows] == preds
    for r, ref in zip(rows, lps):
        assert qs[r["id"]]["logit"]["logprobs"] == pytest.approx(ref, abs=1e-4)
        assert qs[r["id"]]["gold"] == r["answer"]
    # category accuracies from the independent predictions, by hand
    for c, key in zip(CATS, ["stem", "social_science", "humanities", "other"]):
        idx = [i for i, r in enumerate(rows) if r["category"] == c]
        expect = 100.0 * sum(preds[i] == rows[i]["answer"] for i in idx) / len(idx)
        assert res.scores["tiny_q"]["logit"][key] == pytest.approx(expect)
    overall = 100.0 * sum(p == r["answer"] for p, r in zip(preds, rows)) / len(rows)
    assert res.scores["tiny_q"]["logit"]["overall"] == pytest.approx(overall)
    assert "generate" not in res.scores["tiny_q"]
    assert (tmp_path / "eval-tiny.csv").is_file() and (tmp_path / "eval-tiny_questions.json").is_file()


CLOZE_DESCRIPTION = "The following are questions (with answers) about the meanings of English words.\n\n"


def independent_cloze_scores(model, tok, rows):
    """argmax over the four options of log P(" <option text>" | "Question: <q>\nAnswer:"), plain torch
    (lm-eval's continuation format: the options are not listed, each option's text is scored)."""
    return _argmax_continuations(model, tok, [(f"{CLOZE_DESCRIPTION}Question: {q['question']}\nAnswer:",
                                               [" " + q[L] for L in "ABCD"]) for q in rows])


def test_cloze_mode_equals_independent_scorer(tiny, qfile):
    model, tok = tiny
    path, rows = qfile
    res = E.evaluate_model(model, EvalConfig(tasks=[str(path)], modes=["cloze", "logit"], batch_size=4), tokenizer=tok)
    preds, lps = independent_cloze_scores(model, tok, rows)
    qs = {q["id"]: q for q in res.questions["tiny_q"]}
    assert len(set(preds)) >= 3
    assert [qs[r["id"]]["cloze"]["prediction"] for r in rows] == preds
    for r, ref, p in zip(rows, lps, preds):
        assert qs[r["id"]]["cloze"]["logprobs"] == pytest.approx(ref, abs=1e-4)
        assert qs[r["id"]]["cloze"]["correct"] == (p == r["answer"])
        assert "prediction" in qs[r["id"]]["logit"]  # both modes on the same records
    overall = 100.0 * sum(p == r["answer"] for p, r in zip(preds, rows)) / len(rows)
    assert res.scores["tiny_q"]["cloze"]["overall"] == pytest.approx(overall)
    assert set(res.seconds) == {"load", "logit", "cloze"}
    assert "tiny_q/average/cloze" in res.metrics()
    # acc_norm (lm-eval's, issue 24): argmax of each option's log-likelihood over its length in characters
    norm = ["ABCD"[max(range(4), key=lambda i: (ref[i] / len(r["ABCD"[i]]), -i))] for r, ref in zip(rows, lps)]
    for r, p in zip(rows, norm):
        assert qs[r["id"]]["cloze"]["correct_norm"] == (p == r["answer"])
    want = 100.0 * sum(p == r["answer"] for p, r in zip(norm, rows)) / len(rows)
    assert res.scores["tiny_q"]["cloze_norm"]["overall"] == pytest.approx(want)
    assert "tiny_q/average/cloze_norm" in res.metrics()


def test_generate_mode_records_and_limit(tiny, qfile):
    model, tok = tiny
    path, rows = qfile
    model.train()
    res = E.evaluate_model(model, EvalConfig(tasks=[str(path)], modes=["generate", "logit"], limit=8,
                                             max_gen_toks=6), tokenizer=tok)
    assert model.training  # mode restored
    qs = res.questions["tiny_q"]
    assert [q["id"] for q in qs] == [r["id"] for r in rows[:8]]
    for q in qs:
        g = q["generate"]
        assert g["extracted"] == E.extract_choice(g["text"])
        assert g["correct"] == (g["extracted"] == q["gold"])
        assert "prediction" in q["logit"]
    # greedy decoding is deterministic and reproduced by plain HF generate (6 new tokens)
    q0 = rows[0]
    ids = tok(prompt_of(q0), return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert qs[0]["generate"]["text"] == tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split("\n\n")[0]
    scores, counts = E.category_scores((q["category"], q["generate"]["correct"]) for q in qs)
    assert res.scores["tiny_q"]["generate"] == pytest.approx(scores)
    assert counts["total"] == 8 and res.counts["tiny_q"]["total"] == 8
    assert set(res.seconds) == {"load", "logit", "generate"}


def test_table_and_csv(tiny, qfile, tmp_path):
    r1 = E.EvalResult("base", "x", scores={"wordnet_mc": {"logit": {"stem": 25.0, "social_science": 50.0,
                                                                     "humanities": 0.0, "other": 100.0,
                                                                     "average": 43.75, "overall": 40.0},
                                                           "generate": {"stem": 12.5, "average": 12.5}}},
                      counts={"wordnet_mc": {"total": 10}})
    paths = RE.write_results([r1], tmp_path)
    txt = paths["table"].read_text()
    assert "12.50 / 25.00" in txt and "- / 50.00" in txt and "12.50 / 43.75" in txt
    import csv

    row = next(csv.DictReader(paths["csv"].open()))
    assert row["model"] == "base" and float(row["average_logit"]) == 43.75 and row["other_generate"] == ""
    assert row["average_cloze"] == ""
    assert "Cloze" not in txt  # the papers' two columns only, when cloze did not run


def test_table_with_cloze_column(tmp_path):
    r = E.EvalResult("base", "x", scores={"mmlu": {"logit": {"stem": 25.0, "average": 25.0},
                                                   "generate": {"stem": 10.0, "average": 10.0},
                                                   "cloze": {"stem": 31.5, "average": 30.25}}},
                     counts={"mmlu": {"total": 57}})
    other = E.EvalResult("other", "y", scores={"mmlu": {"logit": {"stem": 20.0, "average": 20.0}}},
                         counts={"mmlu": {"total": 57}})
    assert RE.cell(r, "mmlu", "stem") == "10.00 / 25.00 / 31.50"
    paths = RE.write_results([r, other], tmp_path)
    txt = paths["table"].read_text()
    assert "Generate / Logit / Cloze" in txt and "10.00 / 25.00 / 30.25" in txt and "- / 20.00 / -" in txt
    import csv

    rows = list(csv.DictReader(paths["csv"].open()))
    assert float(rows[0]["stem_cloze"]) == 31.5 and rows[1]["stem_cloze"] == ""
    assert r.metrics()["mmlu/average/cloze"] == 30.25


@pytest.mark.parametrize("world, limit", [(2, None), (3, 7), (5, 4)])
def test_sharded_evaluation_equals_one_worker(tiny, qfile, tmp_path, world, limit):
    """Each rank scores documents rank, rank+world, ... (a rank past the limit scores none);
    merged, the questions, their order, every prediction and every score equal one worker's."""
    model, tok = tiny
    path, rows = qfile
    ecfg = EvalConfig(tasks=[str(path)], modes=["logit", "generate"], limit=limit, batch_size=3, max_gen_toks=4)
    one = E.evaluate_model(model, ecfg, tokenizer=tok)
    parts = [E.evaluate_model(model, ecfg, tokenizer=tok, shard=(r, world)) for r in range(world)]
    n = min(limit or len(rows), len(rows))
    assert [[q["id"] for q in p.questions["tiny_q"]] for p in parts] == [
        [rows[i]["id"] for i in range(r, n, world)] for r in range(world)]
    merged = E.merge_shards(parts, out_dir=tmp_path)
    assert [q["id"] for q in merged.questions["tiny_q"]] == [r["id"] for r in rows[:n]]
    for a, b in zip(merged.questions["tiny_q"], one.questions["tiny_q"]):
        assert a["logit"]["prediction"] == b["logit"]["prediction"]
        assert a["generate"]["extracted"] == b["generate"]["extracted"]
        assert a["generate"]["text"] == b["generate"]["text"]
        assert a["logit"]["logprobs"] == pytest.approx(b["logit"]["logprobs"], abs=1e-5)
    assert merged.scores == one.scores and merged.counts == one.counts
    assert (tmp_path / "eval-model_questions.json").is_file()


def _hand_continuous(lps, gold_idx, gold_text):
    """The three continuous scores of one question computed by hand from its options' log-likelihoods (the
    independent scorer's): a plain softmax over the four, the gold one's log-probability, and that over the
    gold text's length in characters."""
    z = sum(math.exp(x) for x in lps)
    return {"prob": 100.0 * math.exp(lps[gold_idx]) / z, "logprob": lps[gold_idx],
            "logprob_char": lps[gold_idx] / len(gold_text)}


@pytest.mark.parametrize("mode", ["cloze", "logit"])
def test_continuous_scores_equal_hand_computation(tiny, qfile, mode):
    """Issue 37: each question's gold probability mass, gold log-probability and its per-character form, and
    their category means, against a hand computation from the tiny model's own logits (plain torch, one
    sequence at a time), for the option texts (cloze) and the letters (logit)."""
    model, tok = tiny
    path, rows = qfile
    res = E.evaluate_model(model, EvalConfig(tasks=[str(path)], modes=[mode], batch_size=3), tokenizer=tok)
    _, lps = (independent_cloze_scores if mode == "cloze" else independent_logit_scores)(model, tok, rows)
    qs = {q["id"]: q for q in res.questions["tiny_q"]}
    hands = []
    for r, ref in zip(rows, lps):
        gold = "ABCD".index(r["answer"])
        hand = _hand_continuous(ref, gold, r[r["answer"]] if mode == "cloze" else r["answer"])
        hands.append(hand)
        for name, want in hand.items():
            assert qs[r["id"]][mode][name] == pytest.approx(want, rel=1e-4, abs=1e-4), (r["id"], name)
    assert len({round(h["prob"], 3) for h in hands}) > 6  # the scores vary over the questions
    for name in ("prob", "logprob", "logprob_char"):
        sc = res.scores["tiny_q"][f"{mode}.{name}"]
        by_cat = {}
        for c, key in zip(CATS, ["stem", "social_science", "humanities", "other"]):
            vals = [h[name] for h, r in zip(hands, rows) if r["category"] == c]
            by_cat[key] = sum(vals) / len(vals)
            assert sc[key] == pytest.approx(by_cat[key], rel=1e-4, abs=1e-4)
        assert sc["average"] == pytest.approx(sum(by_cat.values()) / 4, rel=1e-4, abs=1e-4)
        assert sc["overall"] == pytest.approx(sum(h[name] for h in hands) / len(hands), rel=1e-4, abs=1e-4)
        assert f"tiny_q/average/{mode}.{name}" in res.metrics()


def test_continuous_scores_off(tiny, qfile):
    """eval.continuous=false: the accuracies alone (what bench_eval times against)."""
    model, tok = tiny
    path, _ = qfile
    res = E.evaluate_model(model, EvalConfig(tasks=[str(path)], modes=["cloze"], batch_size=4, continuous=False),
                           tokenizer=tok)
    assert set(res.scores["tiny_q"]) == {"cloze", "cloze_norm"}
    assert all("prob" not in q["cloze"] for q in res.questions["tiny_q"])
