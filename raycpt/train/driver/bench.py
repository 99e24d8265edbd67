"""This machine's training speed, in a unit readers can compare with their own: tokens per second of
one ``full`` optimizer step (forward, backward, clip, AdamW) of the default model, the step a trial of
the README's main job runs (``configs/default.yaml``: 4 sequences x 64 tokens), in this process with
the threads a single training worker gets (all cores). ``raycpt --version --bench`` prints it; the
README and docs give every wall time next to this figure.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Optional

import torch

from raycpt.config import ExperimentConfig, PlanConfig, load_config
from raycpt.models.sources import resolve_model_path
from raycpt.models.stack import tied_embeddings
from raycpt.strategies import apply_plan, build_plan
from raycpt.train.worker.steps import clip_and_norm, forward_backward, make_optimizer, trainable_params

MAIN_JOB_BATCH = (4, 64)
"""(micro batch, seq_len) of one step of the README's main job (configs/default.yaml)."""


def full_step_speed(cfg: Optional[ExperimentConfig] = None, steps: int = 3, warmup: int = 1,
                    batch: tuple[int, int] = MAIN_JOB_BATCH, threads: Optional[int] = None) -> dict:
    """Time ``warmup + steps`` full-plan AdamW steps on random tokens; the median step gives tokens/s."""
    from transformers import AutoModelForCausalLM

    cfg = cfg or load_config(None, [])
    threads = threads or max(1, os.cpu_count() or 1)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        path = resolve_model_path(cfg.model, progress=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.config.use_cache = False
        model.train()
        n_layers = int(model.config.num_hidden_layers)
        tied = tied_embeddings(model.config)
        plan = build_plan(dataclasses.replace(PlanConfig(), name="full"), n_layers, tied_embeddings=tied)
        apply_plan(model, plan)
        optimizer = make_optimizer(model, plan, cfg.train)
        params = trainable_params(model)
        mbs, seq = batch
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, int(model.config.vocab_size), (mbs, seq), generator=gen)
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            forward_backward(model, [ids], "fp32", torch.device("cpu"))
            clip_and_norm(model, params, cfg.train.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old_threads)
    step_s = statistics.median(times)
    return {"tokens_per_s": mbs * seq / step_s, "step_s": step_s, "tokens_per_step": mbs * seq, "threads": threads,
            "model": cfg.model.ref, "num_layers": n_layers, "steps": steps, "warmup": warmup}


def speed_line(speed: dict) -> str:
    name = speed["model"].rsplit("/", 1)[-1]
    return (f"training speed: {speed['tokens_per_s']:.0f} tokens/s (one `full` AdamW step of {name}, "
            f"{speed['tokens_per_step']} tokens, fp32, {speed['threads']} threads; median of {speed['steps']} "
            f"after {speed['warmup']} warm-up; {speed['step_s']:.2f} s per step)")


def bench_line() -> str:
    return speed_line(full_step_speed())
