"""Hub eval data (C-Eval / CMMLU) fetched once on the driver; the Ray workers of the job then run offline.

No hub here: ``datasets.load_dataset`` is replaced by a counter, and the expected subject configs are read
from the task YAMLs lm-eval and raycpt load (not from the code under test)."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

from raycpt import runtime
from raycpt.config import load_config
from raycpt.errors import RaycptError
from raycpt.evaluate_prefetch import OFFLINE_ENV, prefetch_hub_datasets


def _yaml_configs() -> set[tuple[str, str]]:
    """Every (dataset_path, dataset_name) the hub tasks' YAMLs name (lm-eval's ceval / cmmlu, raycpt's *_gen)."""
    import lm_eval

    from raycpt.evaluate.lm_tasks import TASKS_DIR

    lm = Path(lm_eval.__file__).resolve().parent / "tasks"
    out = set()
    for folder in (lm / "ceval", lm / "cmmlu", TASKS_DIR / "ceval_gen", TASKS_DIR / "cmmlu_gen"):
        default = next(p for p in folder.iterdir() if p.name.startswith("_default"))
        path = re.search(r"^dataset_path: (\S+)", default.read_text(), re.M).group(1)
        for f in folder.glob("*.yaml"):
            m = re.search(r'^"?dataset_name"?: "?([^"\n]+)"?', f.read_text(), re.M)
            if m:
                out.add((path, m.group(1)))
    return out


@pytest.fixture
def worker_env(monkeypatch):
    env: dict = {}
    monkeypatch.setattr(runtime, "WORKER_ENV", env)
    return env


