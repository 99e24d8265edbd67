"""Sweep summary arithmetic, checked against hand-computed deltas."""

import pytest

from raycpt.report.sweep.model import as_rows
from raycpt.report.sweep.views.markdown import table_markdown
from raycpt.report.sweep.cells import parse_cells, split_gains, summary_table


def _trial(name, strategy, split, stem_l, avg_l, avg_g):
    return {"name": name, "strategy": strategy, "split": split, "b": None if split is None else round(split * 10),
            "scores": {"wn/stem/logit": stem_l, "wn/average/logit": avg_l, "wn/average/generate": avg_g}}


TRIALS = [
    _trial("full", "full", None, 30.0, 40.0, 20.0),
    _trial("train_shallow-r0.5", "train_shallow", 0.5, 35.0, 45.0, 10.0),
    _trial("train_deep-r0.5", "train_deep", 0.5, 25.0, 38.0, 20.0),
]


def test_parse_cells_nests_task_category_mode():
    cells = parse_cells({"wn/stem/logit": 50.0, "bad-key": 1.0})
    assert cells == {"wn": {"stem": {"logit": 50.0}}}


def test_summary_deltas_and_best_marks_match_hand_values():
    rows = {r["name"]: r for r in summary_table(TRIALS)["wn"]}
    # deltas against full, by hand
    assert rows["train_shallow-r0.5"]["cells"]["stem"]["logit"]["delta"] == pytest.approx(5.0)
    assert rows["train_deep-r0.5"]["cells"]["average"]["logit"]["delta"] == pytest.approx(-2.0)
    assert rows["train_shallow-r0.5"]["cells"]["average"]["generate"]["delta"] == pytest.approx(-10.0)
    assert rows["full"]["cells"]["stem"]["logit"]["delta"] is None
    # best per column: shallow has the best logit cells; full and deep tie on generate average
    assert rows["train_shallow-r0.5"]["cells"]["average"]["logit"]["best"]
    assert not rows["full"]["cells"]["average"]["logit"]["best"]
    assert rows["full"]["cells"]["average"]["generate"]["best"] and rows["train_deep-r0.5"]["cells"]["average"]["generate"]["best"]


def test_split_gains_pair_s_b_with_realised_gain():
    (row,) = split_gains(TRIALS, {"0.5": 0.138}, "wn")
    assert row["S_b"] == pytest.approx(0.138)
    assert row["shallow_vs_full_logit"] == pytest.approx(5.0)
    assert row["shallow_vs_deep_logit"] == pytest.approx(7.0)
    assert row["shallow_vs_deep_generate"] == pytest.approx(-10.0)


def test_markdown_has_one_row_per_trial_and_percentages():
    md = table_markdown("wn", as_rows(summary_table(TRIALS)["wn"]))
    assert md.count("\n| train_") == 2
    assert "45.00*" in md and "(+5.00" in md


def test_markdown_carries_final_loss_and_terminal_table_fits_80_columns():
    from rich.console import Console

    from raycpt.report.sweep.views.rich import rich_table

    trials = [dict(t, final_loss=loss) for t, loss in zip(TRIALS, (3.4851, 3.7492, 3.7603))]
    rows = as_rows(summary_table(trials)["wn"])
    md = table_markdown("wn", rows)
    assert "final loss" in md.splitlines()[2]
    assert "| 3.749 |" in md and "| 3.760 |" in md and "| 3.485 |" in md
    console = Console(width=80, record=True)
    console.print(rich_table("wn", rows, "logit"))
    text = console.export_text()
    # full names (never truncated at 80 columns), deltas against full by hand: 35-30, 45-40, 38-40
    assert "train_shallow-r0.5" in text and "+5.00" in text and "-2.00" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "45.00*" in text and "40.00*" not in text  # best logit average: shallow's 45


def test_held_out_loss_gains_and_trials_table_by_hand():
    from rich.console import Console

    from raycpt.report.sweep.views.rich import rich_gains_table, rich_trials_table

    losses = {"full": 3.570, "train_shallow-r0.5": 3.789, "train_deep-r0.5": 3.859}
    trials = [dict(t, heldout_loss=losses[t["name"]], final_loss=3.5, trainable_params=53_100_000, wall_s=50.2)
              for t in TRIALS]
    (row,) = split_gains(trials, {"0.5": 0.338}, "wn")
    assert row["shallow_vs_full_heldout"] == pytest.approx(3.789 - 3.570)
    assert row["shallow_vs_deep_heldout"] == pytest.approx(3.789 - 3.859)
    console = Console(width=80, record=True)
    console.print(rich_gains_table("wn", [row]))
    console.print(rich_trials_table(trials))
    text = console.export_text()
    assert "-0.070" in text and "+0.219" in text and "+0.289" in text and "53.1M" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    # without held-out losses the columns are absent, not filled with dashes
    (plain,) = split_gains(TRIALS, {"0.5": 0.338}, "wn")
    assert plain["shallow_vs_deep_heldout"] is None


