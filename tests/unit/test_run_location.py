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


@pytest.fixture(params=["rel", "home"])
def root_words(request, tmp_path, monkeypatch):
    """``(tracking.run_root as written, the folder it names)``: a relative root (against the working folder) and a
    ``~`` root (against ``$HOME``), the folder computed with the operating system's own path functions."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("RAYCPT_TRACKING_URI", raising=False)
    if request.param == "rel":
        return "./x/../sweeps", os.path.realpath(os.path.join(str(cwd), "sweeps"))
    return "~/sweeps", os.path.realpath(os.path.join(str(home), "sweeps"))


def test_a_sweep_command_resolves_its_run_root_once_and_every_consumer_reads_that_folder(root_words, monkeypatch):
    """``raycpt sweep`` through the command line (:func:`raycpt.cli.run_row`: prepare, the run spec, the command's
    run, execute), its model, Ray, grid and summary faked: one resolution of the run root and one of the URI for the
    whole command, and every part that records or reads under the run root gets the same absolute folder."""
    import contextlib
    import dataclasses

    from raycpt import cli
    from raycpt.jobs import sweep

    written, folder = root_words
    calls = {"root": [], "uri": []}
    real_root, real_uri = loc.resolve_root, loc.resolve_uri
    monkeypatch.setattr(loc, "resolve_root", lambda r: calls["root"].append(r) or real_root(r))
    monkeypatch.setattr(loc, "resolve_uri", lambda u, r: calls["uri"].append(u) or real_uri(u, r))
    seen: dict = {}

    @contextlib.contextmanager
    def ahead(plan, where):
        seen["ahead"] = where
        yield

    def grid(parent, g, resume=False, console=None):
        seen["grid"] = parent.location
        return {}

    def summary(run_dir, trials, **kw):
        seen["decisions"] = kw["report"]  # report_options read raycpt decide's record under the carried root
        return {"files": []}

    fakes = {"model_layers": lambda cfg: ("/no/model", 4), "check_memory": lambda *a: None,
             "check_corpora": lambda cfg, model, root, quiet=True: seen.setdefault("corpora", root),
             "general_probe": lambda cfg, model: None, "prefetch_hub_datasets": lambda *a, **k: None,
             "ahead_of_trials": ahead, "ray_session": lambda *a, **k: contextlib.nullcontext(),
             "run_datasets": lambda root, *a: seen.setdefault("inputs", root) and [],
             "run_grid": grid, "stop_ray_soon": lambda: None, "write_summary": summary,
             "log_summary": lambda *a: None,
             "sweep_inputs": lambda root, *a: seen.setdefault("sweep_inputs", root) and []}
    for name, fake in fakes.items():
        monkeypatch.setattr(sweep, name, fake)
    monkeypatch.setattr(sweep, "report_options", lambda cfg, decisions: {"decisions": decisions})
    results = []
    monkeypatch.setitem(cli.COMMANDS, "sweep", dataclasses.replace(cli.COMMANDS["sweep"],
                                                                   render=lambda res, console: results.append(res)))
    cli.run_row("sweep", [f"tracking.run_root={written}", "name=once", "sweep.trace_first=false"], {})

    assert calls == {"root": [written], "uri": [None]}  # once each, for the whole command
    run_dir = results[0].run_dir
    assert os.path.dirname(str(run_dir)) == folder and os.path.basename(str(run_dir)).startswith("sweep-once-")
    assert os.path.isfile(os.path.join(folder, "mlflow.db"))  # the command's store, in the same folder
    assert seen["ahead"] is seen["grid"]  # the one value, carried (not made again)
    assert str(seen["ahead"].base_shards) == os.path.join(folder, "base_shards")
    assert (str(seen["corpora"]), str(seen["inputs"]), str(seen["sweep_inputs"])) == (folder, folder, folder)
    assert str(seen["decisions"]["decisions"]) == os.path.join(folder, "decisions")
    saved = load_config(os.path.join(str(run_dir), "config.yaml"))  # what the run folder and every Ray worker read
    assert saved.tracking.run_root == folder and saved.tracking.uri == "sqlite:///" + os.path.join(folder, "mlflow.db")


def test_the_packed_store_base_cache_and_decide_records_of_a_relative_or_home_root_are_under_one_folder(root_words,
                                                                                                      tmp_path):
    """The consumers that take the carried root: the packed-token stores, the base row's cache entry, ``raycpt
    decide``'s record and a new run folder all land under the folder the root names."""
    from raycpt.data.store import store_root
    from raycpt.decide.record import record_path
    from raycpt.jobs.base_row import base_cache_dir
    from raycpt.runs.folder import open_run_dir

    written, folder = root_words
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = load_config(None, [f"tracking.run_root={written}", "name=where"])
    where = loc.locate(cfg.tracking)
    assert str(where.root) == folder
    assert str(store_root(cfg.data, where.root)) == os.path.join(folder, "packed")
    assert os.path.dirname(str(base_cache_dir(where.base_eval, cfg, str(model), {}))) == os.path.join(folder,
                                                                                                     "base_eval")
    assert os.path.dirname(str(record_path(where.decisions, cfg, 8))) == os.path.join(folder, "decisions")
    run_dir = open_run_dir(cfg, "train", where)
    assert os.path.dirname(str(run_dir)) == folder and cfg.tracking.run_root == folder


