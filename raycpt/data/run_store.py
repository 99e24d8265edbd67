"""The packed-token stores a training run reads: ``data.corpus``'s (packed once per corpus, tokenizer and
``seq_len``; big enough for one micro-batch per worker) and the replay corpus's."""

from __future__ import annotations

import dataclasses
import logging
import re

from raycpt.config import ExperimentConfig
from raycpt.data.corpus import check_corpus
from raycpt.data.pack import describe_build, describe_hit, ensure_packed
from raycpt.errors import RaycptError
from raycpt.runtime import cluster_address

log = logging.getLogger(__name__)


def pack_corpus(cfg: ExperimentConfig, model_path: str, run_root, quiet: bool = True, rebuild: bool = False):
    """The packed-token store of ``cfg.data`` (packed now when missing; one line either way unless ``quiet``) under
    ``run_root`` (the command's, absolute: :attr:`raycpt.runs.location.RunLocation.root`) unless ``data.store_dir``
    names the folder. No corpus pass: counts are the manifest's. Whether it is big enough for a run is
    :func:`packed_corpus`'s."""

    store, built = ensure_packed(cfg.data, model_path, run_root, rebuild=rebuild, progress=not quiet)
    line = describe_build(store) if built else describe_hit(store)
    log.info(line)
    if not quiet:
        print(line, flush=True)
    return store


def packed_corpus(cfg: ExperimentConfig, model_path: str, run_root, quiet: bool = True, rebuild: bool = False):
    """:func:`pack_corpus`, checked to hold at least one micro-batch per worker of this run."""
    store = pack_corpus(cfg, model_path, run_root, quiet=quiet, rebuild=rebuild)
    t = cfg.train
    need = t.num_workers * t.micro_batch_size
    if store.num_blocks < need:
        raise RaycptError(f"data.corpus {list(cfg.data.corpus)} gives only {store.num_blocks} full "
                          f"{cfg.data.seq_len}-token blocks; {t.num_workers} worker(s) x "
                          f"train.micro_batch_size={t.micro_batch_size} need at least {need} (add documents or lower "
                          "data.seq_len)")
    return store


def replay_corpus(cfg: ExperimentConfig, model_path: str, run_root, quiet: bool = True, rebuild: bool = False):
    """The packed store of ``data.replay.corpus`` (all of its documents, none held out), or None without replay;
    a bad replay corpus is one line naming ``data.replay.corpus`` (the primary corpus's checks say ``data.corpus``)."""
    r = cfg.data.replay
    if r.ratio <= 0:
        return None
    data = dataclasses.replace(cfg.data, corpus=list(r.corpus), max_documents=None, heldout_share=0.0)
    try:
        return packed_corpus(dataclasses.replace(cfg, data=data), model_path, run_root, quiet=quiet, rebuild=rebuild)
    except RaycptError as e:
        raise RaycptError(as_replay(str(e))) from None


def as_replay(line: str) -> str:
    """A corpus check's line about the replay corpus: its ``data.corpus`` names ``data.replay.corpus``."""
    return re.sub(r"(?<![\w.])data\.corpus\b", "data.replay.corpus", line)


def check_corpora(cfg: ExperimentConfig, model_path: str, run_root, quiet: bool = True) -> None:
    """Every corpus a run reads (``data.corpus`` and, with replay, ``data.replay.corpus``), checked before its run
    folder exists: packed now (a hit when packed before; too short for the run is one line) on one machine; on a
    cluster only their files are checked here (the pack runs as Ray Data tasks once Ray is up)."""
    if cluster_address(cfg.ray):
        check_corpus(cfg.data)
        if cfg.data.replay.ratio > 0:
            try:
                check_corpus(dataclasses.replace(cfg.data, corpus=list(cfg.data.replay.corpus)))
            except RaycptError as e:
                raise RaycptError(as_replay(str(e))) from None
        return
    packed_corpus(cfg, model_path, run_root, quiet=quiet)
    replay_corpus(cfg, model_path, run_root, quiet=quiet)