# ------------------------------------------------------------------------------------------ intervals
import math  # noqa: E402

import numpy as np  # noqa: E402

from naive_stats import naive_score_interval  # noqa: E402
from raycpt.report.sweep.summary import build_summary  # noqa: E402
from raycpt.report.sweep.domain import domain_general  # noqa: E402
from raycpt.report.sweep.views.markdown import summary_markdown  # noqa: E402
from raycpt.report.sweep.outcomes import load_outcomes, question_outcomes  # noqa: E402

CATS = ["STEM", "Social Science", "Humanities", "Other"]
KEYS = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}


def _records(correct: dict[str, list[int]], prefix: str = "q") -> list[dict]:
    """Per-question records as the eval bridge writes them: question i is in category i % 4."""
    n = len(next(iter(correct.values())))
    return [{"id": f"{prefix}{i}", "category": CATS[i % 4], "question": "?", "gold": "A",
             **{m: {"prediction": "A", "correct": bool(c[i])} for m, c in correct.items()}} for i in range(n)]


def _scores(task: str, correct: dict[str, list[int]]) -> dict[str, float]:
    """Scores by hand: per category percent, average = mean of categories, overall = percent of all."""
    out = {}
    for m, c in correct.items():
        c = np.asarray(c, dtype=float)
        cats = np.arange(len(c)) % 4
        per = {KEYS[CATS[k]]: 100 * c[cats == k].mean() for k in range(4)}
        out.update({f"{task}/{k}/{m}": v for k, v in per.items()})
        out[f"{task}/average/{m}"] = float(np.mean(list(per.values())))
        out[f"{task}/overall/{m}"] = 100 * c.mean()
    return out


def _run(name, strategy, split, seed, tasks: dict[str, dict[str, list[int]]], blocks=None, group=None):
    scores, questions = {}, {}
    for task, correct in tasks.items():
        scores.update(_scores(task, correct))
        questions[task] = _records(correct, prefix=task[:2])
    t = {"name": name, "group": group or name, "strategy": strategy, "split": split, "b": None, "seed": seed,
         "scores": scores, "outcomes": question_outcomes(questions)}
    if blocks is not None:
        t.update(heldout_blocks=list(blocks), heldout_weights=[63] * len(blocks), heldout_loss=float(np.mean(blocks)))
    return t


RNG = np.random.default_rng(0)
N = 80
FULL_DOM = (RNG.random(N) < 0.3).astype(int)
SH_DOM = np.where(RNG.random(N) < 0.5, 1, FULL_DOM)  # shallow also right on about half of full's misses
FULL_GEN = (RNG.random(N) < 0.5).astype(int)
SH_GEN = FULL_GEN.copy()
SH_GEN[:3] = 1 - SH_GEN[:3]  # three answers flip: no clear change
FULL_BLK = 3.5 + 0.2 * RNG.standard_normal(48)
SH_BLK = FULL_BLK - 0.08 + 0.02 * RNG.standard_normal(48)


def _one_seed_trials():
    full = _run("full", "full", None, 0, {"wn": {"logit": FULL_DOM, "cloze": FULL_DOM},
                                          "gen_bench": {"logit": FULL_GEN}}, FULL_BLK)
    sh = _run("train_shallow-r0.5", "train_shallow", 0.5, 0, {"wn": {"logit": SH_DOM, "cloze": FULL_DOM},
                                                              "gen_bench": {"logit": SH_GEN}}, SH_BLK)
    return [full, sh]


def test_question_outcomes_keeps_every_mode_and_maps_categories():
    recs = _records({"logit": [1, 0], "cloze": [0, 0]})
    assert question_outcomes({"t": recs}) == {"t": {"logit": {"q0": ("stem", True), "q1": ("social_science", False)},
                                                    "cloze": {"q0": ("stem", False), "q1": ("social_science", False)}}}


