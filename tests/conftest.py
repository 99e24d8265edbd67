import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    import importlib.util

    has_cuda = False
    if importlib.util.find_spec("torch") is not None:
        import torch

        has_cuda = torch.cuda.is_available()
    for item in items:
        if "tests/integration" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))


@pytest.fixture
def fresh_lost(monkeypatch):
    """raycpt.runs.lost with no tracking server recorded as lost, and MLflow's HTTP retries short (both restored
    after the test: ``mark_lost`` sets them)."""
    import raycpt.runs.lost as tr

    monkeypatch.setattr(tr, "_lost", {})
    for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(k, "2")
    return tr


@pytest.fixture
def tiny_dir(tmp_path):
    from tiny import save_tiny

    return save_tiny(tmp_path / "tiny-llama")


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """A local wheel folder: the real ``pip download`` reads wheels from this folder only (no index, no network)."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


@pytest.fixture(autouse=True)
def _nothing_written_to_the_working_folder():
    """A test that lets MLflow fall back to its default store writes ``./mlruns`` (or ``./mlartifacts``) into the
    folder pytest runs from, the repository: that test fails here, naming what it wrote (the folder is removed
    so the tests after it are not blamed)."""
    import shutil

    stray = [Path.cwd() / n for n in ("mlruns", "mlartifacts")]
    before = {p for p in stray if p.exists()}
    yield
    made = [p for p in stray if p.exists() and p not in before]
    for p in made:
        shutil.rmtree(p, ignore_errors=True)
    assert not made, (f"the test wrote {', '.join(map(str, made))} (an MLflow store, or an experiment made with no "
                      "artifact location)")
