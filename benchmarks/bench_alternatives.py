#!/usr/bin/env python
"""Do the alternatives cost what they promise? LISA and LoRA against ``full`` and ``train_shallow`` at the same
trainable count, and the layer selectors' scan against one trace, side by side in one run.

On the default model (``configs/default.yaml``: SmolLM2-135M, 30 layers, from the cache), on this CPU:

1. **Peak memory and step time** of ``lisa`` (gamma = ``--gamma`` 2, one draw), ``lora`` (r = ``--rank`` 16,
   alpha 32, every linear module of every layer), ``full``, and ``train_shallow`` at the split whose trainable
   count is nearest LISA's and LoRA's (``b`` = nearest whole number of layers, 1..N-1). Each case in a fresh
   subprocess (peak RSS is per process), as ``bench_memory.py`` does: the model built from its config in
   float32, raycpt's own plan code (``apply_plan``, ``inject_lora``, ``LayerPlan.at_step``, ``FrozenPrefix``,
   ``make_optimizer``, ``train_step``), the kernel's peak mark reset before the model is built, ``--steps``
   optimizer steps of ``--batch`` blocks of ``data.seq_len`` tokens; measured = peak RSS minus the RSS before the
   model (weights, gradients, AdamW state, activations, allocator slack), step time = the median wall time of
   the steps after the first. ``RESULT lisa_memory_ratio <lisa/full> target <= 0.6``,
   ``RESULT lora_memory_ratio <lora/full> target <= 0.5``.
2. **Selector scan against one trace**: Block Influence on ``select.samples`` corpus blocks plus the weight SNR
   of every layer (:mod:`raycpt.diagnostics.selectors`, as ``raycpt select`` computes them, minus MLflow), against
   the trace's per-prompt computation on the default prompt set (``TraceActor`` called in this process on the
   trace's batches: no Ray start, no actor pool, which makes the trace *faster* than ``raycpt trace`` and the
   ratio harder to meet). Wall time each, in this process.
   ``RESULT selector_time_ratio <(bi + snr) / trace> target <= 0.5``.

The step's shape is the default config's (``train.micro_batch_size`` blocks of ``data.seq_len`` tokens: 4 x 64),
the shape the embedded default trains at. Activation memory is the same for every plan (every plan back-propagates
through the whole stack), so a larger shape moves every ratio towards 1: at ``--batch 2 --seq 256`` activations are
about 1 GB and the ratios were 0.62 (LISA) and 0.68 (LoRA) (measured under load); ``train.activation_checkpointing``
recomputes activations instead of keeping them (not measured here).

Figures on a shared machine are under load (the load average is printed with them).

Run: ``python benchmarks/bench_alternatives.py [--batch 2] [--steps 3] [--threads 2] [--jobs 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _rss import reset_peak as _reset_peak, rss_kb as _rss_kb
from _smoke import add_smoke

SMOKE = False


def _cfg(plan: list[str], seq: int, batch: int):
    from raycpt.config import load_config

    model = [f"model.ref={os.environ['BENCH_MODEL']}"] if os.environ.get("BENCH_MODEL") else []
    return load_config(None, [*plan, f"data.seq_len={seq}", *model, f"train.micro_batch_size={batch}"])


def case(plan_words: list[str], seq: int, batch: int, steps: int, threads: int) -> dict:
    """One training case (runs in its own process): peak RSS over the RSS before the model, step times."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from raycpt.models.adapters import inject_lora
    from raycpt.strategies import apply_plan
    from raycpt.train.driver.prepare import prepare_plan, resolve_model_path
    from raycpt.train.worker.steps import FrozenPrefix, make_optimizer, make_scheduler, train_step
    from raycpt.train.worker.step_options import loss_chunk_tokens

    torch.set_num_threads(threads)
    cfg = _cfg(plan_words, seq, batch)
    path = resolve_model_path(cfg)
    plan, _, skeleton = prepare_plan(cfg, path)
    conf = AutoConfig.from_pretrained(path)
    del skeleton
    base = _rss_kb("VmRSS")
    _reset_peak()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf).train()
    model.config.use_cache = False
    if plan.adapter == "lora":
        inject_lora(model, plan)
    step_plan = plan.at_step(1)  # LISA: the first interval's draw (the loop does the same)
    apply_plan(model, step_plan)
    prefix = FrozenPrefix(model, plan)
    chunk = loss_chunk_tokens(cfg.train, model, 1)
    opt = make_optimizer(model, step_plan, cfg.train)
    sched = make_scheduler(opt, cfg.train)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        ids = torch.randint(0, conf.vocab_size, (batch, seq), generator=g)
        t0 = time.perf_counter()
        train_step(model, opt, sched, [ids], precision="fp32", chunk_tokens=chunk)
        times.append(time.perf_counter() - t0)
    peak = (_rss_kb("VmHWM") - base) * 1024
    prefix.remove()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"plan": " ".join(plan_words), "measured": peak, "trainable": trainable,
            "step_s": statistics.median(times[1:] or times), "layers": list(step_plan.trainable_layers)}


