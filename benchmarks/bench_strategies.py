#!/usr/bin/env python
"""Does freezing save compute? Step time and peak memory of train_shallow / train_deep vs full.

On the default model (SmolLM2-135M), with the same batches for every plan (equal tokens), the
plans ``full``, ``train_shallow`` and ``train_deep`` (split 0.5) run interleaved in one process:
``--rounds`` rounds, each running every plan for one untimed warm-up step (it allocates the AdamW
state) and ``--steps`` timed steps, through raycpt's own step code (:func:`apply_plan`,
:class:`FrozenPrefix`, :func:`make_optimizer`, :func:`train_step`). A plan's time is the median
over its timed steps; the measured ratio is plan / full.

The FLOP model's prediction (per token; a module's forward cost F = W + A, with W = 2 x its weight
count for the weight matmuls and A = its attention-score matmuls, 2 x seq x heads x head_dim for
causal attention):

* forward: every layer and the head (F);
* activation gradients: from the head down to the first trainable module, each W + 2A (both
  operands of a score matmul need a gradient);
* weight gradients: trainable modules only, W each (the head's when the head trains; with tied
  embeddings ``full`` trains it);
* optimizer step and the embedding lookup are left out (memory-bound and small).

``predicted = cost(plan) / cost(full)``; the target is ``measured / predicted <= 1.10`` (freezing
delivers the saving the arithmetic promises). The paper (seeds/004, appendix A, Table 7) reports
112 h and 107 h against 141 h for full: 0.79 and 0.76.

Timing uses this process's CPU time per step (``time.process_time``) with one torch thread
(``--threads 1``): on the shared 2-core machine the wall clock mostly measures the other users (load
average often above 10), and with two threads a descheduled thread leaves the other spinning, so
CPU time then swings too; one thread's CPU time counts the work done. Wall-clock ratios are printed
next to it. On a GPU, wall time with ``torch.cuda.synchronize`` is used instead.

Peak memory: each plan runs in a fresh subprocess (``--memory``, default on) that loads the model,
resets the kernel's peak-RSS mark (``/proc/self/clear_refs``), runs 2 steps and reports the growth
of its peak RSS over the RSS after loading (CPU) or
``torch.cuda.max_memory_allocated`` (GPU): gradients, optimizer state and activations kept for
backward. Printed as MB and as a ratio to full.

Prints::

    RESULT strategy_time_train_shallow <measured/predicted> target <= 1.10 PASS|FAIL
    RESULT strategy_time_train_deep <measured/predicted> target <= 1.10 PASS|FAIL

Run: ``python benchmarks/bench_strategies.py [--model REF] [--rounds 3] [--steps 2] [--batch 2] [--seq-len 128]
[--threads 1] [--no-memory]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

from _smoke import add_smoke, smoke

PLANS = {"full": dict(name="full"), "train_shallow": dict(name="train_shallow", split=0.5),
         "train_deep": dict(name="train_deep", split=0.5)}


def flop_cost(model, plan, seq_len: int) -> float:
    """Per-token training FLOPs of one step under ``plan`` (see the module docstring)."""
    from raycpt.models.stack import LayerStack

    stack = LayerStack(model)
    conf = model.config
    heads = conf.num_attention_heads
    head_dim = getattr(conf, "head_dim", None) or conf.hidden_size // heads
    attn = 2 * seq_len * heads * head_dim  # QK^T and AV, causal: half of 2 x 2 x seq x H x dh
    n = stack.num_layers
    w_layer = [2 * sum(p.numel() for p in layer.parameters()) for layer in stack.layers]
    w_head = 2 * stack.head.weight.numel()
    trains = set(plan.trainable_layers)
    first = plan.first_trainable
    cost = sum(w + attn for w in w_layer) + w_head  # forward
    if first is None:
        return cost
    cost += w_head  # activation gradient at the head (always needed when anything below it trains)
    for i in range(n - 1, -1, -1):
        if first > i:
            break
        cost += w_layer[i] + 2 * attn  # activation gradients down to the first trainable module
        if i in trains:
            cost += w_layer[i]  # weight gradients
    if plan.train_head:
        cost += w_head
    return float(cost)


def run_steps(model, plan, tcfg, batches, steps: int, device) -> list[tuple[float, float]]:
    from raycpt.strategies import apply_plan
    from raycpt.train.worker.steps import FrozenPrefix, make_optimizer, make_scheduler, train_step

    apply_plan(model, plan)
    prefix = FrozenPrefix(model, plan)
    opt = make_optimizer(model, plan, tcfg)
    sched = make_scheduler(opt, tcfg)
    out = []
    try:
        for j in range(steps + 1):
            mb = [batches[j % len(batches)].to(device)]
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, opt, sched, mb, precision="auto", device=device)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if j > 0:  # step 0 allocates the optimizer state
                out.append((time.perf_counter() - t0, time.process_time() - c0))
    finally:
        prefix.remove()
        del opt
    return out


def load(args):
    from raycpt.config import ModelConfig
    from raycpt.models.sources import load_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = load_model(args.model or ModelConfig().ref, dtype="float32", device=str(device))
    model.train()
    model.config.use_cache = False
    return model, tok, device


def make_batches(tok, args, n: int):
    from raycpt.data.corpus import eos_id_of, iter_documents, pack_token_lists

    docs = list(iter_documents(["builtin:wordnet-glosses"], max_documents=4000))
    blocks = pack_token_lists(tok(docs, add_special_tokens=False)["input_ids"], args.seq_len, eos_id_of(tok))
    need = n * args.batch
    assert len(blocks) >= need, f"only {len(blocks)} blocks"
    return [torch.from_numpy(blocks[i * args.batch:(i + 1) * args.batch].astype("int64")) for i in range(n)]


def memory_child(args) -> None:
    """Subprocess: peak memory growth of 2 steps of one plan."""
    from raycpt.config import PlanConfig, TrainConfig
    from raycpt.strategies import plan_for_model

    model, tok, device = load(args)
    batches = make_batches(tok, args, 3)
    plan = plan_for_model(PlanConfig(**PLANS[args.memory_child]), model)
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_now()
        _reset_peak_rss()  # loading the model peaked higher than training may; measure the steps only
    run_steps(model, plan, TrainConfig(max_steps=100), batches, 2, device)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else _peak_rss()
    print(json.dumps({"plan": args.memory_child, "peak_growth_bytes": peak - base}))


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Linux: writing 5 to /proc/self/clear_refs resets the peak RSS (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model reference or folder (default: the embedded SmolLM2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per plan per round")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads on CPU (1: CPU time is then robust to other users; 0 = torch's default)")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    add_smoke(ap)
    args = smoke(ap.parse_args(), rounds=1, steps=1, batch=1, seq_len=32, memory=False)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        return memory_child(args)

    from raycpt.config import PlanConfig, TrainConfig
    from raycpt.strategies import plan_for_model

    t_all = time.time()
    model, tok, device = load(args)
    plans = {k: plan_for_model(PlanConfig(**v), model) for k, v in PLANS.items()}
    batches = make_batches(tok, args, args.steps + 1)
    tcfg = TrainConfig(max_steps=10_000)  # the schedule is irrelevant to timing
    use_cpu_time = device.type == "cpu"
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in plans}
    print(f"model {type(model).__name__} ({plans['full'].num_layers} layers), batch {args.batch} x {args.seq_len} "
          f"tokens, {args.rounds} rounds x {args.steps} steps, device {device}, torch threads {torch.get_num_threads()}")
    for r in range(args.rounds):
        for name, plan in plans.items():
            times[name] += run_steps(model, plan, tcfg, batches, args.steps, device)
            wall, cpu = times[name][-1]
            print(f"  round {r + 1} {name:14s} last step wall {wall:6.2f}s cpu {cpu:6.2f}s", flush=True)

    def med(name, idx):
        return statistics.median(t[idx] for t in times[name])

    idx = 1 if use_cpu_time else 0
    cost_full = flop_cost(model, plans["full"], args.seq_len)
    mem = {}
    if args.memory:
        for name in plans:
            out = subprocess.run([sys.executable, __file__, "--memory-child", name, "--batch", str(args.batch),
                                  "--seq-len", str(args.seq_len)] + (["--model", args.model] if args.model else []),
                                 capture_output=True, text=True, timeout=1800)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            mem[name] = json.loads(line[-1])["peak_growth_bytes"] if line else float("nan")
    print(f"{'plan':14s} {'trainable':>12s} {'time (' + ('cpu' if use_cpu_time else 'wall') + ')':>11s} "
          f"{'wall':>8s} {'measured':>9s} {'wall ratio':>10s} {'FLOP model':>10s} {'meas/pred':>9s} "
          f"{'peak mem':>9s} {'mem ratio':>9s}")
    results = {}
    for name, plan in plans.items():
        ratio = med(name, idx) / med("full", idx)
        wall_ratio = med(name, 0) / med("full", 0)
        pred = flop_cost(model, plan, args.seq_len) / cost_full
        results[name] = (ratio, pred)
        m = mem.get(name)
        mtxt = f"{m / 2**20:8.0f}M" if m is not None and m == m else "     n/a"
        mr = f"{m / mem['full']:9.2f}" if m is not None and mem.get("full") else "      n/a"
        from raycpt.strategies import apply_plan

        counts = apply_plan(model, plan)
        print(f"{name:14s} {counts['trainable']:12,d} {med(name, idx):10.3f}s {med(name, 0):7.3f}s {ratio:9.3f} "
              f"{wall_ratio:10.3f} {pred:10.3f} {ratio / pred:9.3f} {mtxt} {mr}")
    print(f"paper (seeds/004 Table 7): train_shallow 112h/141h = 0.79, train_deep 107h/141h = 0.76; "
          f"total {time.time() - t_all:.0f}s")
    for name in ("train_shallow", "train_deep"):
        ratio, pred = results[name]
        v = ratio / pred
        print(f"RESULT strategy_time_{name} {v:.3f} target <= 1.10 {'PASS' if v <= 1.10 else 'FAIL'}")


if __name__ == "__main__":
    main()
