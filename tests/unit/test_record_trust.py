"""Issue 51, rule 2: the record is checked before it is trusted. Every line of a run folder's ``records.jsonl`` carries
its checksum; ``runs sync``, ``runs show`` and ``--resume`` read the folder through one reader
(:func:`raycpt.runs.trust.trusted_records`) that reports a damaged or missing record file in one line (which file,
which line, what was kept) and exit 2, unless ``--accept-damage``. Real SQLite MLflow stores; the CLI in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raycpt.config import load_config

POINTS = [("loss", 1, 4.25), ("loss", 2, 3.5), ("loss", 3, 2.75)]


def _cfg(root: Path):
    return load_config(None, [f"tracking.run_root={root}", "name=rt"])


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    """A finished train run folder with one unit: the unit's three loss points one record each."""
    from raycpt.runs.run import command_run

    with command_run(_cfg(tmp_path / "runs"), "train") as run:
        unit_dir = run.dir / "trials" / "u"
        with run.child("u", unit_dir, meta_file="trial.json") as unit:
            for key, step, value in POINTS:
                unit.log_points([(key, step, value)])
    return run.dir, unit_dir


def _err_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def _store_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raycpt")
    return [] if exp is None else client.search_runs([exp.experiment_id])


# ------------------------------------------------------------------------------------- the line reader
def test_each_line_is_checked_and_a_legacy_line_still_reads(tmp_path):
    from raycpt.runs.records import RECORDS, append_record, check_records

    append_record(tmp_path, {"params": {"a": "1"}})
    append_record(tmp_path, {"metrics": {"loss": 2.5}, "step": 4})
    path = tmp_path / RECORDS
    lines = path.read_text().splitlines()
    assert all(json.loads(ln)["sum"] for ln in lines)  # each line carries its checksum
    legacy = json.dumps({"tags": {"t": "x"}})  # written before the check existed: no checksum, accepted as it is
    changed = lines[1].replace("2.5", "9.5")  # valid JSON, a value changed after it was written
    path.write_bytes("\n".join([lines[0], changed, legacy, '{"points": 5}']).encode() + b"\n\xff\xfe{\n")
    rf = check_records(tmp_path)
    assert rf.kept == [{"params": {"a": "1"}}, {"tags": {"t": "x"}}]
    assert [n for n, _ in rf.damaged] == [2, 4, 5]
    assert "checksum does not match" in rf.damaged[0][1]
    assert "points record of the wrong shape" in rf.damaged[1][1]
    assert "not UTF-8 (byte 0xff at offset 0)" == rf.damaged[2][1]


def test_dataset_and_model_records_are_checked_like_the_others():
    from raycpt.runs.inputs import dataset_record, model_record
    from raycpt.runs.records import shape_problem

    ok = [dataset_record("heldout_slice", "ab" * 8, "/r/heldout_blocks.json", "evaluation", {"rows": 3}),
          model_record("full", "/r/trials/full/final_model", {"plan": "full"}, {"heldout_loss": 2.5})]
    assert [shape_problem(r) for r in ok] == [None, None]
    assert shape_problem({"dataset": {"name": "x", "digest": 5, "source": "/s", "context": "training"}}) == \
        "a dataset record of the wrong shape"
    assert shape_problem({"model": {"name": "x"}}) == "a model record of the wrong shape"  # no location
    with pytest.raises(ValueError):
        dataset_record("x", "d", "/s", "testing")


def test_a_line_cut_short_by_a_kill_is_not_damage_and_the_next_record_survives(tmp_path):
    from raycpt.runs.records import RECORDS, append_record, check_records, seal_line

    append_record(tmp_path, {"params": {"a": "1"}})
    with open(tmp_path / RECORDS, "a") as f:
        f.write(seal_line({"metrics": {"loss": 1.0}, "step": 1})[:20])  # the write a kill cut short
    torn = check_records(tmp_path)
    assert torn.torn and torn.damaged == [] and len(torn.kept) == 1
    append_record(tmp_path, {"metrics": {"loss": 2.0}, "step": 2})  # the resumed run's next record
    rf = check_records(tmp_path)
    assert rf.kept == [{"params": {"a": "1"}}, {"metrics": {"loss": 2.0}, "step": 2}]
    assert [n for n, _ in rf.damaged] == [2]  # the torn line is now a line of its own, found, never joined


