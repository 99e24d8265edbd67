#!/usr/bin/env python
"""Does the memory estimate hold, and do the chunked loss and activation checkpointing save what they promise?

On the default model (SmolLM2-135M: 30 layers, hidden 576, vocabulary 49,152, tied embeddings), on
this CPU, in one run:

1. **Estimate against a real step**, for ``full``, ``train_shallow`` and ``train_deep`` (split 0.5)
   at ``data.seq_len`` 256 and 1024 (``--batch`` blocks per micro-step, default 2), each case in a
   fresh subprocess: it imports everything, records its RSS, builds the model from its config in
   float32 (random weights: same bytes as loaded ones, without the loader's file mappings), applies
   the plan with raycpt's own step code (:func:`apply_plan`, :class:`FrozenPrefix`,
   :func:`make_optimizer`, :func:`train_step` with the loss the loop would pick), resets the
   kernel's peak-RSS mark (``/proc/self/clear_refs``) and runs 2 optimizer steps (the first one
   allocates AdamW's state). Measured = peak RSS (``VmHWM``) minus the RSS before the model was
   built, so weights, gradients, optimizer state, activations, logits and allocator slack all count,
   and the interpreter and libraries do not (the estimate has no CPU framework term either). The
   estimate is :func:`raycpt.train.driver.preflight.estimate_plan` of the same config.
   ``RESULT memory_estimate_error <max |est/measured - 1|> target <= 0.20``.
2. **LM head + loss alone**: final hidden states of 4 x 1024 tokens in (random, requiring grad), loss
   and head-weight gradient out; plain (full logits, transformers' ``ForCausalLMLoss``) against
   :func:`raycpt.train.worker.loss.chunked_lm_loss` (1024-token chunks). Memory: each in a fresh
   subprocess, peak RSS over the RSS with the inputs allocated. Time: both in this process,
   interleaved ``--rounds`` times, this process's CPU time (``time.process_time``) with one torch
   thread (the shared machine's wall clock mostly measures the other users), median per variant.
   ``RESULT chunked_loss_memory <chunked/plain> target <= 0.5``,
   ``RESULT chunked_loss_time <chunked/plain> target <= 1.10``.
3. **Activation checkpointing** on ``full`` at seq_len 1024: the measured peak with
   ``train.activation_checkpointing=true`` over the one without (case 1's run).
   ``RESULT activation_checkpointing_memory <on/off> target <= 0.6``.

Cases run ``--jobs`` at a time (default 3), each in its own process (peak RSS is per process).

Run: ``python benchmarks/bench_memory.py [--batch 2] [--rounds 5] [--threads 2] [--jobs 3]``.
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

from _smoke import add_smoke

PLANS = ("full", "train_shallow", "train_deep")
SEQS = (256, 1024)
HEAD = (4, 1024, 576, 49152)  # batch, tokens, hidden, vocab of the LM-head case
SMOKE = False  # --smoke: tiny sizes, the tiny model, every case in this process


from _rss import reset_peak as _reset_peak, rss_kb as _rss_kb  # noqa: E402


def _cfg(plan: str, seq: int, batch: int, ckpt: bool):
    from raycpt.config import load_config

    model = [f"model.ref={os.environ['BENCH_MODEL']}"] if os.environ.get("BENCH_MODEL") else []
    return load_config(None, [f"plan.name={plan}", "plan.split=0.5", f"data.seq_len={seq}", *model,
                              f"train.micro_batch_size={batch}", f"train.activation_checkpointing={str(ckpt).lower()}"])


def case(plan_name: str, seq: int, batch: int, ckpt: bool, threads: int) -> dict:
    """One training-step case (runs in its own process)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from raycpt.strategies import apply_plan
    from raycpt.train.driver.prepare import prepare_plan, resolve_model_path
    from raycpt.train.worker.steps import FrozenPrefix, make_optimizer, make_scheduler, train_step
    from raycpt.train.driver.preflight import estimate_plan
    from raycpt.train.worker.step_options import enable_activation_checkpointing, loss_chunk_tokens

    torch.set_num_threads(threads)
    cfg = _cfg(plan_name, seq, batch, ckpt)
    path = resolve_model_path(cfg)
    plan, _, skeleton = prepare_plan(cfg, path)
    est = estimate_plan(cfg, skeleton, plan)
    conf = AutoConfig.from_pretrained(path)
    del skeleton
    base = _rss_kb("VmRSS")
    _reset_peak()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf).train()
    model.config.use_cache = False
    apply_plan(model, plan)
    prefix = FrozenPrefix(model, plan)
    enable_activation_checkpointing(model, cfg.train)
    chunk = loss_chunk_tokens(cfg.train, model, 1)
    opt = make_optimizer(model, plan, cfg.train)
    sched = make_scheduler(opt, cfg.train)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        ids = torch.randint(0, conf.vocab_size, (batch, seq), generator=g)
        train_step(model, opt, sched, [ids], precision="fp32", chunk_tokens=chunk)
    peak = (_rss_kb("VmHWM") - base) * 1024
    prefix.remove()
    return {"plan": plan_name, "seq": seq, "ckpt": ckpt, "measured": peak, "estimate": est.total,
            "terms": est.terms, "chunk": chunk}


