"""The training loop in N local processes over gloo, without Ray: the path raycpt's FSDP/DDP tests take.

:class:`GlooSession` is :class:`~raycpt.train.worker.session.LocalSession` (blocks from an array, checkpoints in a
folder) on a rank of the default process group: its collectives (a ``Collectives`` it owns) are torch.distributed's, rank 0
picks the newest verified checkpoint under ``checkpoint_root`` and broadcasts it. :func:`spawn`
starts ``world`` processes (``torch.multiprocessing``), each runs ``fn(rank, world, *args)`` with the
process group up. Wrapping is the same :func:`raycpt.train.worker.parallel.wrap_model` a Ray Train worker
uses; only process start and checkpoint storage differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from raycpt.train.worker.loop import run_loop
from raycpt.train.worker.session import Collectives, LocalSession, newest_checkpoint


class GlooSession(LocalSession):
    """One rank of a local process group (see the module docstring)."""

    def __init__(self, blocks: np.ndarray, checkpoint_root: Optional[Path] = None):
        import torch.distributed as dist

        super().__init__(blocks, checkpoint_root)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_world_size = self.world_size
        self.collectives = Collectives(self.world_size)

    @contextlib.contextmanager
    def checkpoint_dir(self, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None):
        root = checkpoint_root or (str(self.root) if self.root else None)
        best = newest_checkpoint(None, root, resume_from) if self.rank == 0 else None
        yield self.all_gather_object(best)[0]

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        super().report(metrics, ckpt_dir, step)
        self.barrier()  # the checkpoint is in place before any rank goes on (as Ray's report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, threads: int, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world: int, *args, threads: int = 1) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes over gloo; raises when one fails or dies
    (``torch.multiprocessing.ProcessExitedException`` for a killed one). ``fn`` must be importable."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(world, free_port(), threads, fn, args), nprocs=world, join=True)


def run_jobs(rank: int, world: int, jobs: list[dict]) -> None:
    """Each job ``{"spec": WorkerSpec, "blocks": path of a .npy, "checkpoint_root", "out": json path}``
    runs :func:`raycpt.train.worker.loop.run_loop` on this rank; rank 0 writes the summary to ``out``."""
    for job in jobs:
        session = GlooSession(np.load(job["blocks"]), Path(job["checkpoint_root"]))
        out = run_loop(job["spec"], session)
        if rank == 0 and job.get("out"):
            Path(job["out"]).write_text(json.dumps({k: out[k] for k in ("status", "losses", "counts")}))