@pytest.fixture
def fake_hub(monkeypatch):
    import datasets

    calls: Counter = Counter()

    def load_dataset(path, name=None, **kw):
        calls[(path, name)] += 1
        return {"val": []}

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_each_subject_config_is_loaded_once_and_the_workers_go_offline(fake_hub, worker_env):
    cfg = load_config(None, ["eval.tasks=[ceval,cmmlu,wordnet_mc]", "eval.modes=[logit,generate]"])
    driver_env = {k: os.environ.get(k) for k in OFFLINE_ENV}
    assert prefetch_hub_datasets(cfg.eval, progress=False) == OFFLINE_ENV
    expected = _yaml_configs()
    assert len(expected) == 52 + 67
    assert set(fake_hub) == expected and set(fake_hub.values()) == {1}  # once each, whatever the modes
    assert worker_env == {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    assert {k: os.environ.get(k) for k in OFFLINE_ENV} == driver_env  # the driver itself stays as it was


def test_no_hub_task_fetches_nothing_and_leaves_the_workers_alone(fake_hub, worker_env, tmp_path):
    cfg = load_config(None, ["eval.tasks=[wordnet_mc,mmlu]"])
    assert prefetch_hub_datasets(cfg.eval, progress=False) == {}
    assert not fake_hub and worker_env == {}


def test_unreachable_and_uncached_is_one_line(monkeypatch, worker_env):
    import datasets

    def offline(path, name=None, **kw):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(None, ["eval.tasks=[cmmlu]"])
    with pytest.raises(RaycptError) as e:
        prefetch_hub_datasets(cfg.eval, progress=False)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert "haonan-li/cmmlu" in msg and "HF_HUB_OFFLINE=1" in msg and "cache lacks it" in msg
    assert worker_env == {}  # nothing fetched: the workers are not told to trust the cache


def test_the_real_datasets_offline_with_an_empty_cache_is_one_line(monkeypatch, worker_env, tmp_path):
    """No fake: this machine's datasets, offline (HF_HUB_OFFLINE=1), over an empty cache."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    cfg = load_config(None, ["eval.tasks=[ceval]"])
    with pytest.raises(RaycptError) as e:
        prefetch_hub_datasets(cfg.eval, progress=False)
    assert len(str(e.value).splitlines()) == 1 and "ceval/ceval-exam" in str(e.value)
    assert worker_env == {}


def test_init_ray_gives_the_worker_env_to_a_joined_cluster(monkeypatch, worker_env):
    import ray

    from raycpt.config import RayConfig

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    runtime.init_ray(RayConfig(address="10.0.0.1:6379"))
    assert seen["runtime_env"] is None  # nothing prefetched: the job's own runtime env only
    worker_env.update(OFFLINE_ENV)
    runtime.init_ray(RayConfig(address="10.0.0.1:6379"))
    assert seen["runtime_env"] == {"env_vars": OFFLINE_ENV}  # merged by Ray with a RayJob's runtimeEnvYAML


def test_the_offline_env_reaches_ray_tasks_and_the_actors_they_start(fake_hub, worker_env, monkeypatch):
    """A real local Ray started after the prefetch: a task (an eval task), an actor (a trial) and a task it
    starts (a training worker) all import datasets / huggingface_hub offline."""
    import ray

    from raycpt.config import RayConfig

    if ray.is_initialized():
        pytest.skip("a Ray is already running in this process")
    for k in OFFLINE_ENV:
        monkeypatch.delenv(k, raising=False)  # the driver is online
    prefetch_hub_datasets(load_config(None, ["eval.tasks=[ceval]"]).eval, progress=False)
    assert sum(fake_hub.values()) == 52
    def _probe():  # defined here: Ray pickles it by value (workers cannot import this test module)
        import datasets.config
        import huggingface_hub.constants

        return {k: os.environ.get(k) for k in OFFLINE_ENV} | {
            "datasets": datasets.config.HF_HUB_OFFLINE, "hub": huggingface_hub.constants.HF_HUB_OFFLINE}

    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "datasets": True, "hub": True}
    with runtime.ray_session(RayConfig(num_cpus=2)):
        @ray.remote(num_cpus=0.5)
        class Trial:
            def run(self):
                return _probe(), ray.get(ray.remote(num_cpus=0.5)(_probe).remote())

        assert ray.get(ray.remote(num_cpus=0.5)(_probe).remote()) == offline
        own, child = ray.get(Trial.remote().run.remote())
        assert own == offline and child == offline
    assert all(os.environ.get(k) is None for k in OFFLINE_ENV)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("job", ["sweep", "contribution", "hybrid", "eval"])
def test_each_driver_prefetches_once_before_any_run_folder_or_ray(job, tiny_dir, tmp_path, monkeypatch):
    """sweep / contribution / hybrid / ``raycpt eval``: the prefetch runs once on the driver, before the run
    folder and the Ray session exist (so the trials, workers and eval tasks start offline)."""
    import importlib

    import raycpt.evaluate_prefetch as P

    calls = []
    monkeypatch.setattr(P, "prefetch_hub_datasets", lambda eval_cfg, **kw: calls.append(list(eval_cfg.tasks)) or {})
    mod = importlib.import_module(f"raycpt.jobs.{job}")
    monkeypatch.setattr(mod, "prefetch_hub_datasets", P.prefetch_hub_datasets)  # imported at module level

    def stop(*a, **kw):
        assert calls == [["wordnet_mc"]], calls  # already prefetched, exactly once
        raise _Stop

    monkeypatch.setattr(mod, "open_run_dir", stop, raising=False)
    monkeypatch.setattr(mod, "command_run", stop, raising=False)  # the run folder opens in runs.command_run
    monkeypatch.setattr(importlib.import_module("raycpt.jobs.job"), "command_run", stop)  # called by run_job
    monkeypatch.setattr(mod, "ray_session", stop, raising=False)
    monkeypatch.setattr(runtime, "ray_session", stop)
    over = [f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", "eval.tasks=[wordnet_mc]"]
    cfg = load_config(None, over)
    run = {"sweep": lambda: mod.run_sweep(cfg, splits=[0.5], strategies=["train_deep"]),
           "contribution": lambda: mod.run_contribution(cfg),
           "hybrid": lambda: mod.run_hybrid(cfg, progress=False),
           "eval": lambda: mod.evaluate_checkpoints(cfg, [str(tiny_dir), str(tiny_dir)], progress=False)}[job]
    with pytest.raises(_Stop):
        run()