ALLOWED_READERS = {
    "raycpt/runs/location.py": "THE resolver (locate) and RunLocation.pin, which writes the resolved values back",
    "raycpt/config/experiment.py": "check_folder_names: each component of the run root as written fits NAME_MAX "
                                   "(a check of the config's text as it loads, before any command resolves it)",
}
"""The modules that may read ``tracking.run_root`` / ``tracking.uri`` from a config, each with its reason."""


def location_readers(package_dir: Path) -> list[str]:
    """``path:line: source`` of every read of a config's ``tracking.run_root`` or ``tracking.uri`` under
    ``package_dir`` (attribute, ``getattr`` or a dict key: ``x.tracking.uri``, ``tracking.run_root``,
    ``getattr(cfg.tracking, "uri")``, ``doc["tracking"]["run_root"]``); ``run_root`` is read on any object (only a
    tracking config has one), ``uri`` only on a tracking config."""
    import ast

    def tracking(node) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "tracking"
        if isinstance(node, ast.Name):
            return "tracking" in node.id
        return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and node.slice.value == "tracking")

    def reads(name, base) -> bool:
        return name == "run_root" or (name == "uri" and tracking(base))

    found = []
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and reads(node.attr, node.value) or (
                    isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                    and reads(node.slice.value, node.value)) or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and reads(node.args[1].value, node.args[0])):
                found.append(f"{path.relative_to(package_dir.parent).as_posix()}:{node.lineno}: "
                             f"{ast.get_source_segment(text, node)}")
    return found


def test_the_scan_finds_every_form_of_a_read(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f(cfg, tracking, doc, target):\n"
                              "    a = cfg.tracking.run_root\n"
                              "    b = tracking.uri\n"
                              "    c = getattr(cfg.tracking, 'uri', None)\n"
                              "    d = doc['tracking']['run_root']\n"
                              "    e = target.uri, where.uri, store.uri, getattr(target, 'uri')\n")  # none of these
    assert location_readers(pkg) == ["pkg/m.py:2: cfg.tracking.run_root", "pkg/m.py:3: tracking.uri",
                                     "pkg/m.py:4: getattr(cfg.tracking, 'uri', None)",
                                     "pkg/m.py:5: doc['tracking']['run_root']"]


def test_no_module_but_the_resolver_reads_the_run_root_or_the_uri_from_a_config():
    package = Path(loc.__file__).resolve().parents[1]
    outside = [hit for hit in location_readers(package) if hit.split(":")[0] not in ALLOWED_READERS]
    assert outside == []
    assert {hit.split(":")[0] for hit in location_readers(package)} == set(ALLOWED_READERS)  # each one still reads