def _sub(args: list[str]) -> dict:
    if SMOKE:  # in this process: no interpreter start per case (peak RSS then means little)
        i = args.index("--case")
        return case(json.loads(args[i + 1]), int(args[i + 2]), int(args[i + 3]), int(args[i + 4]), 1)
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def layer_sizes(seq: int) -> tuple[list[int], int]:
    """Parameters per decoder layer and the layer count, from a weightless copy of the model."""
    from raycpt.models.stack import LayerStack
    from raycpt.train.driver.prepare import model_skeleton, resolve_model_path

    stack = LayerStack.of(model_skeleton(resolve_model_path(_cfg([], seq, 1))))
    return [sum(p.numel() for p in layer.parameters()) for layer in stack.layers], stack.num_layers


def shallow_split_for(count: int, sizes: list[int]) -> int:
    """The b in 1..N-1 whose train_shallow trainable count (layers 0..b-1) is nearest ``count``."""
    totals = [sum(sizes[:b]) for b in range(1, len(sizes))]
    return 1 + min(range(len(totals)), key=lambda i: (abs(totals[i] - count), i))


def selector_vs_trace(samples: int, max_prompts, threads: int) -> dict:
    """Wall seconds of bi + snr (as ``raycpt select`` computes them) and of one trace's computation."""
    import torch

    from raycpt.diagnostics.prompts import pad_id_of
    from raycpt.diagnostics.selectors import block_influence, weight_snr
    from raycpt.jobs.select import corpus_blocks
    from raycpt.jobs.trace import TraceActor, _dataset_items, prepare_trace
    from raycpt.models.sources import load_model
    from raycpt.models.stack import LayerStack

    torch.set_num_threads(threads)
    over = [f"select.samples={samples}"] + ([f"trace.max_prompts={max_prompts}"] if max_prompts else [])
    cfg = _cfg(over, 128, 1)
    prep = prepare_trace(cfg)
    t0 = time.perf_counter()
    model, tok = load_model(prep.model_path, dtype="float32", device="cpu")
    layers = LayerStack(model).layers
    blocks = corpus_blocks(cfg, tok)
    for s in range(0, len(blocks), 4):
        block_influence(model, layers, [(torch.as_tensor(blocks[s:s + 4], dtype=torch.long), None)])
    weight_snr(layers)
    scan = time.perf_counter() - t0
    t = prep.cfg.trace
    t0 = time.perf_counter()
    actor = TraceActor(prep.model_path, top_k=t.top_k, eps=t.eps, pad_id=pad_id_of(prep.tokenizer),
                       schedule=t.schedule)
    items = _dataset_items(prep.encoded)
    for s in range(0, len(items), t.batch_size):
        part = items[s:s + t.batch_size]
        actor({k: [it[k] for it in part] for k in ("index", "input_ids", "context", "last")})
    trace = time.perf_counter() - t0
    return {"scan_s": scan, "trace_s": trace, "blocks": len(blocks), "prompts": len(items)}


