"""Rank functions for tests that run torch.distributed over gloo in processes of
:func:`raycpt.train.worker.gloo.spawn` (a module of its own: the spawned children import it by name)."""

from __future__ import annotations

import time

import torch


def late_gloo_record_under_sdpa_probe(rank: int, world: int, rounds: int) -> None:
    """DDP's pattern inside :func:`raycpt.train.worker.step_options.sdpa_probe`, with the window made wide: an async
    gloo all-reduce whose future is waited on (as DDP's reducer waits on its buckets), a callback on that future that
    holds the gloo worker thread (``pt_gloo_runloop``) between completing the future and ending the work's profiler
    record, then the probe closes. Afterwards gloo allocates on its threads (all-gathers of many sizes), so a write
    into the profiler's freed storage shows as a SIGSEGV (freed blocks of 64 KiB and more are unmapped when the caller
    sets ``MALLOC_MMAP_THRESHOLD_=65536``)."""
    import torch.distributed as dist

    from raycpt.train.worker.step_options import sdpa_probe

    t = torch.ones(1024)
    for _ in range(rounds):
        with sdpa_probe():
            fut = dist.all_reduce(t, async_op=True).get_future()
            fut.then(lambda f: time.sleep(0.3))  # runs on pt_gloo_runloop before the work's record ends
            fut.wait()  # returns when the future completes, not when the work has finished
        time.sleep(0.6)  # the gloo thread ends the record now
        for k in range(50):
            n = 16 * (1 + (k * 37) % 900)
            out = [torch.empty(n) for _ in range(world)]
            dist.all_gather(out, torch.full((n,), float(rank)))
    dist.barrier()
