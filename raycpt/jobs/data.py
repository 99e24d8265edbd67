"""``raycpt data prepare`` and ``raycpt data info``: the packed-token corpus store, packed once and listed (each a
:class:`raycpt.jobs.job.NoRun`: no run folder of its own, no MLflow run)."""

from __future__ import annotations

import contextlib

from raycpt.config import ExperimentConfig
from raycpt.data.corpus import check_corpus
from raycpt.data.pack import find_packed
from raycpt.data.store import list_stores, store_root, store_state
from raycpt.jobs.job import NoRun, Options
from raycpt.runtime import cluster_address, ray_session
from raycpt.data.run_store import pack_corpus, replay_corpus
from raycpt.train.driver.prepare import resolve_model_path


def prepare_store(cfg: ExperimentConfig, options: Options) -> None:
    """Pack ``cfg.data.corpus`` (and ``data.replay.corpus`` when ``data.replay.ratio`` > 0) once (``--rebuild``:
    again; any non-empty store is a valid pack: whether it is big enough is a training run's check). Ray Data tasks on a cluster; on one machine a local process pool."""
    rebuild, root = bool(options.get("rebuild")), options.located(cfg, check=False).root
    model_path = resolve_model_path(cfg)
    hit = not rebuild and find_packed(cfg.data, model_path, root, say=_silent) is not None
    if not hit:
        check_corpus(cfg.data)  # bad files are one line before Ray starts
    with contextlib.nullcontext() if hit or not cluster_address(cfg.ray) else ray_session(cfg.ray):
        pack_corpus(cfg, model_path, root, quiet=False, rebuild=rebuild)  # prints its one line
        replay_corpus(cfg, model_path, root, quiet=False, rebuild=rebuild)  # data.replay.corpus too, when it mixes in


def _silent(_line: str) -> None:
    """The hit check's say: a store that does not verify is named once, by the pack that follows."""


def store_info(cfg: ExperimentConfig, options: Options):
    """``(store folder, [(store, state)])`` under the config's store folder (data.store_dir or <run_root>/packed),
    each store's state the verdict every command that reads it reaches (:func:`raycpt.data.store.store_state`, with
    ``data.verify``)."""
    root = store_root(cfg.data, options.located(cfg, check=False).root)
    content = cfg.data.verify == "content"
    return root, [(st, store_state(st, content)) for st in list_stores(root)]


DATA_PREPARE = NoRun(prepare_store)
DATA_INFO = NoRun(store_info)