def test_one_seed_deltas_carry_exact_mcnemar_and_score_intervals_checked_against_scipy():
    # was: a percentile bootstrap checked against scipy's; the issue (24) shows it anti-conservative when few
    # questions differ, so one seed now gets the exact McNemar test and the score interval
    from scipy.stats import binomtest

    rows = {r["name"]: r for r in build_summary(_one_seed_trials(), None, ["wn"], ["gen_bench"],
                                                resamples=2000)["tables"]["wn"]}
    cell = rows["train_shallow-r0.5"]["cells"]["overall"]["logit"]
    assert cell["delta"] == pytest.approx(100 * (SH_DOM.mean() - FULL_DOM.mean()))
    lo, hi = naive_score_interval(SH_DOM, FULL_DOM)
    assert cell["lo"] == pytest.approx(lo, abs=0.06) and cell["hi"] == pytest.approx(hi, abs=0.06)
    n10, n01 = int(((SH_DOM == 1) & (FULL_DOM == 0)).sum()), int(((SH_DOM == 0) & (FULL_DOM == 1)).sum())
    assert cell["p"] == pytest.approx(binomtest(n10, n10 + n01, 0.5).pvalue, rel=1e-9)
    assert cell["method"] == "exact McNemar + score interval"
    # the overall column is outside the family (the Average column is in it): an interval, no mark
    assert cell["sign"] is None and cell["raw_sign"] == 1
    stem = rows["train_shallow-r0.5"]["cells"]["stem"]["logit"]  # only questions 0, 4, 8, ...
    lo, hi = naive_score_interval(SH_DOM[0::4], FULL_DOM[0::4])
    assert stem["lo"] == pytest.approx(lo, abs=0.06) and stem["hi"] == pytest.approx(hi, abs=0.06)
    # the cloze mode is identical in both runs: delta 0 with an interval around it (80 agreeing questions
    # do not prove a zero difference; was a zero-width bootstrap interval), p = 1, no mark
    same = rows["train_shallow-r0.5"]["cells"]["average"]["cloze"]
    lo, hi = naive_score_interval(FULL_DOM, FULL_DOM)
    assert same["delta"] == 0.0 and same["lo"] == pytest.approx(lo, abs=0.06) and same["hi"] == pytest.approx(hi, abs=0.06)
    assert same["p"] == 1.0 and same["sign"] == 0
    assert rows["full"]["cells"]["overall"]["logit"]["delta"] is None


def test_average_cell_is_a_stratified_bootstrap_of_the_category_mean():
    # categories of unequal size (70 questions: 18, 18, 17, 17); with equal sizes the Average column is the
    # all-questions accuracy and gets its exact test and score interval (checked at the end; was the
    # stratified bootstrap there too)
    m = 70
    trials = [_run("full", "full", None, 0, {"wn": {"logit": FULL_DOM[:m]}}),
              _run("train_shallow-r0.5", "train_shallow", 0.5, 0, {"wn": {"logit": SH_DOM[:m]}})]
    rows = {r["name"]: r for r in build_summary(trials, None, resamples=4000)["tables"]["wn"]}
    cell = rows["train_shallow-r0.5"]["cells"]["average"]["logit"]
    d = (SH_DOM[:m] - FULL_DOM[:m]).astype(float)
    cats = np.arange(m) % 4
    # a naive stratified bootstrap, written here: resample each category within itself, average the four means
    rng = np.random.default_rng(99)
    reps = [np.mean([rng.choice(d[cats == k], size=(cats == k).sum()).mean() for k in range(4)]) * 100
            for _ in range(4000)]
    lo, hi = np.quantile(reps, [0.025, 0.975])
    assert cell["delta"] == pytest.approx(100 * np.mean([d[cats == k].mean() for k in range(4)]))
    assert cell["lo"] == pytest.approx(lo, abs=1.5) and cell["hi"] == pytest.approx(hi, abs=1.5)
    # its test: McNemar's z stratum by stratum, by hand
    from scipy.stats import norm

    num = sum(((d[cats == k] > 0).sum() - (d[cats == k] < 0).sum()) / (cats == k).sum() for k in range(4))
    var = sum((d[cats == k] != 0).sum() / (cats == k).sum() ** 2 for k in range(4))
    assert cell["p"] == pytest.approx(2 * norm.sf(abs(num) / np.sqrt(var)))
    eq = {r["name"]: r for r in build_summary(_one_seed_trials(), None, resamples=500)["tables"]["wn"]}
    avg, allq = (eq["train_shallow-r0.5"]["cells"][c]["logit"] for c in ("average", "overall"))
    assert (avg["delta"], avg["lo"], avg["hi"], avg["p"]) == pytest.approx((allq["delta"], allq["lo"], allq["hi"],
                                                                           allq["p"]))