def head_case(kind: str, threads: int) -> dict:
    """LM head + loss alone: peak RSS over the inputs (own process)."""
    import torch

    torch.set_num_threads(threads)
    h, head, y = _head_inputs()
    base = _rss_kb("VmRSS")
    _reset_peak()
    _head_step(kind, h, head, y)
    return {"kind": kind, "measured": (_rss_kb("VmHWM") - base) * 1024}


def _head_inputs():
    import torch

    torch.manual_seed(0)
    b, t, d, v = HEAD
    h = torch.randn(b, t, d, requires_grad=True)
    head = torch.nn.Linear(d, v, bias=False)
    y = torch.randint(0, v, (b, t))
    return h, head, y


def _head_step(kind: str, h, head, y) -> float:
    from raycpt.train.worker.loss import chunked_lm_loss, plain_lm_loss

    h.grad, head.weight.grad = None, None
    loss = plain_lm_loss(h, head, y) if kind == "plain" else chunked_lm_loss(h, head, y, chunk_tokens=HEAD[1])
    loss.backward()
    return float(loss.detach())


def _sub(args: list[str]) -> dict:
    if SMOKE:  # in this process: no interpreter start per case (peak RSS then means little)
        if args[0] == "--head":
            return head_case(args[1], 1)
        return case(args[1], int(args[2]), int(args[args.index("--batch") + 1]), args[3] == "1", 1)
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def _result(name: str, value: float, target: float) -> None:
    print(f"RESULT {name} {value:.3f} target <= {target:g} {'PASS' if value <= target else 'FAIL'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=3, help="cases run at once (each its own process)")
    ap.add_argument("--case", nargs=3, metavar=("PLAN", "SEQ", "CKPT"), help=argparse.SUPPRESS)
    ap.add_argument("--head", choices=("plain", "chunked"), help=argparse.SUPPRESS)
    add_smoke(ap)
    a = ap.parse_args()
    if a.smoke:
        global PLANS, SEQS, HEAD, SMOKE
        from _smoke import tiny_model_dir

        PLANS, SEQS, HEAD, SMOKE, a.rounds, a.jobs = ("full", "train_deep"), (32,), (2, 64, 32, 512), True, 1, 1
        os.environ["BENCH_MODEL"] = tiny_model_dir()
        print("smoke mode: the tiny model, seq_len 32, one round, cases in this process (numbers are not the claim)")
    if a.case:
        print(json.dumps(case(a.case[0], int(a.case[1]), a.batch, a.case[2] == "1", a.threads)))
        return
    if a.head:
        print(json.dumps(head_case(a.head, a.threads)))
        return
    t0 = time.time()
    common = ["--batch", str(a.batch), "--threads", str(a.threads)]
    jobs = [["--case", plan, str(seq), "0", *common] for seq in SEQS for plan in PLANS]
    jobs.append(["--case", "full", str(SEQS[-1]), "1", *common])
    with ThreadPoolExecutor(a.jobs) as pool:  # separate processes: peak RSS is per process
        rows = list(pool.map(_sub, jobs))
    print(f"{'plan':14s} {'seq':>5s} {'ckpt':>4s} {'measured MB':>11s} {'estimate MB':>11s} {'est/meas':>8s}  terms (MB)")
    for r in rows:
        terms = " ".join(f"{k}={v / 1e6:.0f}" for k, v in r["terms"].items())
        print(f"{r['plan']:14s} {r['seq']:5d} {int(r['ckpt']):4d} {r['measured'] / 1e6:11.0f} {r['estimate'] / 1e6:11.0f} "
              f"{r['estimate'] / r['measured']:8.3f}  {terms}")
    heads = {k: _sub(["--head", k, "--threads", str(a.threads)]) for k in ("plain", "chunked")}
    import torch

    torch.set_num_threads(1)
    h, head, y = _head_inputs()
    times: dict[str, list[float]] = {"plain": [], "chunked": []}
    losses = {}
    for _ in range(a.rounds):
        for kind in ("plain", "chunked"):
            c0 = time.process_time()
            losses[kind] = _head_step(kind, h, head, y)
            times[kind].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"LM head + loss on {HEAD[0]}x{HEAD[1]} tokens: plain {heads['plain']['measured'] / 1e6:.0f} MB, {med['plain']:.2f} s CPU; "
          f"chunked {heads['chunked']['measured'] / 1e6:.0f} MB, {med['chunked']:.2f} s CPU; losses {losses['plain']:.6f} "
          f"/ {losses['chunked']:.6f}")
    print(f"wall {time.time() - t0:.0f}s, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    steps = [r for r in rows if not r["ckpt"]]
    _result("memory_estimate_error", max(abs(r["estimate"] / r["measured"] - 1) for r in steps), 0.20)
    _result("chunked_loss_memory", heads["chunked"]["measured"] / heads["plain"]["measured"], 0.5)
    _result("chunked_loss_time", med["chunked"] / med["plain"], 1.10)
    off = next(r for r in steps if r["plan"] == "full" and r["seq"] == SEQS[-1])
    on = next(r for r in rows if r["ckpt"])
    _result("activation_checkpointing_memory", on["measured"] / off["measured"], 0.6)


if __name__ == "__main__":
    main()
