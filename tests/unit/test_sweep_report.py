"""Sweep summary arithmetic, checked against hand-computed deltas."""

import pytest

from raycpt.report.sweep import parse_cells, split_gains, summary_table, table_markdown


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
    md = table_markdown("wn", summary_table(TRIALS)["wn"])
    assert md.count("\n| train_") == 2
    assert "45.00*" in md and "(+5.00" in md


def test_markdown_carries_final_loss_and_terminal_table_fits_80_columns():
    from rich.console import Console

    from raycpt.report.sweep import rich_table

    trials = [dict(t, final_loss=loss) for t, loss in zip(TRIALS, (3.4851, 3.7492, 3.7603))]
    rows = summary_table(trials)["wn"]
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

    from raycpt.report.sweep import rich_gains_table, rich_trials_table

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
