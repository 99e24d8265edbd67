#!/usr/bin/env python
"""What does Ray Train cost? Tokens/s of the TorchTrainer with one worker vs the same loop in a plain process.

Both sides run raycpt's one training loop (:func:`raycpt.train.worker.loop.run_loop`) with the same
config, model, plan and blocks:

* **plain**: ``run_loop(spec, LocalSession(blocks))`` in this process: no Ray at all, the blocks
  come from a numpy array;
* **ray**: a ``TorchTrainer`` with one worker (``ScalingConfig(num_workers=1,
  resources_per_worker={"CPU": 1})``) running ``train_loop_per_worker``, reading the packed-token
  store memory-mapped (the same blocks: the plain side holds the store's blocks in an array; both
  read them in the same seeded order), reporting checkpoints to Ray storage.

Runs go plain, ray, plain (``--reps`` times ray): the plain figure is the mean of the runs around
each ray run. Each run's throughput is the median over its steps after the first three (warm-up:
a fresh worker's data iterator and Ray threads start then; a one-off cost, not throughput) of
``tokens per step / step time``, read from the loop's own per-step records. Reported on this
process's CPU time per step (the loop records ``time.process_time`` per step; on the shared 2-core
machine the wall clock mostly measures the other users) with one torch thread on both sides
(``--threads 1``: with two, a descheduled thread leaves the other spinning and CPU time swings too)
and, for reference, on wall time.
Start-up costs (``ray.init``, worker start, model load) are not in tokens/s; their wall seconds
are printed.

Prints::

    RESULT ray_overhead <ray tokens/s / plain tokens/s> target >= 0.95 PASS|FAIL

Run: ``python benchmarks/bench_ray_overhead.py [--model REF] [--steps 12] [--batch 2] [--seq-len 128]
[--plan train_shallow] [--reps 1] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _smoke import add_smoke, smoke


WARMUP = 3


def throughput(records: list[dict], tokens_per_step: int) -> tuple[float, float]:
    recs = [r for r in records if "loss" in r][WARMUP:]  # steady state: skip the warm-up steps
    cpu = statistics.median(tokens_per_step / r["step_cpu_s"] for r in recs)
    wall = statistics.median(tokens_per_step / r["step_time_s"] for r in recs)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model reference or folder (default: the embedded SmolLM2)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--plan", default="train_shallow")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in both loops (1: CPU time is robust "
                                                         "to other users of a shared machine)")
    add_smoke(ap)
    args = smoke(ap.parse_args(), steps=WARMUP + 2, batch=1, seq_len=32, reps=1)  # the warm-up steps are not timed

    import numpy as np
    import ray

    from raycpt.config import RayConfig, load_config
    from raycpt.data.pack import ensure_packed
    from raycpt.data.stream import PackedBlocks
    from raycpt.runtime import init_ray
    from raycpt.train.driver.prepare import prepare_plan, resolve_model_path
    from raycpt.train.worker.loop import run_loop, train_loop_per_worker
    from raycpt.train.worker.metrics_log import METRICS_FILE
    from raycpt.train.worker.session import LocalSession
    from raycpt.train.worker.spec import StoreRef, WorkerSpec

    work = Path(tempfile.mkdtemp(prefix="bench-ray-overhead-"))
    over = [f"plan.name={args.plan}", f"data.seq_len={args.seq_len}", f"train.max_steps={args.steps}",
            f"train.micro_batch_size={args.batch}", f"train.checkpoint_every={args.steps}", "train.num_workers=1",
            "train.cpus_per_worker=1", "data.max_documents=3000"]
    if args.model:
        over.append(f"model.ref={args.model}")
    cfg = load_config(None, over)
    t0 = time.time()
    init_ray(RayConfig())
    t_init = time.time() - t0
    model_path = resolve_model_path(cfg)
    plan, counts, _ = prepare_plan(cfg, model_path)
    store, _ = ensure_packed(cfg.data, model_path, work)
    n = store.num_blocks
    blocks = PackedBlocks(store.path, store.manifest).rows(np.arange(n))
    tokens_per_step = args.batch * args.seq_len

    def config(run_dir: Path) -> WorkerSpec:
        return WorkerSpec(cfg=cfg, model_path=model_path, plan=plan, run_dir=str(run_dir), store=StoreRef.of(store),
                          torch_threads=args.threads)

    def plain(i: int) -> tuple[float, float, float]:
        d = work / f"plain{i}"
        t = time.time()
        run_loop(config(d), LocalSession(blocks, d / "ckpt"))
        recs = [json.loads(x) for x in (d / METRICS_FILE).read_text().splitlines()]
        return (*throughput(recs, tokens_per_step), time.time() - t)

    def with_ray(i: int) -> tuple[float, float, float]:
        from ray.train import CheckpointConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        d = work / f"ray{i}"
        t = time.time()
        TorchTrainer(train_loop_per_worker, train_loop_config={"spec": config(d)},
                     scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                     run_config=RunConfig(name=f"bench-{i}", storage_path=str(work / "ray"),
                                          checkpoint_config=CheckpointConfig(num_to_keep=1))).fit()
        recs = [json.loads(x) for x in (d / METRICS_FILE).read_text().splitlines()]
        return (*throughput(recs, tokens_per_step), time.time() - t)

    print(f"model {model_path}, plan {plan.name} ({counts['trainable']:,} trainable), {args.steps} steps of "
          f"{tokens_per_step} tokens; ray.init {t_init:.1f}s; corpus {n} blocks; cores {os.cpu_count()}")
    plains, rays = [plain(0)], []
    print(f"  plain: {plains[-1][0]:8.1f} tok/s (cpu)  {plains[-1][1]:8.1f} tok/s (wall)  run {plains[-1][2]:.0f}s",
          flush=True)
    for i in range(args.reps):
        rays.append(with_ray(i))
        print(f"  ray  : {rays[-1][0]:8.1f} tok/s (cpu)  {rays[-1][1]:8.1f} tok/s (wall)  run {rays[-1][2]:.0f}s "
              "(incl. worker start)", flush=True)
        plains.append(plain(i + 1))
        print(f"  plain: {plains[-1][0]:8.1f} tok/s (cpu)  {plains[-1][1]:8.1f} tok/s (wall)  run {plains[-1][2]:.0f}s",
              flush=True)
    ratios_cpu = [r[0] / ((plains[i][0] + plains[i + 1][0]) / 2) for i, r in enumerate(rays)]
    ratios_wall = [r[1] / ((plains[i][1] + plains[i + 1][1]) / 2) for i, r in enumerate(rays)]
    v = statistics.mean(ratios_cpu)
    print(f"ray / plain tokens/s: cpu-time {v:.3f}, wall-clock {statistics.mean(ratios_wall):.3f}")
    ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    print(f"RESULT ray_overhead {v:.3f} target >= 0.95 {'PASS' if v >= 0.95 else 'FAIL'}")


if __name__ == "__main__":
    main()