def _result(name: str, value: float, target: float) -> None:
    print(f"RESULT {name} {value:.3f} target <= {target:g} {'PASS' if value <= target else 'FAIL'}", flush=True)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=None, help="blocks per step (default: the default config's "
                    "train.micro_batch_size)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per block (default: its data.seq_len)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2, help="training cases run at once (each its own process)")
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16, help="bi: corpus blocks (select.samples)")
    ap.add_argument("--max-prompts", type=int, default=None, help="trace prompts (default: the whole set)")
    ap.add_argument("--case", nargs=4, metavar=("PLAN_JSON", "SEQ", "BATCH", "STEPS"), help=argparse.SUPPRESS)
    add_smoke(ap)
    return ap.parse_args()


def main() -> None:
    global SMOKE
    a = _args()
    if a.case:
        print(json.dumps(case(json.loads(a.case[0]), int(a.case[1]), int(a.case[2]), int(a.case[3]), a.threads)))
        return
    if a.smoke:
        from _smoke import tiny_model_dir

        SMOKE, a.seq, a.steps, a.jobs, a.samples, a.max_prompts, a.rank = True, 32, 2, 1, 4, 8, 4
        os.environ["BENCH_MODEL"] = tiny_model_dir()
        print("smoke mode: the tiny model, seq_len 32, 2 steps, cases in this process (numbers are not the claim)")
    from raycpt.config import load_config

    default = load_config(Path(__file__).resolve().parents[1] / "configs" / "default.yaml", [])  # the embedded default's step: 4 x 64
    a.seq = a.seq or default.data.seq_len
    a.batch = a.batch or default.train.micro_batch_size
    print(f"shape: {a.batch} blocks x {a.seq} tokens per step")
    t0 = time.time()
    sizes, n = layer_sizes(a.seq)
    run = ["--batch", str(a.batch), "--threads", str(a.threads)]

    def job(words):
        return [*run, "--case", json.dumps(words), str(a.seq), str(a.batch), str(a.steps)]

    first = {"full": ["plan.name=full"], "lisa": ["plan.name=lisa", f"plan.lisa_layers={a.gamma}"],
             "lora": ["plan.name=full", "plan.full_non_layers=false", "plan.adapter=lora", f"plan.lora_rank={a.rank}"]}
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = dict(zip(first, pool.map(_sub, [job(w) for w in first.values()])))
        same = {f"shallow@{k}": shallow_split_for(rows[k]["trainable"], sizes) for k in ("lisa", "lora")}
        more = {k: ["plan.name=train_shallow", f"plan.split={b}/{n}"] for k, b in same.items()}
        rows.update(zip(more, pool.map(_sub, [job(w) for w in more.values()])))
    print(f"{'case':14s} {'plan':70s} {'trainable':>11s} {'peak MB':>8s} {'step s':>7s}")
    for k, r in rows.items():
        print(f"{k:14s} {r['plan']:70s} {r['trainable']:11,d} {r['measured'] / 1e6:8.0f} {r['step_s']:7.2f}")
    sel = selector_vs_trace(a.samples, a.max_prompts, a.threads)
    print(f"selector scan (bi on {sel['blocks']} blocks + snr of {n} layers) {sel['scan_s']:.1f}s; one trace "
          f"({sel['prompts']} prompts, in-process) {sel['trace_s']:.1f}s")
    print(f"wall {time.time() - t0:.0f}s, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(figures under load on a shared machine)")
    _result("lisa_memory_ratio", rows["lisa"]["measured"] / rows["full"]["measured"], 0.6)
    _result("lora_memory_ratio", rows["lora"]["measured"] / rows["full"]["measured"], 0.5)
    _result("selector_time_ratio", sel["scan_s"] / sel["trace_s"], 0.5)


if __name__ == "__main__":
    main()
