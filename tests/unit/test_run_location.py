"""Where a run lives is resolved once (issue 46, item 4): :func:`raycpt.runs.location.locate` makes the run root and
the MLflow URI where a command starts, and everything downstream reads the carried value; a relative or ``~`` run
root becomes the absolute path the operating system's own path functions give."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import raycpt.runs.location as loc
from raycpt.config import TrackingConfig, load_config


@pytest.fixture
def counted(monkeypatch):
    """Every resolution of a run root (``loc.resolve_root``) counted, by the root it resolved."""
    calls: list[str] = []
    real = loc.resolve_root

    def resolve_root(run_root):
        calls.append(str(run_root))
        return real(run_root)

    monkeypatch.setattr(loc, "resolve_root", resolve_root)
    return calls


def test_a_relative_run_root_is_the_working_folder_joined_and_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAYCPT_TRACKING_URI", raising=False)
    where = loc.locate(TrackingConfig(run_root="a/../runs"), check=False)
    expect = os.path.realpath(os.path.join(os.getcwd(), "a/../runs"))
    assert str(where.root) == expect and where.root.is_absolute()
    assert where.uri == "sqlite:///" + os.path.join(expect, "mlflow.db")
    assert not where.checked and not os.path.exists(expect)  # resolving creates nothing
    assert (str(where.packed), str(where.base_eval), str(where.base_shards), str(where.decisions)) == tuple(
        os.path.join(expect, name) for name in ("packed", "base_eval", "base_shards", "decisions"))


def test_a_home_run_root_is_the_home_folder_joined(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAYCPT_TRACKING_URI", raising=False)
    where = loc.locate(TrackingConfig(run_root="~/exp/runs"), check=False)
    assert str(where.root) == os.path.realpath(os.path.expanduser("~/exp/runs"))
    assert str(where.root) == os.path.realpath(os.path.join(str(home), "exp", "runs"))


def test_the_uri_is_the_configs_else_the_clusters_else_sqlite_in_the_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAYCPT_TRACKING_URI", "http://mlflow.cluster:5000")
    assert loc.locate(TrackingConfig(run_root="runs"), check=False).uri == "http://mlflow.cluster:5000"
    given = TrackingConfig(run_root="runs", uri="sqlite:///stores/m.db")  # a relative SQLite path: absolute
    assert loc.locate(given, check=False).uri == "sqlite:///" + os.path.realpath(os.path.join(os.getcwd(),
                                                                                           "stores/m.db"))
    assert loc.locate(TrackingConfig(run_root="runs", uri="sqlite:////abs/m.db"), check=False).uri == \
        "sqlite:////abs/m.db"


def test_pin_writes_the_resolved_values_into_the_config_and_a_trial_reads_them_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAYCPT_TRACKING_URI", raising=False)
    cfg = load_config(None, ["tracking.run_root=rel"])
    where = loc.locate(cfg.tracking)
    assert where.checked
    where.pin(cfg.tracking)
    assert cfg.tracking.run_root == os.path.realpath("rel") and cfg.tracking.uri == where.uri
    assert loc.from_dict(where.as_dict()) == where  # what a grid's trial process gets


def test_a_bad_uri_is_the_same_one_line_as_before(tmp_path):
    from raycpt.errors import RaycptError

    with pytest.raises(RaycptError) as e:
        loc.locate(TrackingConfig(run_root=str(tmp_path), uri="ftp://x/y"))
    assert str(e.value) == ("tracking.uri 'ftp://x/y': unknown scheme 'ftp'; use http(s)://HOST:PORT (an MLflow "
                            "server), sqlite:////abs/path/mlflow.db, a database URI, or leave it empty (SQLite in "
                            "the run root)")


def test_a_command_line_resolves_the_run_root_once(tmp_path, monkeypatch, counted):
    """``raycpt data info`` in-process: the command line resolves the location as it loads the config, and the job
    reads that one (no second resolution downstream)."""
    from raycpt import cli

    monkeypatch.chdir(tmp_path)
    cli.run_row("data info", ["tracking.run_root=rel-runs"], {})
    assert counted == ["rel-runs"]


def test_a_command_run_resolves_the_run_root_once(tmp_path, monkeypatch, counted):
    """A library caller's command with a run (folder, MLflow store, run, records, end): one resolution for all of
    it, and every path it wrote under the resolved root."""
    from raycpt.jobs.job import RunSpec, Steps, loaded, run_job

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAYCPT_TRACKING_URI", raising=False)
    seen = {}

    def execute(cfg, run, options):
        run.log_metrics({"x": 1.0})
        seen.update(dir=run.dir, location=run.location, root=cfg.tracking.run_root)
        return run.dir

    job = Steps(loaded, execute, lambda cfg, options: RunSpec(cfg, "probe"))
    run_job(job, load_config(None, ["tracking.run_root=here/runs", "name=once"]))
    expect = Path(os.path.realpath("here/runs"))
    assert counted == ["here/runs"]
    assert seen["location"].root == expect and seen["root"] == str(expect) and seen["dir"].parent == expect
    assert (expect / "mlflow.db").is_file() and seen["dir"].name.startswith("probe-once-")