def test_heldout_loss_delta_is_a_t_interval_over_blocks_without_document_ids():
    # was a percentile bootstrap over blocks; the issue (24): blocks of a document are correlated, so the
    # interval is a t over documents, over blocks only when the result has no document ids (here: equal
    # weights, so it is the one-sample t-interval of the block differences)
    from scipy.stats import ttest_1samp

    (row,) = [r for r in build_summary(_one_seed_trials(), None, resamples=2000)["tables"]["wn"]
              if r["name"] != "full"]
    h = row["heldout_delta"]
    assert h["delta"] == pytest.approx(SH_BLK.mean() - FULL_BLK.mean())
    ref = ttest_1samp(SH_BLK - FULL_BLK, 0.0)
    ci = ref.confidence_interval(0.95)
    assert h["lo"] == pytest.approx(ci.low, rel=1e-9) and h["hi"] == pytest.approx(ci.high, rel=1e-9)
    assert h["p"] == pytest.approx(ref.pvalue, rel=1e-6) and h["method"] == "t over blocks"
    assert h["sign"] == -1  # lower loss, clearly (and it survives the multiplicity control)
    # with document ids (three blocks per document) the t runs over the 16 documents' sums, by hand
    docs = np.repeat(np.arange(16), 3)
    trials = [dict(t, heldout_docs=list(docs)) for t in _one_seed_trials()]
    (row,) = [r for r in build_summary(trials, None, resamples=500)["tables"]["wn"] if r["name"] != "full"]
    dj = (SH_BLK - FULL_BLK).reshape(16, 3).mean(1)  # equal weights: the document means
    ref = ttest_1samp(dj, 0.0).confidence_interval(0.95)
    assert (row["heldout_delta"]["lo"], row["heldout_delta"]["hi"]) == pytest.approx((ref.low, ref.high), rel=1e-9)
    assert row["heldout_delta"]["method"] == "t over documents"


def test_domain_versus_general_names_gain_and_change():
    summary = build_summary(_one_seed_trials(), None, ["wn"], ["gen_bench", "mmlu"], resamples=2000)
    (e,) = summary["domain_general"]
    assert e["name"] == "train_shallow-r0.5"
    assert {(i["task"], i["mode"]) for i in e["domain"]} == {("wn", "logit"), ("wn", "cloze")}
    assert [(i["task"], i["mode"]) for i in e["general"]] == [("gen_bench", "logit")]  # mmlu did not run: skipped
    g = e["general"][0]
    assert g["delta"] == pytest.approx(100 * np.mean([(SH_GEN - FULL_GEN)[np.arange(N) % 4 == k].mean()
                                                      for k in range(4)]))
    assert g["sign"] == 0
    assert e["reading"] == "domain gain; no clear general change; held-out loss lower"
    md = summary_markdown(summary)
    assert "**Domain versus general**" in md and "domain: wn L" in md and "general: gen_bench L" in md
    table = md.split("**Domain versus general**")[1]
    assert "▲" in table and "▼" not in table  # the domain gain and the lower held-out loss (better): no worse cell
    assert "Not evaluated in this sweep: eval.general mmlu." in md
    # no task of either role ran: no section
    assert domain_general(summary["tables"], ["x"], ["y"]) == []


