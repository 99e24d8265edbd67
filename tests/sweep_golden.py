"""Golden sweep summaries (issue 46 item 3): fabricated sweeps whose summary files and terminal text were written once
by the code before the typed summary (commit 58e40b8) into ``tests/data/sweep_golden/<scenario>/``; the golden test
(``tests/unit/test_sweep_golden.py``) writes them again with today's code and compares byte for byte.

Regenerate only on purpose (a change meant to alter the output), with the code that is to be the reference on the
path: ``PYTHONPATH=<checkout> python tests/sweep_golden.py`` (these were written from a checkout of 58e40b8).

Three sweeps, each self-contained here (fabricated with fixed seeds, so the bytes do not move):

* ``grid``: base, full, train_shallow and train_deep at three splits, a domain and a general task, one run each,
  a trace with S(b) and its intervals - the layout ``runs show`` was made for;
* ``probe``: base, full and one shallow row with continuous cloze scores and the general probe's loss, the
  held-out loss declared primary - gain and forgetting against base;
* ``seeds``: three runs of every row (no per-question records, held-out blocks only): strategy claims, a best row.
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).parent / "data" / "sweep_golden"
FILES = ("summary.json", "summary.md", "deltas.csv", "table_wn.csv")
TERMINAL = "terminal.txt"
WIDTH = 100  # the console width the terminal text is drawn at
CATS = ["STEM", "Social Science", "Humanities", "Other"]
KEYS = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}
N = 80


def records(correct: dict, prefix: str) -> list[dict]:
    n = len(next(iter(correct.values())))
    return [{"id": f"{prefix}{i}", "category": CATS[i % 4], "question": "?", "gold": "A",
             **{m: {"prediction": "A", "correct": bool(c[i])} for m, c in correct.items()}} for i in range(n)]


def scores(task: str, correct: dict) -> dict:
    out = {}
    for m, c in correct.items():
        c = np.asarray(c, dtype=float)
        cats = np.arange(len(c)) % 4
        per = {KEYS[CATS[k]]: 100 * c[cats == k].mean() for k in range(4)}
        out.update({f"{task}/{k}/{m}": float(v) for k, v in per.items()})
        out[f"{task}/average/{m}"] = float(np.mean(list(per.values())))
        out[f"{task}/overall/{m}"] = float(100 * c.mean())
    return out


def trial(name, strategy, split, seed, tasks: dict, blocks, group=None, final_loss=None) -> dict:
    from raycpt.report.sweep.outcomes import question_outcomes

    sc, qs = {}, {}
    for task, correct in tasks.items():
        sc.update(scores(task, correct))
        qs[task] = records(correct, task[:2])
    t = {"name": name, "group": group or name, "strategy": strategy, "split": split, "b": None, "seed": seed,
         "scores": sc, "outcomes": question_outcomes(qs), "heldout_blocks": [float(x) for x in blocks],
         "heldout_weights": [63] * len(blocks), "heldout_loss": float(np.mean(blocks))}
    if final_loss is not None:
        t["final_loss"] = final_loss
    return t


def grid():
    rng = np.random.default_rng(11)

    def answers(p):
        return (rng.random(N) < p).astype(int)

    def blocks(mean):
        return mean + 0.05 * rng.standard_normal(48)

    out = [trial("base", "base", None, 0, {"wn": {"logit": answers(0.25), "cloze": answers(0.25)},
                                           "gen_bench": {"logit": answers(0.5)}}, blocks(3.8)),
           trial("full", "full", None, 0, {"wn": {"logit": answers(0.45), "cloze": answers(0.4)},
                                           "gen_bench": {"logit": answers(0.45)}}, blocks(3.4), final_loss=2.5)]
    for strategy in ("train_shallow", "train_deep"):
        for r in (0.33, 0.5, 0.66):
            out.append(trial(f"{strategy}-r{r}", strategy, r, 0, {"wn": {"logit": answers(0.4), "cloze": answers(0.35)},
                                                                  "gen_bench": {"logit": answers(0.48)}}, blocks(3.5),
                             final_loss=2.6))
    trace = {"split_scores": {"0.33": 0.1, "0.5": 0.2, "0.66": 0.3},
             "split_intervals": {"0.33": [0.05, 0.15], "0.5": [0.12, 0.28], "0.66": [0.2, 0.4]},
             "split_like_best": {"0.5": True, "0.66": True}, "recommended_split": 0.4}
    return out, trace, {"domain": ["wn"], "general": ["gen_bench"], "report": None}


def probe():
    from raycpt.report.sweep.outcomes import question_outcomes

    rng = np.random.default_rng(0)
    q = 40
    base_p = 30 + 20 * rng.random(q)
    probs = {"base": base_p, "full": base_p + 6 + 2 * rng.standard_normal(q),
             "train_shallow-r0.5": base_p + 0.3 * rng.standard_normal(q)}
    base_h = 3.8 + 0.2 * rng.standard_normal(30)
    held = {"base": base_h, "full": base_h - 0.3 + 0.02 * rng.standard_normal(30),
            "train_shallow-r0.5": base_h - 0.1 + 0.02 * rng.standard_normal(30)}
    base_g = 3.0 + 0.2 * rng.standard_normal(25)
    gen = {"base": base_g, "full": base_g + 0.05 + 0.01 * rng.standard_normal(25),
           "train_shallow-r0.5": base_g + 0.001 * rng.standard_normal(25)}
    out = []
    for name, strategy, split in (("base", "base", None), ("full", "full", None),
                                  ("train_shallow-r0.5", "train_shallow", 0.5)):
        p = probs[name]
        qs = [{"id": f"q{i}", "category": CATS[i % 4], "question": "?", "gold": "A",
               "cloze": {"prediction": "A", "correct": bool(x > 50), "prob": float(x)}} for i, x in enumerate(p)]
        per = {c: float(np.mean([x for i, x in enumerate(p) if i % 4 == k]))
               for k, c in enumerate(["stem", "social_science", "humanities", "other"])}
        sc = {f"wn/{c}/cloze.prob": v for c, v in per.items()}
        sc["wn/average/cloze.prob"] = float(np.mean(list(per.values())))
        sc["wn/average/cloze"] = float(100.0 * np.mean([x > 50 for x in p]))
        out.append({"name": name, "group": name, "strategy": strategy, "split": split, "b": None, "seed": 0,
                    "scores": sc, "outcomes": question_outcomes({"wn": qs}),
                    "heldout_blocks": [float(x) for x in held[name]], "heldout_weights": [63] * 30,
                    "heldout_loss": float(np.mean(held[name])), "general_blocks": [float(x) for x in gen[name]],
                    "general_weights": [63] * 25, "general_loss": float(np.mean(gen[name]))})
    return out, {"split_scores": {"0.5": 0.25}}, {"domain": ["wn"], "general": [],
                                                   "report": {"primary": "heldout_loss", "adjust": "holm",
                                                              "alpha": 0.05}}


def seeds():
    rng = np.random.default_rng(48)
    blocks = 3.5 + 0.3 * rng.standard_normal(40)
    rows = {"full": ("full", None, -0.10), "train_shallow-r0.33": ("train_shallow", 0.33, -0.15),
            "train_deep-r0.33": ("train_deep", 0.33, -0.05), "train_shallow-r0.66": ("train_shallow", 0.66, -0.12)}
    noise = {name: 0.004 * rng.standard_normal(40) for name in rows}
    out = []
    for sd in range(3):
        for name, (strategy, split, gain) in rows.items():
            b = blocks + gain + noise[name] + 0.003 * sd
            out.append({"name": f"{name}-s{sd}", "group": name, "strategy": strategy, "split": split, "b": None,
                        "seed": sd, "scores": {"wn/average/logit": 50.0 + sd + (5 if "shallow" in name else 0)},
                        "heldout_blocks": [float(x) for x in b], "heldout_weights": [63] * 40,
                        "heldout_loss": float(np.mean(b))})
    return out, {"split_scores": {"0.33": 0.4, "0.66": 0.1}, "recommended_split": 0.3}, {
        "domain": ["wn"], "general": [], "report": {"primary": "heldout_loss", "adjust": "holm", "alpha": 0.05}}


SCENARIOS = {"grid": grid, "probe": probe, "seeds": seeds}


@contextmanager
def inside(folder: Path):
    """The working folder set to ``folder`` (``runs show`` prints the run folder's path: ``RUN`` relative here)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def terminal_text(summary: dict, run_dir: Path) -> str:
    """What a person reads in the terminal: the end of ``raycpt sweep`` (verdict lines and the compact table, as
    :func:`raycpt.report.render.render_sweep` prints them) and ``raycpt runs show RUN --section all`` / the overview
    (as :func:`raycpt.report.render.render_runs_show` prints them), from the summary read back from summary.json."""
    import io
    import json

    from rich.console import Console

    from raycpt.report.sweep.outcomes import load_outcomes
    from raycpt.report.sweep.views.runs_show import PathLine, show_items
    from raycpt.report.sweep.views.terminal import compact_table, compact_verdict

    console = Console(width=WIDTH, record=True, color_system="standard", force_terminal=True, file=io.StringIO())
    for line in compact_verdict(summary):
        console.print(line, markup=False, highlight=False)
    console.print(compact_table(summary))
    saved = json.loads((run_dir / "summary" / "summary.json").read_text(encoding="utf-8"))
    trials = [load_outcomes(t) for t in saved.get("trials", [])]
    for section in ("overview", "all"):
        console.print(f"=== runs show --section {section}", markup=False, highlight=False)
        for item in show_items(section, saved, trials, run_dir):
            if isinstance(item, str):
                console.print(item, markup=False, highlight=False, soft_wrap=isinstance(item, PathLine))
            else:
                console.print(item)
    return console.export_text(styles=True)  # the colours and bold too (ANSI codes)


def write_scenario(name: str, where: Path) -> dict[str, str]:
    """Scenario ``name`` summarised by the code imported now into ``where/RUN``: ``{file name: text}`` of
    :data:`FILES` and :data:`TERMINAL`."""
    from raycpt.report.sweep.summary import write_summary

    trials, trace, opts = SCENARIOS[name]()
    with inside(where):
        run_dir = Path("RUN")
        summary = write_summary(run_dir, trials, trace, 30, domain=opts["domain"], general=opts["general"],
                                report=opts["report"])
        out = {f: (run_dir / "summary" / f).read_text(encoding="utf-8") for f in FILES}
        out[TERMINAL] = terminal_text(summary, run_dir)
    return out


def main() -> None:
    import tempfile

    for name in SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            texts = write_scenario(name, Path(tmp))
        folder = GOLDEN / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for f, text in texts.items():
            (folder / f).write_text(text, encoding="utf-8")
        print(name, {f: len(t) for f, t in texts.items()}, file=sys.stderr)


if __name__ == "__main__":
    main()
