"""Issue 48: ``raycpt runs show RUN_DIR`` printed a sweep's whole summary (~277 lines). Now the default is an overview
of at most ~40 lines that ends with the sections the sweep has and how to print them; ``--section NAME`` prints one,
``--section all`` every one, and each section alone is exactly its part of ``all``. Checked through the CLI on a sweep
folder written by the summary writer (base, full, shallow and deep at three splits, a domain and a general task)."""

from __future__ import annotations

import numpy as np
import pytest

from raycpt.entry import main
from raycpt.report.sweep.summary import write_summary
from test_sweep_report import _run

SECTIONS = ["tables", "gains", "domain", "base", "verdict", "runs"]  # the order --section all prints them in
SPLITS = (0.33, 0.5, 0.66)


def _trials() -> list[dict]:
    rng = np.random.default_rng(11)
    n = 80

    def answers(p):
        return (rng.random(n) < p).astype(int)

    def blocks(mean):
        return mean + 0.05 * rng.standard_normal(48)

    out = [_run("base", "base", None, 0, {"wn": {"logit": answers(0.25), "cloze": answers(0.25)},
                                          "gen_bench": {"logit": answers(0.5)}}, blocks(3.8)),
           _run("full", "full", None, 0, {"wn": {"logit": answers(0.45), "cloze": answers(0.4)},
                                          "gen_bench": {"logit": answers(0.45)}}, blocks(3.4))]
    for strategy in ("train_shallow", "train_deep"):
        for r in SPLITS:
            out.append(_run(f"{strategy}-r{r}", strategy, r, 0, {"wn": {"logit": answers(0.4), "cloze": answers(0.35)},
                                                                 "gen_bench": {"logit": answers(0.48)}}, blocks(3.5)))
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep-show")
    trace = {"split_scores": {str(r): 0.1 * (i + 1) for i, r in enumerate(SPLITS)}, "recommended_split": 0.5}
    write_summary(folder, _trials(), trace, 30, domain=["wn"], general=["gen_bench"])
    return folder


def show(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["runs", "show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_default_is_a_short_overview_naming_the_sections(sweep_dir, capsys):
    code, out, err = show(capsys, str(sweep_dir))
    assert code == 0 and err == "", err
    lines = out.splitlines()
    assert len(lines) <= 45, f"{len(lines)} lines:\n{out}"
    assert lines[-1] == (f"Sections: {', '.join(SECTIONS)}. Print one: raycpt runs show {sweep_dir} --section NAME; "
                         "all of them: --section all")
    for row in ["base", "full"] + [f"{s}-r{r}" for s in ("train_shallow", "train_deep") for r in SPLITS]:
        assert any(line.split()[:1] == [row] for line in lines), row  # the compact table: one row per run
    assert "trace: recommended split r = 0.5" in out


def test_each_section_is_its_part_of_all(sweep_dir, capsys):
    code, everything, err = show(capsys, str(sweep_dir), "--section", "all")
    assert code == 0 and err == ""
    overview = show(capsys, str(sweep_dir))[1]
    assert len(everything.splitlines()) > 3 * len(overview.splitlines())  # what the overview leaves out is here
    parts = []
    for name in SECTIONS:
        code, text, err = show(capsys, str(sweep_dir), "--section", name)
        assert code == 0 and err == "" and text.strip(), name
        assert text.splitlines()[0].startswith(f"{name}: "), (name, text.splitlines()[0])  # its heading
        parts.append(text)
    assert "".join(parts) == everything  # in order, nothing left out, nothing twice
    starts = [everything.index(p) for p in parts]
    assert starts == sorted(starts) and starts[0] == 0
    # what the whole summary printed before sections still is in all, each in its section
    for name, needle in (("tables", "wn, logit mode: accuracy"), ("tables", "gen_bench, logit mode: accuracy"),
                         ("gains", "S(b) vs realised gain"), ("domain", "domain vs general"),
                         ("base", "gain / forgetting vs base"), ("verdict", "Verdict"),
                         ("runs", "runs: losses"), ("runs", "trace: recommended split r = 0.5"),
                         ("runs", f"summary: {sweep_dir / 'summary'} (")):
        assert needle in parts[SECTIONS.index(name)], (name, needle)
    assert "[exact McNemar + score interval]" in parts[SECTIONS.index("verdict")]  # no longer eaten as markup


def test_a_name_that_is_no_section_is_one_line(sweep_dir, capsys):
    code, out, err = show(capsys, str(sweep_dir), "--section", "tabels")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line == "error: runs show: --section 'tabels' is not a section; give overview, " + ", ".join(SECTIONS) + \
        " or all"


def test_a_section_this_sweep_lacks_is_one_line(tmp_path, capsys):
    trials = [t for t in _trials() if t["strategy"] != "base"]  # no base row: no gain and forgetting
    write_summary(tmp_path, trials, None, 30, domain=["wn"], general=["gen_bench"])
    capsys.readouterr()  # (the plots' warnings)
    code, out, err = show(capsys, str(tmp_path), "--section", "base")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error: runs show: this sweep has no base section (") and "its sections: tables, " in line
    code, out, _ = show(capsys, str(tmp_path))
    assert code == 0 and "Sections: tables, gains, domain, verdict, runs." in out


def test_the_help_names_every_section(capsys):
    assert main(["runs", "show", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--section" in text
    for name in ["overview"] + SECTIONS + ["all"]:
        assert name in text, name


def test_a_sweep_of_many_rows_keeps_the_overview_short(tmp_path, capsys):
    """Shallow and deep at nine splits (20 rows): the overview's table stops at 16 rows and says how many more
    there are and where they are; --section runs has every one."""
    rng = np.random.default_rng(5)
    splits = [round(0.1 * k, 1) for k in range(1, 10)]
    trials = [t for t in _trials() if t["strategy"] in ("base", "full")]
    for strategy in ("train_shallow", "train_deep"):
        for r in splits:
            trials.append(_run(f"{strategy}-r{r}", strategy, r, 0, {"wn": {"logit": (rng.random(80) < 0.4).astype(int)}},
                               3.5 + 0.05 * rng.standard_normal(48)))
    write_summary(tmp_path, trials, None, 30, domain=["wn"], general=[])
    capsys.readouterr()
    code, out, _ = show(capsys, str(tmp_path))
    assert code == 0 and len(out.splitlines()) <= 45, out
    shown = [t["name"] for t in trials if any(line.split()[:1] == [t["name"]] for line in out.splitlines())]
    assert len(shown) == 16 and f"... {len(trials) - 16} more rows: --section base" in out
    code, runs, _ = show(capsys, str(tmp_path), "--section", "runs")
    assert all(any(line.split()[:1] == [t["name"]] for line in runs.splitlines()) for t in trials)