def test_seeds_give_mean_and_t_interval_per_cell_by_hand():
    from scipy.stats import t as student
    from scipy.stats import ttest_ind

    trials = []
    # three seeds: the shallow run is ahead by 3, 4 and 5 questions of 80 (3.75, 5.0, 6.25 points overall)
    for sd, k in ((0, 3), (1, 4), (2, 5)):
        base = (np.arange(N) < 20 + sd).astype(int)
        better = base.copy()
        better[40:40 + k] = 1
        trials.append(_run(f"full-s{sd}", "full", None, sd, {"wn": {"logit": base}}, group="full"))
        trials.append(_run(f"train_shallow-r0.5-s{sd}", "train_shallow", 0.5, sd, {"wn": {"logit": better}},
                           group="train_shallow-r0.5"))
    rows = {r["name"]: r for r in build_summary(trials, None, resamples=500)["tables"]["wn"]}
    assert set(rows) == {"full", "train_shallow-r0.5"} and rows["full"]["seeds"] == [0, 1, 2]
    cell = rows["train_shallow-r0.5"]["cells"]["overall"]["logit"]
    # issue 50: a strategy claim, each plan its own run variance. Run values: full 25, 26.25, 27.5 (variance
    # 1.25^2, 2 df) and shallow 28.75, 31.25, 33.75 points (2.5^2, 2 df); the question part: per question the share
    # right over a row's runs, shallow minus full (questions 40-42 ahead in every seed, 43 in two, 44 in one),
    # var / 80 on 79 df; t on Welch's df of the two run parts (the question part widens se, not the df)
    big_d = np.zeros(N)
    big_d[40:43], big_d[43], big_d[44] = 100.0, 200.0 / 3, 100.0 / 3
    runs = [(1.25 ** 2 / 3, 2), (2.5 ** 2 / 3, 2)]
    se2 = sum(v for v, _ in runs) + np.var(big_d, ddof=1) / N
    ws = sum(v for v, _ in runs) ** 2 / sum(v * v / d for v, d in runs)
    assert ws == pytest.approx(ttest_ind([25, 26.25, 27.5], [28.75, 31.25, 33.75], equal_var=False).df)
    half = student.ppf(0.975, ws) * math.sqrt(se2)
    assert (cell["delta"], cell["lo"], cell["hi"]) == pytest.approx((5.0, 5.0 - half, 5.0 + half))
    assert cell["p"] == pytest.approx(2 * student.sf(5.0 / math.sqrt(se2), ws))
    assert cell["method"] == "runs per plan + questions" and cell["n"] == 6
    assert cell["lo"] < 0 and cell["raw_sign"] == 0  # ~3 df from two rows of 3 seeds: 5 points is not enough
    avg = rows["train_shallow-r0.5"]["cells"]["average"]["logit"]  # the family's member: one comparison
    assert avg["claim"] == "strategy" and avg["sign"] == (1 if avg["p_adj"] < 0.05 else 0)
    # the run noise alone (no per-unit records): Welch's t-test, checked against scipy's
    from raycpt.report.sweep.cells import compare

    a_runs, b_runs = [2.5, 5.0, 7.5], [0.0, 1.0, 0.5]
    wide = compare(dict(enumerate(a_runs)), dict(enumerate(b_runs)), lambda v: v, lambda a, b: None,
                   noise={"var": 6.25, "df": 4})
    ref = ttest_ind(a_runs, b_runs, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert (wide["lo"], wide["hi"]) == pytest.approx((ci.low, ci.high)) and wide["p"] == pytest.approx(ref.pvalue)
    # one run per row and no row with two: a checkpoint comparison, no strategy test
    one = compare({0: 5.0}, {0: 0.0}, lambda v: v, lambda a, b: None, noise={"var": math.nan, "df": 0})
    assert one["delta"] == 5.0 and one["p"] is None
    # the value: mean over seeds (full: 20, 21, 22 of 80 right) with its t half-width
    fv = rows["full"]["cells"]["overall"]["logit"]
    half_v = student.ppf(0.975, 2) * np.std([25.0, 26.25, 27.5], ddof=1) / math.sqrt(3)
    assert fv["value"] == pytest.approx(26.25) and fv["value_hi"] - fv["value"] == pytest.approx(half_v)
    md = summary_markdown(build_summary(trials, None, resamples=200))
    assert f"26.25 ±{half_v:.2f}" in md and "| train_shallow-r0.5 | 3 |" in md


def test_gains_carry_s_b_interval_and_realised_gain_interval():
    trials = _one_seed_trials() + [_run("train_deep-r0.5", "train_deep", 0.5, 0, {"wn": {"logit": FULL_DOM}},
                                        FULL_BLK + 0.01)]
    trace = {"split_scores": {"0.5": -0.02}, "split_intervals": {"0.5": [-0.31, 0.22]}}
    (g,) = build_summary(trials, trace, resamples=2000)["split_gains"]["wn"]
    assert (g["S_b"], g["S_b_lo"], g["S_b_hi"]) == (-0.02, -0.31, 0.22)
    assert g["shallow_vs_deep_logit_sign"] == 1 and g["shallow_vs_deep_heldout_sign"] == -1
    assert g["shallow_vs_deep_logit_lo"] < g["shallow_vs_deep_logit"] < g["shallow_vs_deep_logit_hi"]


def test_rich_tables_with_intervals_fit_80_columns():
    from rich.console import Console

    from raycpt.report.sweep.views.rich import rich_domain_general, rich_gains_table, rich_table

    trials = _one_seed_trials() + [_run("train_deep-r0.5", "train_deep", 0.5, 0, {"wn": {"logit": FULL_DOM}},
                                        FULL_BLK + 0.01)]
    s = build_summary(trials, {"split_scores": {"0.5": 0.1}, "split_intervals": {"0.5": [-0.2, 0.4]}},
                      ["wn"], ["gen_bench"], resamples=500)
    console = Console(width=80, record=True)
    console.print(rich_table("wn", as_rows(s["tables"]["wn"]), "logit"))
    console.print(rich_gains_table("wn", s["split_gains"]["wn"]))
    for item in rich_domain_general(s["domain_general"]):
        console.print(item)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "▲" in text and "[-0.20,0.40]" in text and "train_shallow-r0.5: domain gain" in text


def test_load_outcomes_reads_the_eval_result_file(tmp_path):
    import json

    path = tmp_path / "eval_result.json"
    path.write_text(json.dumps({"questions": {"wn": _records({"logit": [1, 0, 1]})},
                                "heldout_block_losses": [3.0, 3.5], "heldout_block_weights": [63, 63]}))
    t = load_outcomes({"name": "x", "eval_file": str(path)})
    assert t["outcomes"]["wn"]["logit"]["q2"] == ("humanities", True)
    assert t["heldout_blocks"] == [3.0, 3.5] and t["heldout_weights"] == [63, 63]
    assert load_outcomes({"name": "y"}) == {"name": "y"}  # an old result without a file: no intervals


def test_write_summary_writes_intervals_and_drops_per_question_data(tmp_path):
    import json

    from raycpt.report.sweep.summary import write_summary

    trials = [{k: v for k, v in t.items()} for t in _one_seed_trials()]
    s = write_summary(tmp_path, trials, None, 30, domain=["wn"], general=["gen_bench"])
    out = tmp_path / "summary"
    assert {"summary.md", "summary.json", "deltas.csv", "table_wn.csv", "scores_wn.png"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "summary.json").read_text())
    assert "outcomes" not in saved["trials"][0] and saved["domain_general"][0]["reading"] == s["domain_general"][0]["reading"]
    csv_text = (out / "deltas.csv").read_text()
    assert csv_text.splitlines()[0].startswith("task,model,strategy") and "better" in csv_text


