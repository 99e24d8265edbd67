"""Reading the packed store: a seeded order per epoch, each rank's share, memory-mapped rows.

The order of epoch ``e`` (seed ``s``, window ``W`` blocks, shards of ``c_0..c_{S-1}`` blocks):

1. the shard files are permuted: ``π = default_rng([s, e, 0]).permutation(S)``;
2. their blocks are laid end to end in that order: a sequence ``L`` of all ``N`` block ids;
3. ``L`` is cut into consecutive windows of ``W`` blocks (the last may be shorter) and window
   ``w`` is permuted by ``default_rng([s, e, 1, w]).permutation(len(window))``.

A block therefore lands uniformly at random inside its window, and windows of different epochs
hold different blocks because the shard order changes; with ``N <= W`` the order is a full uniform
permutation. The order depends only on (seed, epoch, the shards' block counts, ``W``): not on
Ray, the number of workers, or where a run resumed.

Rank ``r`` of ``R`` with micro-batch ``m`` takes, at its ``k``-th micro-batch of an epoch,
positions ``[(k R + r) m, (k R + r + 1) m)`` of that order; an epoch has ``N // (R m)``
micro-batches per rank (the remaining ``N mod (R m)`` blocks - different ones each epoch - are not
read that epoch). Resuming after ``c`` micro-batches is arithmetic: epoch ``c // per_epoch``,
micro-batch ``c % per_epoch``; nothing is read to skip. Memory: the shard table plus one window of
int64 indices (``8 W`` bytes); the rows come from memory-mapped files, so only the pages read are
resident, however large the corpus.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from raycpt.errors import RaycptError

DEFAULT_WINDOW = 65536
OPEN_SHARDS = 128


def as_seed(seed: int) -> int:
    return int(seed) % (1 << 63)


class EpochOrder:
    """The block order of one epoch (see the module docstring); ``ids(positions)`` maps positions
    of the epoch to global block ids, keeping only one window's permutation in memory."""

    def __init__(self, counts: Sequence[int], seed: int, epoch: int, window: int = DEFAULT_WINDOW):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.n = int(self.counts.sum())
        self.seed, self.epoch, self.window = as_seed(seed), int(epoch), max(1, int(window))
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.perm = np.random.default_rng([self.seed, self.epoch, 0]).permutation(len(self.counts))
        laid = self.counts[self.perm]
        self.ends = np.cumsum(laid)
        self.starts = self.ends - laid
        self._cached: tuple[int, Optional[np.ndarray]] = (-1, None)

    def _laid_out(self, i: np.ndarray) -> np.ndarray:
        j = np.searchsorted(self.ends, i, side="right")
        return self.offsets[self.perm[j]] + (i - self.starts[j])

    def _window_perm(self, w: int) -> np.ndarray:
        if self._cached[0] != w:
            size = min(self.window, self.n - w * self.window)
            self._cached = (w, np.random.default_rng([self.seed, self.epoch, 1, w]).permutation(size))
        return self._cached[1]

    def ids(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise IndexError(f"positions outside [0, {self.n})")
        out = np.empty_like(positions)
        wins = positions // self.window
        for w in np.unique(wins):
            sel = wins == w
            local = positions[sel] - w * self.window
            out[sel] = self._laid_out(w * self.window + self._window_perm(int(w))[local])
        return out

    def full(self) -> np.ndarray:
        """Every block id in this epoch's order (tests and small corpora)."""
        return self.ids(np.arange(self.n))


class ArrayBlocks:
    """Blocks held in memory (tests, the plain-process loop); ``counts`` fakes shard files."""

    def __init__(self, blocks: np.ndarray, counts: Optional[Sequence[int]] = None):
        self.blocks = np.asarray(blocks)
        self.counts = list(counts) if counts is not None else [len(self.blocks)]
        if sum(self.counts) != len(self.blocks):
            raise ValueError("counts must add up to the number of blocks")
        self.num_blocks = len(self.blocks)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.blocks[np.asarray(ids)], dtype=np.int64)


class PackedBlocks:
    """A packed store's shards, memory-mapped on demand (at most OPEN_SHARDS at once)."""

    def __init__(self, path, manifest: dict):
        self.path = Path(path)
        self.files = [s["file"] for s in manifest["shards"]]
        self.counts = [int(s["blocks"]) for s in manifest["shards"]]
        self.ends = np.cumsum(self.counts)
        self.num_blocks = int(manifest["num_blocks"])
        self.seq_len = int(manifest["seq_len"])
        self._open: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def _shard(self, j: int) -> np.ndarray:
        arr = self._open.pop(j, None)
        if arr is None:
            try:
                arr = np.load(self.path / self.files[j], mmap_mode="r")
            except (OSError, ValueError) as e:
                raise RaycptError(f"packed store {self.path}: shard {self.files[j]} is unreadable ({e}); re-pack "
                                  "with raycpt data prepare --rebuild") from None
            if len(self._open) >= OPEN_SHARDS:
                self._open.popitem(last=False)
        self._open[j] = arr
        return arr

    def rows(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.seq_len), dtype=np.int64)
        shard = np.searchsorted(self.ends, ids, side="right")
        for j in np.unique(shard):
            sel = np.nonzero(shard == j)[0]
            start = self.ends[j] - self.counts[j]
            out[sel] = self._shard(int(j))[ids[sel] - start]
        return out


def per_epoch(num_blocks: int, world: int, mbs: int) -> int:
    """Micro-batches each rank reads per epoch."""
    return num_blocks // (world * mbs)


def iter_micro_batches(source, mbs: int, *, rank: int = 0, world: int = 1, seed: int = 0,
                       window: int = DEFAULT_WINDOW, skip: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """Endless ``(epoch, int64 (mbs, seq_len) rows)`` of rank ``rank``, epoch after epoch, starting
    after ``skip`` micro-batches of this rank (arithmetic; nothing is read to skip)."""
    n_per = per_epoch(source.num_blocks, world, mbs)
    if n_per == 0:
        raise RaycptError(f"the packed corpus has {source.num_blocks} blocks: fewer than one micro-batch of {mbs} "
                          f"for each of {world} worker(s)")
    epoch, k = divmod(int(skip), n_per)
    base = np.arange(mbs, dtype=np.int64)
    while True:
        order = EpochOrder(source.counts, seed, epoch, window)
        for kk in range(k, n_per):
            yield epoch, source.rows(order.ids((kk * world + rank) * mbs + base))
        k = 0
        epoch += 1
