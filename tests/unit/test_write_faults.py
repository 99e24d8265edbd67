"""Rule 6 (issue 51): writes that can fail, fail in one line, and leave nothing half-written.

``raycpt runs export`` onto a full disk (ENOSPC injected into the copy, :func:`raycpt.io.copy_chunks` as the export
calls it) and into a folder inside the run it exports; ``raycpt runs sync`` into a store that refuses a write (a
read-only SQLite database, an artifact folder that cannot be written: injected, as this suite may run as root, whom
a file's mode does not stop). Each: one line on stderr, exit 2, no partial folder or temporary copy left, and for
sync, a second sync once the store is writable again that finishes the run with every item once.
"""

from __future__ import annotations

import errno
import os

import pytest

from raycpt.entry import main
from test_run_records import _client, _content, _folder  # noqa: F401 - helpers of the run-record tests
from test_shared_shards import two_trials  # noqa: F401 - the fixture
from test_publish_reference import trained  # noqa: F401 - the fixture


def run_cli(argv, capfd):
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


def tree(folder) -> list[str]:
    """Every path under ``folder``, relative, sorted (what a failed command must not have changed)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(two_trials, tmp_path, capfd, monkeypatch):
    import raycpt.jobs.export as export

    _, _, (a, _) = two_trials
    calls, real = [], export.copy_chunks

    def full(src, out, *on_chunk):  # the second file's copy finds the disk full, half-way through
        calls.append(out.name)
        if len(calls) == 2:
            out.write(src.read(10))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), out.name)
        return real(src, out, *on_chunk)

    monkeypatch.setattr(export, "copy_chunks", full)
    out = tmp_path / "new" / "deeper" / "exported"
    before = tree(tmp_path)
    code, stdout, lines = run_cli(["runs", "export", str(a.parent.parent), str(out)], capfd)
    assert code == 2 and stdout == "" and len(lines) == 1, lines
    assert lines[0].startswith(f"error: runs export: cannot write {calls[1]}: No space left on device (ENOSPC); "
                               f"nothing was written to {out} (the partial copy was removed)"), lines
    assert tree(tmp_path) == before  # no OUT_DIR, no .exported.* copy, not even the parent folders it made


def test_export_into_the_run_it_exports_is_refused_and_the_run_does_not_grow(two_trials, capfd):
    root, _, (a, _) = two_trials
    before = tree(root)
    trial = a.parent.parent
    for out in (a / "copy", trial / "exported", a):
        code, stdout, lines = run_cli(["runs", "export", str(trial), str(out)], capfd)
        assert code == 2 and stdout == "" and len(lines) == 1, lines
        inside = a if out.is_relative_to(a) else trial
        assert lines[0] in (f"error: runs export: {out} is inside {inside}, the folder being exported: nothing was "
                            "written; name a folder outside it",
                            f"error: runs export: {out} already exists and is not empty: nothing was written; name "
                            "a new folder"), lines
    assert tree(root) == before


@pytest.mark.parametrize("where", ["database", "artifacts"])
def test_sync_into_a_store_that_refuses_a_write_is_one_line_and_a_second_sync_finishes(where, tmp_path, capfd,
                                                                                       monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from raycpt.runs.folder import read_state

    run_dir = _folder(tmp_path)
    (run_dir / "summary").mkdir()
    (run_dir / "summary" / "curve.png").write_bytes(b"\x89PNG fake")
    from raycpt.runs.records import append_record

    append_record(run_dir, {"artifact": "summary/curve.png", "dir": "summary"})
    if where == "database":  # what MLflow's SQL store raises for a read-only SQLite file
        def refuse(self, *a, **k):
            raise MlflowException("(sqlite3.OperationalError) attempt to write a readonly database")
        monkeypatch.setattr(MlflowClient, "log_batch", refuse)
    else:  # the store's artifact folder is read-only
        def refuse(self, run_id, local_path, artifact_path=None):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "runs" / "mlartifacts"))
        monkeypatch.setattr(MlflowClient, "log_artifact", refuse)
    state_before = read_state(run_dir)
    code, stdout, lines = run_cli(["runs", "sync", str(run_dir)], capfd)
    assert code == 2 and stdout == "" and len(lines) == 1, lines
    said = ("the MLflow store sqlite:///" if where == "database" else f"cannot write {tmp_path / 'runs' / 'mlartifacts'}"
            ": Permission denied (EACCES)")
    assert lines[0].startswith(f"error: runs sync: {said}") and lines[0].endswith(
        f"then run raycpt runs sync {run_dir} again: what was synced stays, the rest is added once"), lines
    assert read_state(run_dir).get("status") == state_before.get("status")  # the folder still says how it ended
    assert not list(run_dir.rglob(".*.tmp"))  # no temporary file left beside state.json or trial.json
    monkeypatch.undo()  # the store writable again: the sync it advises finishes the run, each item once
    code, stdout, lines = run_cli(["runs", "sync", str(run_dir)], capfd)
    assert code == 0 and "status FINISHED" in stdout, (stdout, lines)
    client, exp = _client(tmp_path, "runs")
    runs = {r.info.run_name: r for r in client.search_runs([exp])}
    assert sorted(runs) == ["full", "sweep-x"] and {r.info.status for r in runs.values()} == {"FINISHED"}
    assert _content(client, runs["full"].info.run_id)[1] == {"loss": [(1, 3.0)], "heldout_loss": [(0, 2.75)]}
    assert "summary/curve.png" in _content(client, runs["sweep-x"].info.run_id)[2]