def test_parent_run_gets_the_table_once_and_the_headline_metrics(tmp_path):
    from fake_run import sqlite_parent
    from raycpt.jobs.sweep import log_summary
    from raycpt.report.sweep.summary import write_summary

    cfg, client, exp, parent, run_at = sqlite_parent(tmp_path)
    for _ in range(2):  # a finished sweep summarised again (--resume) logs the table once
        trace = {"split_scores": {"0.5": 0.1}}
        s = write_summary(tmp_path / "run", _one_seed_trials(), trace, 30, domain=["wn"], general=["gen_bench"])
        log_summary(run_at(), s["files"], trace, s)
    import json

    from mlflow.artifacts import download_artifacts

    table = json.loads(open(download_artifacts(run_id=parent, artifact_path="summary/deltas.json",
                                               tracking_uri=cfg.uri, dst_path=str(tmp_path / "dl"))).read())
    assert len(table["data"]) == len(s["records"])  # not appended twice
    cols = table["columns"]
    row = dict(zip(cols, next(r for r in table["data"] if r[cols.index("model")] == "train_shallow-r0.5"
                              and r[cols.index("category")] == "average" and r[cols.index("mode")] == "logit"
                              and r[cols.index("task")] == "wn")))
    assert row["verdict"] == "better" and row["delta_lo"] > 0
    m = client.get_run(parent).data.metrics
    assert m["domain_delta/train_shallow-r0.5/wn/logit"] == pytest.approx(s["domain_general"][0]["domain"][0]["delta"])
    assert m["S_b/0.5"] == pytest.approx(0.1)


def test_equal_footing_full_differs_from_the_layer_plans_only_in_layers(tmp_path):
    import dataclasses

    from raycpt.config import ExperimentConfig, PlanConfig
    from raycpt.report.sweep.summary import report_options
    from raycpt.strategies import build_plan

    no_record = tmp_path / "decisions"  # no `raycpt decide` record: the horizon is not measured
    eq = build_plan(PlanConfig(name="full", full_non_layers=False), 30, tied_embeddings=True)
    sh = build_plan(PlanConfig(name="train_shallow", split=0.5), 30, tied_embeddings=True)
    assert eq.trainable_layers == tuple(range(30))
    assert (eq.train_embeddings, eq.train_final_norm, eq.train_head) == (sh.train_embeddings, sh.train_final_norm,
                                                                           sh.train_head) == (False, False, False)
    old = build_plan(PlanConfig(name="full"), 30)  # the full-parameter full, as before
    assert (old.train_embeddings, old.train_final_norm, old.train_head) == (True, True, True)
    cfg = ExperimentConfig()
    assert cfg.sweep.equal_footing and "equal footing" in report_options(cfg, no_record)["footing"]
    off = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, equal_footing=False))
    assert "NOT equal footing" in report_options(off, no_record)["footing"]
    s = build_summary(_one_seed_trials(), None, ["wn"], ["gen_bench"], resamples=200,
                      report=report_options(cfg, no_record))
    assert any(line.startswith("Plans: equal footing") for line in s["verdict"]["legend"])
    # --budget: LISA and Spectrum train non-layer parts by their authors' rule, and the legend says so
    lisa = build_plan(PlanConfig(name="lisa", lisa_layers=1, lisa_interval=2), 30, tied_embeddings=True)
    spec = build_plan(PlanConfig(name="spectrum", matrices=["0.self_attn.q_proj"]), 30, tied_embeddings=True)
    assert (lisa.train_embeddings, lisa.train_final_norm, lisa.train_head) == (True, True, True)
    assert (spec.train_embeddings, spec.train_head) == (True, True)
    assert "LISA" not in report_options(cfg, no_record)["footing"]
    budget = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, budget="auto"))
    assert "LISA's rows train the embeddings, final norm and head" in report_options(budget, no_record)["footing"]