# ------------------------------------------------------------------------------------- runs sync
def test_a_damaged_middle_line_is_one_line_and_exit_2_then_accepted_with_what_was_kept(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from raycpt.entry import main

    run_dir, unit_dir = _folder(tmp_path)
    rec = unit_dir / "records.jsonl"
    lines = rec.read_text().splitlines()
    middle = next(i for i, ln in enumerate(lines) if '"points"' in ln and "3.5" in ln)
    lines[middle] = lines[middle].replace("3.5", "0.5")  # one point changed by hand (or by the disk)
    rec.write_text("\n".join(lines) + "\n")
    other = f"sqlite:///{tmp_path / 'other.db'}"

    assert main(["runs", "sync", str(run_dir), "--tracking-uri", other]) == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and "Traceback" not in err[0], err
    kept = len(lines) - 1
    assert f"{rec} line {middle + 1} is damaged: its checksum does not match" in err[0], err
    assert f"{kept} of {len(lines)} record(s) kept" in err[0] and "--accept-damage" in err[0], err
    assert _store_runs(other) == []  # nothing was synced

    assert main(["runs", "sync", str(run_dir), "--tracking-uri", other, "--accept-damage"]) == 0
    out = capsys.readouterr().out
    assert "damage accepted" in out and f"{kept} of {len(lines)} record(s) kept" in out, out
    unit_run = next(r for r in _store_runs(other) if r.info.run_name == "u")
    history = MlflowClient(other).get_metric_history(unit_run.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 4.25), (3, 2.75)]  # the damaged point left out
    assert unit_run.info.status == "FINISHED"


def test_a_sweep_without_its_top_level_record_is_refused_not_finished_with_nothing(tmp_path, capsys):
    from raycpt.entry import main

    run_dir, _ = _folder(tmp_path)
    (run_dir / "records.jsonl").unlink()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["runs", "sync", str(run_dir), "--tracking-uri", other]) == 2
    err = _err_lines(capsys)
    run_id = json.loads((run_dir / "state.json").read_text())["mlflow_run_id"]
    assert len(err) == 1 and f"{run_dir / 'records.jsonl'} is missing though state.json names its run {run_id}" \
        in err[0] and "0 records kept" in err[0], err
    assert _store_runs(other) == []


def test_runs_show_reads_through_the_same_check(tmp_path, capsys):
    from raycpt.entry import main

    run_dir, _ = _folder(tmp_path)
    with open(run_dir / "records.jsonl", "ab") as f:
        f.write(b'{"metrics": [1, 2]}\n')
    assert main(["runs", "show", str(run_dir)]) == 2
    err = _err_lines(capsys)
    assert len(err) == 1 and err[0].startswith("error: runs show: ") and "metrics record of the wrong shape" in err[0]
    assert main(["runs", "show", str(run_dir), "--accept-damage"]) == 2  # then its missing summary, one line
    err = _err_lines(capsys)
    assert err[0].startswith("warning: runs show: damage accepted") and "has no summary/summary.json" in err[-1], err


def test_resume_checks_the_record_before_it_goes_on(tmp_path):
    from raycpt.runs.run import command_run
    from raycpt.runs.trust import RecordDamaged

    run_dir, _ = _folder(tmp_path)
    with open(run_dir / "records.jsonl", "r+b") as f:
        f.seek(2)
        f.write(b"#")  # the first line broken
    with pytest.raises(RecordDamaged, match=r"train --resume: .*records.jsonl line 1 is damaged") as e:
        with command_run(_cfg(tmp_path / "runs"), "train", resume=True):
            pytest.fail("resumed a damaged record")
    assert e.value.exit_code == 2
    with command_run(_cfg(tmp_path / "runs"), "train", resume=True, accept_damage=True) as run:
        assert run.dir == run_dir
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"
