"""``data``: the training corpus, its packing and its replay mix (``data.replay``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional

from raycpt.config.checks import check_field, check_seed


@dataclass
class ReplayConfig:
    corpus: list[str] = field(default_factory=list)
    """Replay corpus (general text against forgetting), the same kinds of sources as ``data.corpus``; packed once
    like it. Empty = no replay."""
    ratio: float = 0.0
    """rho: the share of training blocks read from the replay corpus, in [0, 1); exactly rho * window of every
    window of ``window`` blocks when that is whole (else within one)."""
    window: int = 64
    """Blocks per mixing window of the stream (the replay slots of each are placed by a seeded permutation)."""

    def __post_init__(self):
        check_field(isinstance(self.ratio, (int, float)) and math.isfinite(self.ratio) and 0.0 <= self.ratio < 1.0,
               "data.replay.ratio", self.ratio, "a share in [0, 1) (0 = no replay)")
        check_field(self.window >= 1, "data.replay.window", self.window, "an integer >= 1")
        check_field(self.ratio == 0 or len(self.corpus) > 0, "data.replay.corpus", self.corpus,
               "a non-empty list of corpus sources when data.replay.ratio > 0")


@dataclass
class DataConfig:
    corpus: list[str] = field(default_factory=lambda: ["builtin:wordnet-glosses"])
    """Training corpus: JSONL / Parquet / text files or globs, ``builtin:wordnet-glosses``,
    ``debian:fortunes-zh`` (read from its installed path), or ``hf:DATASET_ID`` on a cluster."""
    text_field: str = "text"
    """Field holding the document text in JSONL / Parquet / hub records."""
    seq_len: int = 128
    """Tokens per packed training block (documents joined with EOS)."""
    max_documents: Optional[int] = None
    """Read at most this many documents (None = all)."""
    shuffle_seed: Optional[int] = None
    """Seed of the deterministic block shuffle; None = ``train.seed``."""
    store_dir: Optional[str] = None
    """Where packed-token stores live (shared storage on a cluster); None = ``<tracking.run_root>/packed``."""
    shuffle_window: int = 65536
    """Blocks permuted together after the per-epoch permutation of the shard files (see docs/train.md)."""
    heldout_share: float = 0.0
    """Share of the documents held out of training wherever they are in the corpus (a seeded hash of each
    document's text: spread over the whole corpus, duplicates on one side); the held-out loss then uses an
    evenly spaced sample of them. 0 = the held-out documents are those after ``max_documents`` (the tail)."""
    heldout_seed: int = 0
    """Seed of the held-out hash (``heldout_share``)."""
    verify: Literal["stat", "content"] = "stat"
    """How a packed store is checked against its corpus files: ``stat`` (size and mtime; the hash is read
    again only when they differ) or ``content`` (every file hashed whole at pack time and on every check:
    catches an edit that kept size and mtime, e.g. ``cp -p``, at the cost of reading the corpus). The store's own
    shards are checked against their sha256 either way (``content``: hashed whole on every check)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay: a second corpus mixed into the stream at ``ratio`` (deterministic, resumable; docs/train.md)."""

    def __post_init__(self):
        check_field(self.seq_len >= 8, "data.seq_len", self.seq_len, "an integer >= 8")
        check_field(0.0 <= self.heldout_share < 0.5, "data.heldout_share", self.heldout_share,
               "a share in [0, 0.5) (0 = the corpus tail after data.max_documents)")
        check_field(len(self.corpus) > 0, "data.corpus", self.corpus, "a non-empty list of corpus sources")
        check_field(self.shuffle_window >= 1, "data.shuffle_window", self.shuffle_window, "an integer >= 1")
        if self.shuffle_seed is not None:
            check_seed("data.shuffle_seed", self.shuffle_seed)
        check_seed("data.heldout_seed", self.heldout_seed)