def test_load_outcomes_finds_the_sweeps_heldout_documents(tmp_path):
    import json

    run = tmp_path / "sweep-x"
    (run / "trials" / "a" / "eval").mkdir(parents=True)
    path = run / "trials" / "a" / "eval" / "eval_result.json"
    path.write_text(json.dumps({"questions": {}, "heldout_block_losses": [3.0, 3.5, 3.2],
                                "heldout_block_weights": [63, 63, 63]}))
    (run / "heldout_docs.json").write_text(json.dumps([0, 0, 1]))
    assert load_outcomes({"name": "a", "eval_file": str(path)})["heldout_docs"] == [0, 0, 1]
    (run / "heldout_docs.json").write_text(json.dumps([0, 1]))  # not one per block: ignored
    assert "heldout_docs" not in load_outcomes({"name": "a", "eval_file": str(path)})


def test_summary_names_the_splits_s_b_cannot_tell_apart():
    trials = _one_seed_trials() + [_run("train_deep-r0.5", "train_deep", 0.5, 0, {"wn": {"logit": FULL_DOM}},
                                        FULL_BLK + 0.01)]
    trace = {"split_scores": {"0.5": 0.45}, "split_intervals": {"0.5": [0.3, 0.5]}, "split_like_best": {"0.5": True}}
    md = summary_markdown(build_summary(trials, trace, ["wn"], [], resamples=200))
    # issue 50: one split - nothing for the data to single out, so no "largest S(b)" line at all
    assert "single it out" not in md and "Largest S(b)" not in md
    assert "too few splits to test (1 split with an equal-count pair" in md



def test_trials_table_tokens_peak_memory_and_lisa_per_step_count():
    """tok/s and peak MB per row as the trials recorded them; LISA's row shows the count one step trains."""
    from rich.console import Console

    from raycpt.report.sweep.views.rich import rich_trials_table
    from raycpt.report.sweep.cells import budget_count

    trials = [dict(name="full", trainable_params=134_515_008, tokens_per_s=1234.4, peak_memory_mb=2578.4, wall_s=61),
              dict(name="lisa-g1", trainable_params=134_515_008, trainable_per_step=31_860_864, tokens_per_s=2345.6,
                   peak_memory_mb=1462.0, wall_s=40),
              dict(name="layertracer-shallow", trainable_params=31_860_864, tokens_per_s=1999.5, wall_s=1044,
                   final_loss=4.259, heldout_loss=4.310)]
    trials[0].update(final_loss=3.824, heldout_loss=3.887)
    assert [budget_count(t) for t in trials] == [134_515_008, 31_860_864, 31_860_864]
    console = Console(width=80, record=True)
    console.print(rich_trials_table(trials))
    text = console.export_text()
    assert "134.5M" in text and "31.9M†" in text and "count one step trains" in text
    assert "1,234" in text and "2,578" in text and "1,462" in text and "2,000" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert lines["layertracer-shallow"].split()[-2:] == ["-", "1044"]  # no peak recorded: a dash, never 0
    assert "+0.423" in lines["layertracer-shallow"] and "4.310" in text  # 4.310 - 3.887, every cell whole
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "shared one process" not in text  # no pids recorded: no claim about them
    for t, pid in zip(trials, (7, 7, 8)):
        t["pid"] = pid
    console = Console(width=80, record=True)
    console.print(rich_trials_table(trials))
    assert "shared one process" in console.export_text()  # full and lisa-g1 both have a peak from pid 7


def _grid_trials():
    """full, shallow and deep at 0.33 / 0.66 (one seed): each row's logit answers right on its own count."""
    rows = [("full", "full", None, 30), ("train_shallow-r0.33", "train_shallow", 0.33, 50),
            ("train_deep-r0.33", "train_deep", 0.33, 20), ("train_shallow-r0.66", "train_shallow", 0.66, 40),
            ("train_deep-r0.66", "train_deep", 0.66, 10)]
    return [_run(n, s, r, 0, {"wn": {"logit": (np.arange(N) < k).astype(int)}}, FULL_BLK + k / 1000)
            for n, s, r, k in rows]


def test_shallow_vs_deep_pairs_equal_layer_counts_on_30_and_says_so_on_28():
    """Issue 36: shallow at r against deep at 1 - r. On 30 layers 0.33 pairs with deep 0.66 (10 layers each):
    50 - 10 of 80 right = 50 points; 0.66 with deep 0.33: 40 - 20 of 80 = 25 points. On 28 layers neither pairs
    (9 against 10, 18 against 19) and the verdict says so."""
    g30 = {g["split"]: g for g in split_gains(_grid_trials(), {}, "wn", num_layers=30)}
    assert g30[0.33]["deep_name"] == "train_deep-r0.66" and g30[0.66]["deep_name"] == "train_deep-r0.33"
    assert g30[0.33]["shallow_vs_deep_logit"] == pytest.approx(100 * 40 / N)
    assert g30[0.66]["shallow_vs_deep_logit"] == pytest.approx(100 * 20 / N)
    assert g30[0.33]["shallow_vs_deep_heldout"] == pytest.approx((50 - 10) / 1000)
    g28 = {g["split"]: g for g in split_gains(_grid_trials(), {}, "wn", num_layers=28)}
    assert g28[0.33]["deep_name"] is None and g28[0.33]["shallow_vs_deep_logit"] is None
    assert "deep at r' = 1 - r = 0.67" in g28[0.33]["deep_missing"]
    md = summary_markdown(build_summary(_grid_trials(), None, ["wn"], [], resamples=200, num_layers=28))
    assert "Shallow vs deep (wn), r = 0.33: no train_deep row trains" in md


