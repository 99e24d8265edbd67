"""Sweep progress read from trial folders: states and lines checked against hand-written files."""

import io
import json

from raycpt.report.progress import TrialsProgress, describe, finished_line, trial_state
from raycpt.io import write_sealed_json


def _write_metrics(d, records):
    (d / "train").mkdir(parents=True, exist_ok=True)
    with open(d / "train" / "train_metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_trial_state_follows_the_files(tmp_path):
    t = tmp_path / "train_deep-r0.5"
    assert trial_state(t).phase == "pending"
    t.mkdir()
    assert trial_state(t).phase == "starting"
    _write_metrics(t, [{"event": "start", "step": 0}, {"step": 1, "loss": 4.75}, {"step": 2, "loss": 4.5}])
    # a line cut by a kill at the end is ignored
    with open(t / "train" / "train_metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    st = trial_state(t)
    assert (st.phase, st.step, st.loss) == ("training", 2, 4.5)
    assert describe(st, 8) == "train_deep-r0.5: training, step 2/8, loss 4.500"
    _write_metrics(t, [{"event": "start", "step": 0}, {"step": 8, "loss": 3.7}, {"event": "evaluate", "step": 8}])
    assert trial_state(t).phase == "evaluating"
    (t / "result.json").write_text("{}")  # no seal: not (yet) a finished trial's record
    assert trial_state(t).phase == "evaluating"
    write_sealed_json(t / "result.json", {})
    assert trial_state(t).phase == "done"


def test_trial_state_reads_only_the_tail_of_a_long_log(tmp_path):
    t = tmp_path / "full"
    _write_metrics(t, [{"event": "start", "step": 0}] + [{"step": i, "loss": 10.0 / i} for i in range(1, 3001)])
    st = trial_state(t)
    assert st.step == 3000 and abs(st.loss - 10.0 / 3000) < 1e-12


def test_finished_line_has_losses_averages_and_time():
    res = {"name": "full", "losses": [4.75, 4.1, 3.485], "wall_s": 59.4,
           "scores": {"wn/average/logit": 21.875, "wn/average/generate": 0.0, "wn/stem/logit": 25.0}}
    assert finished_line(res) == "full loss 4.750->3.485 wn G/L 0.00/21.88 59s"
    assert finished_line({**res, "heldout_loss": 3.5704}) == "full loss 4.750->3.485 held-out 3.570 wn G/L 0.00/21.88 59s"


def test_progress_announces_each_finished_trial_once(tmp_path):
    from rich.console import Console

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    write_sealed_json(tmp_path / "a" / "result.json", {"name": "a", "losses": [2.0, 1.0], "wall_s": 3})
    buf = io.StringIO()
    with TrialsProgress(tmp_path, ["a", "b"], 8, Console(file=buf, width=200), interval=0.01):
        pass  # "a" finished before: counted, not announced again (a resumed sweep)
    assert "done a" not in buf.getvalue()
    buf = io.StringIO()
    with TrialsProgress(tmp_path, ["a", "b"], 8, Console(file=buf, width=200), interval=0.01):
        write_sealed_json(tmp_path / "b" / "result.json", {"name": "b", "losses": [3.0, 2.5], "wall_s": 7})
    out = buf.getvalue()
    assert out.count("done b loss 3.000->2.500 7s") == 1


def test_step_progress_reads_only_new_whole_lines(tmp_path, monkeypatch):
    from raycpt.report import progress as prog

    path = tmp_path / "train_metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 9.0}) + "\n")  # an earlier attempt: skipped
    seen = []

    class Bar:
        def update(self, task, completed, info):
            seen.append((completed, info))

    sp = prog.StepProgress(path, total=4, start=1, enabled=False)
    sp._before()
    with open(path, "a") as f:
        f.write(json.dumps({"event": "resume", "step": 1}) + "\n" + json.dumps({"step": 2, "loss": 3.25,
                                                                                  "tokens_per_s": 100}) + "\n")
        f.write('{"step": 3, "lo')  # cut mid-line: waits for the next poll
    sp._poll(Bar(), 0)
    assert seen == [(1, "resumed at step 1"), (2, "loss 3.2500  100 tok/s")]
    with open(path, "a") as f:
        f.write('ss": 3.0}\n')
    sp._poll(Bar(), 0)
    assert seen[-1] == (3, "loss 3.0000  0 tok/s")


# ------------------------------------------------------------------------------------------ issue 48 item 7
def test_every_phase_of_a_trained_row_names_itself(tmp_path):
    """starting -> training -> checkpointing -> training -> evaluating, each line naming its phase; the evaluating
    line says what the evaluation covers (the phase note the trial body wrote before training)."""
    from raycpt.progress import write_phase

    t = tmp_path / "train_shallow-r0.5"
    t.mkdir()
    starting = "train_shallow-r0.5: starting (loading the model, starting the training workers)"
    assert describe(trial_state(t), 8) == starting
    write_phase(t, "starting", evaluation="12 questions, 3 held-out documents")
    assert describe(trial_state(t), 8) == starting
    log = [{"event": "start", "step": 0}, {"step": 1, "loss": 4.25}]
    _write_metrics(t, log)
    assert describe(trial_state(t), 8) == "train_shallow-r0.5: training, step 1/8, loss 4.250"
    log.append({"timing": "checkpoint_begin", "step": 4})
    _write_metrics(t, log)
    assert describe(trial_state(t), 8) == "train_shallow-r0.5: checkpointing, step 4/8"
    log += [{"timing": "checkpoint", "step": 4, "seconds": 0.5}, {"step": 5, "loss": 3.5}]
    _write_metrics(t, log)
    assert describe(trial_state(t), 8) == "train_shallow-r0.5: training, step 5/8, loss 3.500"
    log += [{"step": 8, "loss": 3.0}, {"timing": "checkpoint_begin", "step": 8}, {"timing": "checkpoint", "step": 8},
            {"event": "finished", "step": 8}, {"event": "evaluate", "step": 8}]
    _write_metrics(t, log)
    assert describe(trial_state(t), 8) == "train_shallow-r0.5: evaluating (12 questions, 3 held-out documents)"


def test_the_base_row_line_says_it_evaluates_and_how_much(tmp_path, monkeypatch):
    """While the base row evaluates, its line is "base row: evaluating (N questions, M held-out documents, ...)":
    N = the question file's lines cut at eval.limit, M = distinct documents of the held-out blocks, the general probe
    without a documents file counted in blocks. Read at the moment the evaluation is called."""
    import pytest

    from types import SimpleNamespace

    import raycpt.jobs.base_row as br
    from fake_run import FakeRun
    from raycpt.config import load_config
    from raycpt.runs.location import locate

    qfile = tmp_path / "q.jsonl"
    qfile.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Which is {i}?", "A": "cat", "B": "dog",
                                         "C": "eel", "D": "fox", "answer": "A", "category": "STEM"}) + "\n"
                             for i in range(9)))
    run_dir, model = tmp_path / "sweep", tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    heldout_docs = [0, 0, 1, 2, 2, 2, 5]
    (run_dir / "trials" / "base").mkdir(parents=True)
    (run_dir / "heldout_blocks.json").write_text(json.dumps([[1, 2]] * len(heldout_docs)))
    (run_dir / "heldout_docs.json").write_text(json.dumps(heldout_docs))
    (run_dir / "general_blocks.json").write_text(json.dumps([[3]] * 4))
    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}", f"eval.tasks=[{qfile}]", "eval.limit=6"])
    where = locate(cfg.tracking, check=False)  # the sweep's location, carried on its run (the base row's cache)
    trial = SimpleNamespace(cfg=cfg, dir=run_dir / "trials" / "base", run=FakeRun(where), threads=None, elapsed=0.0,
                            shared={"model_path": str(model), "heldout_path": str(run_dir / "heldout_blocks.json"),
                                    "general_path": str(run_dir / "general_blocks.json")})
    spec = SimpleNamespace(name=br.BASE, log_params=lambda *a: None)  # the sweep's TrialSpec, as base_result uses it
    seen = []

    class Stop(Exception):
        pass

    def evaluating(*a, **k):
        seen.append(describe(trial_state(trial.dir), 8))
        raise Stop

    monkeypatch.setattr(br, "final_evaluation", evaluating)
    with pytest.raises(Stop):
        br.base_result(trial, spec)
    n_questions = min(9, 6)
    n_docs = len(set(heldout_docs))
    assert seen == [f"base row: evaluating ({n_questions} questions, {n_docs} held-out documents, 4 general blocks)"]


