"""Issue 48 item 8: every PNG raycpt writes, drawn from fabricated inputs (tests/figure_inputs.py) and read back as
the matplotlib Figure it was saved from: axis labels carry their units, legends name the rows and what the whiskers
are, annotations do not overlap. The expected names come from the inputs (row names, strategies, seeds, layers),
never from the plotting code."""

import re
from pathlib import Path

import numpy as np
import pytest

import figure_inputs as F

TMP = re.compile(r"^\.(?P<stem>.+)\.[0-9a-f]{8}\.tmp(?P<suffix>\.\w+)$")  # report.figures.save_figure's aside name


@pytest.fixture
def figures(monkeypatch):
    """{file name: Figure} of every figure saved while the test runs (the file name it was renamed to)."""
    from matplotlib.figure import Figure

    seen = {}
    real = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        real(self, fname, *args, **kwargs)
        name = Path(fname).name
        m = TMP.match(name)
        seen[m["stem"] + m["suffix"] if m else name] = self

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def _legend(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg is not None else []


def _annotations(ax) -> list[str]:
    return [c.get_text() for c in ax.texts]


def _overlaps(fig, texts) -> list[tuple[str, str]]:
    """Pairs of the texts whose drawn boxes intersect."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # a saved figure is closed: draw it again on a canvas of its own
    canvas.draw()
    r = canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in texts if t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def _rows(trials) -> list[str]:
    return list(dict.fromkeys(t.get("group") or t["name"] for t in trials))


def test_sweep_bars_name_rows_modes_units_and_the_interval(tmp_path, figures):
    paths = F.draw_sweep(tmp_path)
    assert {p.name for p in paths} == {"scores_wn.png", "loss_curves.png", "heldout_loss.png", "tradeoff.png"}
    ax = figures["scores_wn.png"].axes[0]
    trials = F.sweep_trials()
    assert [t.get_text() for t in ax.get_xticklabels()] == _rows(trials) == list(F.SWEEP_ROWS)
    assert _overlaps(figures["scores_wn.png"], ax.get_xticklabels()) == []
    assert "(%)" in ax.get_ylabel()
    legend = _legend(ax)
    modes = {k.split("/")[2] for t in trials for k in t["scores"] if k.split("/")[1] == "average"}
    assert modes == {"cloze", "cloze.prob"}
    for m in modes:  # each mode named once with its unit
        assert sum(e.startswith(f"{m}: ") and e.endswith("(%)") for e in legend) == 1, legend
    assert "cloze: accuracy (%)" in legend and any("probability" in e for e in legend if e.startswith("cloze.prob"))
    assert "whiskers: 95% interval over seeds" in legend  # the trained rows ran at two seeds
    assert {f"full, {m}" for m in modes} <= set(legend)


def test_sweep_loss_curves_and_heldout_name_each_run_once_in_nats_per_token(tmp_path, figures):
    F.draw_sweep(tmp_path)
    trials = F.sweep_trials()
    ax = figures["loss_curves.png"].axes[0]
    assert _legend(ax) == [t["name"] for t in trials if t.get("losses")]
    assert "nats per token" in ax.get_ylabel() and ax.get_xlabel() == "optimizer step"
    fig = figures["heldout_loss.png"]
    ax = fig.axes[0]
    assert "nats per token" in ax.get_ylabel() and "millions" in ax.get_xlabel()
    strategies = {t["strategy"] for t in trials if t.get("trainable_params")}
    assert {e.split(" (")[0] for e in _legend(ax)} == strategies == {"full", "train_shallow", "train_deep"}
    trained_rows = [r for r in _rows(trials) if r != "base"]
    assert len(_annotations(ax)) == len(trained_rows)  # one name per row, not one per seed
    assert _overlaps(fig, ax.texts) == []


def test_tradeoff_axes_in_nats_per_token_and_legend_names_strategies_front_and_intervals(tmp_path, figures):
    F.draw_sweep(tmp_path)
    fig = figures["tradeoff.png"]
    ax = fig.axes[0]
    assert "held-out loss" in ax.get_xlabel() and ax.get_xlabel().endswith("(nats per token)")
    assert "general loss" in ax.get_ylabel() and ax.get_ylabel().endswith("(nats per token)")
    legend = _legend(ax)
    trials = F.sweep_trials()
    for s in {t["strategy"] for t in trials} - {"base"}:
        assert s in legend, (s, legend)
    assert any(e.startswith("base") for e in legend) and "on the Pareto front" in legend
    # two seeds per trained row, per-document blocks: the interval is over both
    assert "whiskers: 95% interval over seeds and documents" in legend
    assert sorted(_annotations(ax)) == sorted(_rows(trials))
    assert "base" in ax.get_title() and "forgetting" in ax.get_title()
    assert _overlaps(fig, ax.texts) == []


def test_prob_axes_are_in_percentage_points():
    from raycpt.report.sweep.views.plots import axis_words

    words = axis_words({"mode": "cloze.prob", "label": "wn cloze P(gold)", "axis": "gain"})
    assert words.endswith("(percentage points)") and "row − base" in words


def test_decision_figure_units_seeds_and_arms(tmp_path, figures):
    F.draw_decide(tmp_path)
    left, right = figures["decision.png"].axes
    assert left.get_xlabel() == "held-out loss after 8 steps (nats per token)"
    assert left.get_ylabel() == "held-out loss after 64 steps (nats per token)"
    assert _legend(left) == [f"arm: mean over {len(F.DECIDE_SEEDS)} seeds, whiskers ± 1 SD over seeds"]
    assert sorted(a.split(" ")[0] for a in _annotations(left)) == sorted(F.ARMS)
    assert "perfect calibration" in _legend(right) and "8-step" in right.get_xlabel()
    assert "64-step" in right.get_ylabel()


def test_compare_figures_label_depth_units_and_models(tmp_path, figures):
    F.draw_compare(tmp_path)
    rows = F.compare_rows()
    per_model = {k[:-5] for k in rows[0] if k.endswith("_base")}
    single = {k for k in rows[0] if k != "layer" and not k.endswith(("_base", "_tuned"))}
    for key in per_model | single:
        ax = figures[f"{key}.png"].axes[0]
        assert "0-based" in ax.get_xlabel() and "(" in ax.get_ylabel(), key
        assert _legend(ax) == (["base", "tuned"] if key in per_model else ["base vs tuned"]), key
    grid = figures["compare_grid.png"]
    assert sum(bool(a.get_xlabel()) for a in grid.axes) == len(per_model | single)
    ax = figures["swap.png"].axes[0]
    assert ax.get_ylabel() == f"{F.SWAPS_KEY} (%)" and "0-based" in ax.get_xlabel()
    blocks = sorted({s["block"] for s in F.swaps()})
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"{min(s['layers'])}-{max(s['layers'])}" for b in blocks for s in F.swaps()[2 * b:2 * b + 1]]
    assert "base, no swap (40.000)" in _legend(ax) and "tuned, no swap (46.000)" in _legend(ax)
    ax = figures["contribution.png"].axes[0]
    assert "beyond full training (> 1)" in _legend(ax)  # layer 3's contribution is 1.2
    assert sorted(int(t) for t in _annotations(ax)) == list(range(F.NUM_LAYERS))
    ax = figures["l2_change.png"].axes[0]
    assert "Frobenius" in ax.get_ylabel() and len(_legend(ax)) == 2


def test_trace_select_hybrid_and_training_figures_name_layers_0_based(tmp_path, figures):
    F.draw_trace(tmp_path)
    F.draw_select(tmp_path)
    F.draw_hybrid(tmp_path)
    F.draw_train(tmp_path)
    for name in ("heatmap_ratio.png", "heatmap_djs.png"):
        ax, bar = figures[name].axes
        assert [t.get_text().split(": ")[1] for t in ax.get_yticklabels()] == F.TRACE_GROUPS
        assert "0-based" in ax.get_xlabel() and "unitless" in bar.get_ylabel()
    ax = figures["profile.png"].axes[0]
    assert "0-based" in ax.get_xlabel() and any(e.startswith("requested split") for e in _legend(ax))
    ax = figures["scores.png"].axes[0]
    assert "0-based" in ax.get_xlabel() and _legend(ax) == ["top 3: trained", "other layers"]
    fig = figures["hybrid_profiles.png"]
    assert [a.get_ylabel().split("\n")[0] for a in fig.axes] == list(F.HYBRID_BUILDS)
    assert "0-based" in fig.axes[-1].get_xlabel()
    ax = figures["loss_curve.png"].axes[0]
    assert "nats per token" in ax.get_ylabel()
    drift = figures["drift.png"]
    layers = sorted({int(k.rsplit("L", 1)[1]) for h in F.drift_history() for k in h if k.startswith("drift.dW")})
    for ax in drift.axes[:2]:
        assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in layers]
        assert "0-based" in ax.get_ylabel()
    assert {a.get_ylabel() for a in drift.axes[2:]} == {"Frobenius norm (weight units)",
                                                        "1 - linear CKA (0 = unchanged)"}


def test_drift_rows_follow_the_layer_index_past_ten(tmp_path, figures):
    """Unpadded names sort 10 before 2 as text; the heatmap's rows follow the index."""
    from raycpt.report.train import plot_drift

    hist = [{"step": s, **{f"drift.dW.L{i}": float(i) for i in range(12)},
             **{f"drift.cka.L{i}": 1.0 for i in range(12)}} for s in (0, 1)]
    plot_drift(hist, tmp_path / "drift.png")
    ax = figures["drift.png"].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(12)]
    img = ax.get_images()[0].get_array()
    assert np.allclose(np.asarray(img)[:, 0], np.arange(12.0))  # row i holds layer i's value (i here)
