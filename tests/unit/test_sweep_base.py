"""Issue 37: gain and forgetting against the untrained model, the trade-off's Pareto front, the base row's cached
evaluation, the general probe's documents, and the terminal's length - each against an independent computation."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from raycpt.evaluate.general import general_blocks, general_documents
from raycpt.report.sweep.summary import build_summary
from raycpt.report.sweep.base import against_base, pareto_front
from raycpt.report.sweep.outcomes import question_outcomes
from fake_run import FakeRun
from raycpt.runs.location import locate

CATS = ["STEM", "Social Science", "Humanities", "Other"]


# ------------------------------------------------------------------------------------------ Pareto front
def _brute_front(points):
    """O(n^2): a point is on the front when no other point is at least as good on both axes and better on one."""
    out = []
    for n, x, y in points:
        if not any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for _, x2, y2 in points):
            out.append(n)
    return out


def test_pareto_front_equals_brute_force_on_random_points_with_ties():
    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(1, 12))
        pts = [(f"p{i}", float(rng.integers(-3, 4)), float(rng.integers(-3, 4))) for i in range(n)]  # many ties
        assert sorted(pareto_front(pts)) == sorted(_brute_front(pts)), pts
    # by hand: b dominates a; c and b trade off; d duplicates c (both stay)
    assert sorted(pareto_front([("a", 0, 1), ("b", 1, 0), ("c", 2, 1), ("d", 2, 1), ("e", 2, 2)])) == ["b", "c", "d"]


def test_pareto_front_check_fails_on_a_wrong_front():
    """The brute-force reference is not the function under test: a front that keeps dominated points differs."""
    pts = [("a", 0.0, 1.0), ("b", 1.0, 0.0)]
    assert _brute_front(pts) == ["b"] and pareto_front(pts) == ["b"]


# ------------------------------------------------------------------------------------------ against base
def _run(name, strategy, seed, probs, blocks, general, split=None):
    """A trial with per-question cloze records carrying a continuous ``prob`` and a correct flag, held-out and
    general block losses (each block its own document)."""
    qs = [{"id": f"q{i}", "category": CATS[i % 4], "question": "?", "gold": "A",
           "cloze": {"prediction": "A", "correct": p > 50, "prob": float(p)}} for i, p in enumerate(probs)]
    per = {c: np.mean([p for i, p in enumerate(probs) if i % 4 == k]) for k, c in enumerate(
        ["stem", "social_science", "humanities", "other"])}
    scores = {f"wn/{c}/cloze.prob": v for c, v in per.items()}
    scores["wn/average/cloze.prob"] = float(np.mean(list(per.values())))
    scores["wn/average/cloze"] = 100.0 * np.mean([p > 50 for p in probs])
    return {"name": name, "group": name, "strategy": strategy, "split": split, "b": None, "seed": seed,
            "scores": scores, "outcomes": question_outcomes({"wn": qs}),
            "heldout_blocks": list(blocks), "heldout_weights": [63] * len(blocks), "heldout_loss": float(np.mean(blocks)),
            "general_blocks": list(general), "general_weights": [63] * len(general),
            "general_loss": float(np.mean(general))}


RNG = np.random.default_rng(0)
Q = 40
BASE_P = 30 + 20 * RNG.random(Q)
FULL_P = BASE_P + 6 + 2 * RNG.standard_normal(Q)  # full gains on the domain
SH_P = BASE_P + 0.3 * RNG.standard_normal(Q)  # shallow: no clear change
BASE_H = 3.8 + 0.2 * RNG.standard_normal(30)
FULL_H = BASE_H - 0.3 + 0.02 * RNG.standard_normal(30)
SH_H = BASE_H - 0.1 + 0.02 * RNG.standard_normal(30)
BASE_G = 3.0 + 0.2 * RNG.standard_normal(25)
FULL_G = BASE_G + 0.05 + 0.01 * RNG.standard_normal(25)  # full forgets
SH_G = BASE_G + 0.001 * RNG.standard_normal(25)


def _trials():
    return [_run("base", "base", 0, BASE_P, BASE_H, BASE_G), _run("full", "full", 0, FULL_P, FULL_H, FULL_G),
            _run("train_shallow-r0.5", "train_shallow", 0, SH_P, SH_H, SH_G, split=0.5)]


def test_gain_and_forgetting_against_base_by_hand():
    res = against_base(_trials(), domain=["wn"], general=[])
    labels = [(m["axis"], m["task"], m["mode"]) for m in res["metrics"]]
    assert labels == [("gain", "heldout_loss", None), ("gain", "wn", "cloze.prob"), ("forget", "general_loss", None)]
    rows = {r["name"]: r for r in res["rows"]}
    assert set(rows) == {"full", "train_shallow-r0.5"}
    for name, h, p, g in (("full", FULL_H, FULL_P, FULL_G), ("train_shallow-r0.5", SH_H, SH_P, SH_G)):
        held, prob, gen = rows[name]["cells"]
        # held-out: gain = base - row; equal weights, one block per document: scipy's paired t over blocks
        ref = st.ttest_rel(h, BASE_H)
        ci = ref.confidence_interval(0.95)
        assert held["delta"] == pytest.approx(np.mean(h - BASE_H), abs=1e-12)
        assert held["shown"] == pytest.approx(np.mean(BASE_H - h), abs=1e-12)
        assert (held["shown_lo"], held["shown_hi"]) == pytest.approx((-ci.high, -ci.low), rel=1e-9)
        assert held["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        # the continuous score: gain = row - base; categories of equal size make the Average column the mean over
        # all questions, so its interval is scipy's paired t over the questions
        d = p - BASE_P
        ci = st.ttest_rel(p, BASE_P).confidence_interval(0.95)
        assert prob["shown"] == pytest.approx(np.mean(d), abs=1e-9)
        assert (prob["shown_lo"], prob["shown_hi"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
        # forgetting = row - base on the general probe's loss
        assert gen["shown"] == pytest.approx(np.mean(g - BASE_G), abs=1e-12)
    # full gains more and forgets more; shallow gains less and forgets ~nothing: both on the front, base too?
    # base (0, 0) is dominated by shallow only if shallow's forgetting <= 0 - decide by the numbers themselves
    pts = [("base", 0.0, 0.0)] + [(n, r["cells"][0]["shown"], r["cells"][2]["shown"]) for n, r in rows.items()]
    assert sorted(res["pareto"]) == sorted(_brute_front(pts))


def test_base_comparisons_join_the_verdicts_family_and_marks_read_better_or_worse():
    s = build_summary(_trials(), None, ["wn"], [], resamples=200, report={"primary": "heldout_loss"})
    fam = s["verdict"]["comparisons"]
    vs_base = [c for c in fam if c["b"] == "base"]
    assert {(c["a"], c["task"], c["mode"]) for c in vs_base} == {
        (n, t, m) for n in ("full", "train_shallow-r0.5")
        for t, m in (("heldout_loss", None), ("wn", "cloze.prob"), ("general_loss", None))}
    assert not any(c["a"] == "base" for c in fam)  # the base row against full is not a second copy of full vs base
    # issue 50: the against-base comparisons are their own family, counted and controlled apart
    assert {c["family"] for c in vs_base} == {"vs base"} and {c["family"] for c in fam if c["b"] != "base"} == {"vs full"}
    assert s["verdict"]["family_size"] == sum(c["p"] is not None for c in fam if c["b"] != "base")
    assert s["verdict"]["base_size"] == sum(c["p"] is not None for c in vs_base)
    full = next(r for r in s["base"]["rows"] if r["name"] == "full")
    held, prob, gen = full["cells"]
    # the family decided on row - base: full's lower held-out loss is sign -1 (better), its higher general loss +1
    assert held["sign"] == -1 and prob["sign"] == 1 and gen["sign"] == 1
    from raycpt.report.sweep.views.markdown import summary_markdown

    md = summary_markdown(s)
    assert "Gain and forgetting against base" in md and "cloze.prob" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| full"))
    assert line.count("▲") == 2 and line.count("▼") == 1  # gains better than base, forgetting worse


def test_compact_terminal_fits_30_lines_and_80_columns_for_the_default_shape():
    from types import SimpleNamespace

    from rich.console import Console

    from raycpt.report.render import render_sweep

    rng = np.random.default_rng(1)
    trials = [_run("base", "base", 0, BASE_P, BASE_H, BASE_G), _run("full", "full", 0, FULL_P, FULL_H, FULL_G)]
    for strat, r in itertools.product(("train_shallow", "train_deep"), (0.33, 0.5, 0.66)):
        trials.append(_run(f"{strat}-r{r:g}", strat, 0, BASE_P + rng.standard_normal(Q), BASE_H - 0.1 * r,
                           BASE_G + 0.01 * r, split=r))
    s = build_summary(trials, {"split_scores": {"0.33": 0.4, "0.5": 0.3, "0.66": 0.2}}, ["wn"], ["mmlu"],
                      resamples=200, report={"primary": "heldout_loss"}, num_layers=30)
    s.update(num_layers=30, recommended_split=0.3)  # as write_summary adds them: the trace's split, untrained
    console = Console(width=80, record=True)
    render_sweep(SimpleNamespace(summary=s, run_dir=Path("/tmp/runs/sweep-default-0123abcd"), wall_s=300.0,
                                 parent_run_id="0" * 32), console)
    text = console.export_text()
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 30, text
    assert max(len(x) for x in lines) <= 80, text
    assert "…" not in text, text  # no cell or name cut short
    # issue 48: what to do first (no horizon line here), not a claim with one run per row; the untrained trace split
    assert lines[0].startswith("Leader on heldout_loss (point estimate, not a decision)") and "Pareto front" in text
    assert "sweep.seeds=[0,1,2]" in text and "raycpt sweep CONFIG --splits 0.3" in text
    for t in trials:
        assert t["name"] in text


# ------------------------------------------------------------------------------------------ the general probe
def test_general_documents_are_evenly_spaced_and_blocks_keep_their_documents():
    rows = [{"question": f" q{i} ", "A": f"a{i}", "B": "b", "C": "c", "D": "d", "answer": "A"} for i in range(10)]
    docs = general_documents(rows, 4)
    assert docs == ["q1\na1", "q3\na3", "q6\na6", "q8\na8"]  # floor((i + 0.5) * 10 / 4) = 1, 3, 6, 8
    assert general_documents(rows, 50) == [f"q{i}\na{i}" for i in range(10)]

    class Tok:
        eos_token_id = 0

        def __call__(self, docs, add_special_tokens=False):
            return {"input_ids": [[1] * (3 + i) for i, _ in enumerate(docs)]}

    b = general_blocks(["x", "y", "z"], Tok(), 4)  # documents of 4, 5, 6 tokens with EOS: 15 tokens -> 3 blocks
    assert len(b) == 3 and b.documents == [0, 1, 2]


# ------------------------------------------------------------------------------------------ the base row's cache
_FakeRun = FakeRun


def test_base_row_is_evaluated_once_and_reused_on_resume(tiny_dir, tmp_path, monkeypatch):
    """The untrained model's evaluation runs once per model and evaluation settings: a resumed sweep's base trial
    (a new trial folder) and a second sweep read the cache; another eval.limit evaluates again. Counted at the
    evaluation bridge."""
    import raycpt.train.driver.final_eval as fe
    from raycpt.config import load_config
    from raycpt.jobs.base_row import BASE, base_cache_dir
    from raycpt.jobs.grid import Trial
    from raycpt.jobs.sweep import TrialSpec

    calls = []
    real = fe.evaluate_model

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(fe, "evaluate_model", counted)
    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Which is {i}?", "A": "cat", "B": "dog",
                                         "C": "eel", "D": "fox", "answer": "ABCD"[i % 4], "category": CATS[i % 4]})
                             + "\n" for i in range(8)))
    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}", f"eval.tasks=[{qfile}]", "eval.modes=[cloze]",
                             "eval.limit=null"])
    spec = TrialSpec(name=BASE, strategy=BASE)

    def run_base(folder, c=cfg):
        tdir = tmp_path / folder
        tdir.mkdir(parents=True)
        trial = Trial(cfg=c, dir=tdir, run=_FakeRun(locate(c.tracking, check=False)), parent_run_id="p",
                      shared={"model_path": str(tiny_dir)})
        return spec.run(trial)

    first = run_base("sweep1/trials/base")
    assert len(calls) == 1 and first["strategy"] == BASE and first["trainable_params"] == 0
    assert Path(first["eval_file"]).is_file() and "q/average/cloze.prob" in first["scores"]
    again = run_base("sweep1-resumed/trials/base")
    other_sweep = run_base("sweep2/trials/base")
    assert len(calls) == 1  # both read the cache
    assert again["scores"] == first["scores"] == other_sweep["scores"]
    changed = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}", f"eval.tasks=[{qfile}]",
                                 "eval.modes=[cloze]", "eval.limit=4"])
    run_base("sweep3/trials/base", changed)
    assert len(calls) == 2  # other evaluation settings: another cache entry
    cache = tmp_path / "runs" / "base_eval"
    assert base_cache_dir(cache, changed, str(tiny_dir), {}) != base_cache_dir(cache, cfg, str(tiny_dir), {})


def test_write_summary_draws_the_tradeoff_and_runs_show_prints_the_per_category_tables(tmp_path):
    """The trade-off picture lands in summary/ (and so among the parent run's artifacts: log_summary logs every
    summary file); ``raycpt runs show`` reads summary.json back and prints what the terminal no longer does."""
    from rich.console import Console

    from raycpt.jobs.show import show_run
    from raycpt.report.render import render_runs_show
    from raycpt.report.sweep.summary import write_summary

    s = write_summary(tmp_path, _trials(), None, num_layers=30, domain=["wn"], general=[],
                      report={"primary": "heldout_loss"})
    assert str(tmp_path / "summary" / "tradeoff.png") in s["files"]
    png = (tmp_path / "summary" / "tradeoff.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    console = Console(width=120, record=True)
    render_runs_show(show_run((str(tmp_path),), section="all"), console)  # every section (the default: an overview)
    text = console.export_text()
    for needle in ("wn, cloze mode: accuracy", "wn, cloze.prob score", "STEM", "gain / forgetting vs base",
                   "Verdict", "tradeoff.png"):
        assert needle in text, needle


def test_one_seed_terminal_shows_intervals_but_no_marks_and_no_best():
    """Issue 50: one run per row and no noise estimate - the compact verdict and table show each Δ with its interval
    and no ▲ / ▼ and no "Best" line (the summary's own cells keep their checkpoint decisions for summary.md)."""
    from rich.console import Console

    from raycpt.report.sweep.seeds import strategy_claims_allowed
    from raycpt.report.sweep.views.terminal import compact_table, compact_verdict

    s = build_summary(_trials(), None, ["wn"], [], resamples=200, report={"primary": "heldout_loss"})
    assert s["verdict"]["claim"] == "checkpoint" and not strategy_claims_allowed(s)
    assert any(c["sign"] for c in s["verdict"]["comparisons"])  # marks exist to hide: the test is not vacuous
    console = Console(width=100, record=True)
    for line in compact_verdict(s):
        console.print(line)
    console.print(compact_table(s))
    text = console.export_text()
    assert "▲" not in text and "▼" not in text
    assert "Best" not in text and "±" in text and "point estimates" in text


def test_parent_runs_overview_shows_the_tradeoff_picture_from_its_own_artifacts(tmp_path):
    """Issue 48 item 6: the sweep's MLflow description (``mlflow.note.content``, which the run page's overview
    renders as Markdown, keeping ``<img src>``) embeds the trade-off figure. Read back from a real store: one image,
    a relative ``get-artifact`` URL (the browser resolves it against the server, static prefix included) naming this
    run and an artifact the run has, whose bytes are the figure's. The folder's record keeps a placeholder, not an
    id, so ``raycpt runs sync`` into a new run (server gone during the job) points the picture at that run."""
    import re
    from urllib.parse import parse_qs, urlparse

    from fake_run import sqlite_parent
    from raycpt.jobs.sweep import log_summary
    from raycpt.report.sweep.summary import write_summary
    from raycpt.report.sweep.views.advice import NOTE, run_description
    from raycpt.runs.records import RECORDS, RUN_ID_MARK

    cfg, client, exp, parent, run_at = sqlite_parent(tmp_path)
    s = write_summary(tmp_path / "run", _trials(), None, num_layers=30, domain=["wn"], general=[],
                      report={"primary": "heldout_loss"})
    log_summary(run_at(), s["files"], None, s)
    note = client.get_run(parent).data.tags[NOTE]
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", note)
    assert len(images) == 1, note
    url = urlparse(images[0])
    assert (url.scheme, url.netloc, url.path) == ("", "", "get-artifact"), images[0]
    query = parse_qs(url.query)
    assert query["run_uuid"] == [parent]
    (path,) = query["path"]
    assert path == "summary/tradeoff.png" and path in {a.path for a in client.list_artifacts(parent, "summary")}
    got = Path(client.download_artifacts(parent, path, str(tmp_path / "dl"))).read_bytes()
    assert got[:8] == b"\x89PNG\r\n\x1a\n" and got == (tmp_path / "run" / "summary" / "tradeoff.png").read_bytes()
    records = (tmp_path / "run" / RECORDS).read_text()
    assert RUN_ID_MARK in records and parent not in records
    assert "![" not in run_description(s, ["a line"])  # no figure drawn (no base row): no picture