def test_one_seed_verdict_compares_checkpoints_and_prints_the_seeds_command():
    s = build_summary(_grid_trials(), None, ["wn"], [], resamples=200, report={"primary": "heldout_loss"})
    assert s["verdict"]["claim"] == "checkpoint"
    assert {c["claim"] for c in s["verdict"]["comparisons"]} == {"checkpoint"}
    md = summary_markdown(s)
    assert "One run per row" in md and "sweep.seeds=[0,1,2]" in md and "(this run of each plan)" in md
    # issue 50: two runs of full alone say nothing of the plans' own run noise - still checkpoint comparisons,
    # and the views may show no strategy marks
    from raycpt.report.sweep.seeds import strategy_claims_allowed

    extra = _run("full-s1", "full", None, 1, {"wn": {"logit": (np.arange(N) < 31).astype(int)}}, FULL_BLK + 0.031)
    extra["group"] = "full"
    s2 = build_summary(_grid_trials() + [extra], None, ["wn"], [], resamples=200, report={"primary": "heldout_loss"})
    assert s2["verdict"]["claim"] == "checkpoint" and not strategy_claims_allowed(s2)
    # a second run of every row (the floor design: every plan its own run variance): strategy tests
    seconds = []
    for t in _grid_trials():
        k = t["name"]
        seconds.append({**t, "name": f"{k}-s1", "group": k, "seed": 1,
                        "heldout_blocks": [x + 0.002 for x in t["heldout_blocks"]],
                        "heldout_loss": t["heldout_loss"] + 0.002})
    s3 = build_summary([{**t, "group": t["name"]} for t in _grid_trials()] + seconds, None, ["wn"], [], resamples=200,
                       report={"primary": "heldout_loss"})
    held = next(c for c in s3["verdict"]["comparisons"] if c["primary"] and c["a"] == "train_shallow-r0.33")
    assert held["claim"] == "strategy" and strategy_claims_allowed(s3) and "One run per row" not in summary_markdown(s3)
    assert any("per plan (Welch-Satterthwaite)" in ln for ln in s3["verdict"]["legend"])


def test_an_untuned_row_is_shown_but_never_marked_nor_best():
    """Issue 47: a row whose learning rate sat at its grid's edge after every extension keeps its numbers in the
    tables but no comparison of the verdict's family rests on it, and it cannot be best; the same trials without the
    flag give it a mark (so the test can fail)."""
    rng = np.random.default_rng(5)
    trials = []
    for sd in range(3):
        full_blk = 3.5 + 0.01 * sd + 0.05 * rng.standard_normal(48)
        sh_blk = full_blk - 0.3 + 0.01 * rng.standard_normal(48)  # 0.3 nats better in every seed: a clear mark
        trials.append(_run(f"full-s{sd}", "full", None, sd, {"wn": {"logit": FULL_DOM}}, full_blk, group="full"))
        trials.append(_run(f"train_shallow-r0.5-s{sd}", "train_shallow", 0.5, sd, {"wn": {"logit": FULL_DOM}},
                           sh_blk, group="train_shallow-r0.5"))
    report = {"primary": "heldout_loss"}
    tuned = build_summary(trials, None, ["wn"], [], resamples=200, report=report)
    row = next(r for r in tuned["tables"]["wn"] if r["name"] == "train_shallow-r0.5")
    assert row["heldout_delta"]["sign"] == -1 and tuned["verdict"]["best"]["best"] == "train_shallow-r0.5"
    marked = [dict(t, group=f"{t['group']} (untuned)", untuned=True) if t["strategy"] == "train_shallow" else t
              for t in trials]
    s = build_summary(marked, None, ["wn"], [], resamples=200, report=report)
    row = next(r for r in s["tables"]["wn"] if r["name"] == "train_shallow-r0.5 (untuned)")
    assert row["heldout_delta"]["delta"] == pytest.approx(tuned["tables"]["wn"][1]["heldout_delta"]["delta"])
    assert not row["heldout_delta"].get("sign") and (s["verdict"]["best"] or {}).get("best") is None
    assert not any("untuned" in c["a"] for c in s["verdict"]["comparisons"])
    assert any("never marked, never best" in line for line in s["verdict"]["legend"])
