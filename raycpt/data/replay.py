"""Replay: a second corpus (general text) mixed into the packed stream at a ratio rho, exactly and resumably.

The training stream is a sequence of global block positions ``p = 0, 1, 2, ...`` (rank ``r`` of ``R`` with
micro-batch ``m`` reads, at its ``c``-th micro-batch, positions ``[(c R + r) m, (c R + r + 1) m)``, as the plain
stream does). The positions are cut into windows of ``W`` (``data.replay.window``, 64); window ``w`` holds
``floor((w + 1) q) - floor(w q)`` replay slots, ``q = rho W`` (an exact fraction: with ``rho W`` whole, every
window holds exactly ``rho W``), placed by ``default_rng([seed, 2, w]).permutation(W)``. Primary slot number
``j`` (counting primary slots only) reads block ``j mod N`` of the primary corpus's epoch ``j // N`` order;
replay slot ``j`` reads the replay corpus's order likewise (its own seed ``seed + 1``), both in the documented
per-epoch order of :mod:`raycpt.data.stream`. Every slot's kind and block is arithmetic in ``p``, so a
resume after ``c`` micro-batches reads exactly what the uninterrupted run would, and each corpus's blocks
are read once per epoch of that corpus.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterator

import numpy as np

from raycpt.data.stream import DEFAULT_WINDOW, EpochOrder, as_seed

MIX_WINDOW = 64


def _quota(ratio: float, window: int) -> Fraction:
    return Fraction(str(float(ratio))) * int(window)


def replay_before_window(w: int, ratio: float, window: int = MIX_WINDOW) -> int:
    """Replay slots in the windows before window ``w``: ``floor(w * rho * W)``."""
    return math.floor(int(w) * _quota(ratio, window))


def replay_mask(w: int, ratio: float, seed: int, window: int = MIX_WINDOW) -> np.ndarray:
    """Window ``w``'s slots: True = replay (``floor((w+1) q) - floor(w q)`` of them, seeded positions)."""
    k = replay_before_window(w + 1, ratio, window) - replay_before_window(w, ratio, window)
    mask = np.zeros(window, dtype=bool)
    mask[np.random.default_rng([as_seed(seed), 2, int(w)]).permutation(window)[:k]] = True
    return mask


class ReplayMix:
    """The mixed stream's slot kinds and within-corpus indices (cached per window)."""

    def __init__(self, ratio: float, seed: int, window: int = MIX_WINDOW):
        self.ratio, self.seed, self.window = float(ratio), int(seed), int(window)
        self._masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _window(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        if w not in self._masks:
            if len(self._masks) > 64:
                self._masks.clear()
            mask = replay_mask(w, self.ratio, self.seed, self.window)
            self._masks[w] = (mask, np.concatenate([[0], np.cumsum(mask)[:-1]]))
        return self._masks[w]

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(is_replay, index)``: each position's kind and its number among the slots of that kind."""
        positions = np.asarray(positions, dtype=np.int64)
        is_r = np.empty(len(positions), dtype=bool)
        idx = np.empty(len(positions), dtype=np.int64)
        for n, p in enumerate(positions):
            w, off = divmod(int(p), self.window)
            mask, before = self._window(w)
            r = replay_before_window(w, self.ratio, self.window) + int(before[off])
            is_r[n] = bool(mask[off])
            idx[n] = r if is_r[n] else int(p) - r
        return is_r, idx


class _Orders:
    """Block ids of a corpus's stream index ``j`` (epoch ``j // N``, position ``j % N``)."""

    def __init__(self, source, seed: int, window: int):
        self.source, self.seed, self.window = source, seed, window
        self._order: tuple[int, EpochOrder] | None = None

    def ids(self, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.source.num_blocks
        epochs, pos = np.asarray(j) // n, np.asarray(j) % n
        out = np.empty(len(pos), dtype=np.int64)
        for e in np.unique(epochs):
            if self._order is None or self._order[0] != int(e):
                self._order = (int(e), EpochOrder(self.source.counts, self.seed, int(e), self.window))
            sel = epochs == e
            out[sel] = self._order[1].ids(pos[sel])
        return out, epochs


def iter_mixed_micro_batches(primary, replay, mbs: int, *, ratio: float, rank: int = 0, world: int = 1,
                             seed: int = 0, window: int = DEFAULT_WINDOW, skip: int = 0,
                             mix_window: int = MIX_WINDOW, with_kinds: bool = False) -> Iterator[tuple]:
    """Endless ``(epoch, int64 (mbs, seq_len) rows)`` of rank ``rank`` in the mixed stream (module
    docstring), starting after ``skip`` micro-batches of this rank; ``epoch`` is the primary corpus's epoch
    of the micro-batch's last primary block. ``with_kinds``: also the per-row replay flags (tests)."""
    mix = ReplayMix(ratio, seed, mix_window)
    prim, rep = _Orders(primary, seed, window), _Orders(replay, int(seed) + 1, window)
    c, base, epoch = int(skip), np.arange(mbs, dtype=np.int64), 0
    while True:
        is_r, idx = mix.slots((c * world + rank) * mbs + base)
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        if (~is_r).any():
            ids, epochs = prim.ids(idx[~is_r])
            parts.append((np.nonzero(~is_r)[0], primary.rows(ids)))
            epoch = int(epochs[-1])
        if is_r.any():
            ids, _ = rep.ids(idx[is_r])
            parts.append((np.nonzero(is_r)[0], replay.rows(ids)))
        width = parts[0][1].shape[1]
        rows = np.empty((mbs, width), dtype=np.int64)
        for where, r in parts:
            rows[where] = r
        yield (epoch, rows, is_r) if with_kinds else (epoch, rows)
        c += 1