def test_evaluation_words_name_a_benchmark_they_cannot_count(tmp_path):
    from raycpt.config import load_config
    from raycpt.evaluate import WORDNET_MC_FILE
    from raycpt.jobs.base_row import evaluation_words

    lines = [ln for ln in WORDNET_MC_FILE.read_text(encoding="utf-8").splitlines() if ln.strip()]
    cfg = load_config(None, ["eval.tasks=[wordnet_mc,mmlu]", "eval.limit=null"])
    assert evaluation_words(cfg, {}) == f"{len(lines)} questions and the questions of mmlu"


def test_train_bar_says_starting_checkpointing_and_evaluating(tmp_path):
    from raycpt.report import progress as prog

    path = tmp_path / "train_metrics.jsonl"
    seen = []

    class Bar:
        def add_task(self, name, total, completed, info):
            seen.append(info)

        def update(self, task, completed=None, info=None):
            seen.append(info)

    sp = prog.StepProgress(path, total=2, start=0, enabled=False)
    sp._before()
    sp._start(Bar())
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"event": "start", "step": 0}, {"step": 2, "loss": 2.5, "tokens_per_s": 10},
        {"timing": "checkpoint_begin", "step": 2}, {"timing": "checkpoint", "step": 2},
        {"event": "finished", "step": 2}, {"event": "evaluate", "step": 2})))
    sp._poll(Bar(), 0)
    assert seen == ["starting: loading the model, starting the training workers", "loss 2.5000  10 tok/s",
                    "checkpointing, step 2", "evaluating the final weights"]
