#!/usr/bin/env python
"""FSDP2 against DDP on the same plans, in one run: do they train the same, and does FSDP save what it promises?

Two gloo processes (:func:`raycpt.train.worker.gloo.spawn`) run raycpt's own loop (:func:`raycpt.train.worker.loop.run_loop`,
wrapping by :func:`raycpt.train.worker.parallel.wrap_model`) for ``full`` and ``train_deep`` (split 0.5), once with
``train.distributed=ddp`` and once with ``fsdp``, on the same blocks from the same seed, float32, the loss the loop
picks. The model is built from a Llama config (SmolLM2-135M's shape by default: 30 layers, hidden 576, vocabulary
49,152, tied embeddings; random weights, saved once as safetensors) and loaded by the loop as a run would.

* **Loss agreement**: per step, ``|loss_fsdp - loss_ddp| / |loss_ddp|``, the maximum over steps and plans.
  ``RESULT fsdp_loss_agreement <max rel diff> target <= 1e-4``.
* **Memory per worker**: each process records its RSS just before the job (the model not yet loaded) and, after
  every step, its peak RSS (``VmHWM``; the mark is reset before the job through ``/proc/self/clear_refs``), so the
  final checkpoint's gather does not count. Measured = the peak after the last step minus the RSS before, the
  larger of the two ranks. The processes run with ``MALLOC_MMAP_THRESHOLD_=65536`` (glibc returns every freed
  tensor to the kernel, so one job's freed heap cannot hide the next job's peak) and run one unmeasured warm-up
  job first (library set-up that happens once per process). ``RESULT fsdp_memory_ratio <fsdp/ddp, plan full> target <= 0.75``.
* **Estimate**: :func:`raycpt.train.driver.preflight.estimate_plan` of each job's config against its measured peak.
  ``RESULT fsdp_memory_estimate_error <max |est/measured - 1|> target <= 0.2``.

``--smoke``: a 4-layer, hidden-64 model, 2 steps (seconds; the test suite runs it, the figures then say little).
On the shared 2-core machine every figure is taken under load; memory is what the kernel counted, not timing.

Run: ``python benchmarks/bench_fsdp.py [--smoke] [--seq 256] [--batch 2] [--steps 3]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PLANS = {"full": {"name": "full"}, "train_deep": {"name": "train_deep", "split": 0.5}}
SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
SMOKE = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=True)


from _rss import reset_peak as _reset_peak, rss_kb as _rss_kb  # noqa: E402


class PeakAfterStep:
    """A step callback: this process's peak RSS (kB) after each step."""

    every = 1

    def __init__(self):
        self.peaks: list[int] = []

    def on_train_start(self, state) -> None:
        pass

    def on_step_end(self, state):
        self.peaks.append(_rss_kb("VmHWM"))
        return None

    def on_train_end(self, state) -> None:
        pass


def run_jobs(rank: int, world: int, jobs: list[dict], out_dir: str) -> None:
    """In each gloo process: every job through run_loop, with its memory marks."""
    from raycpt.train.worker.gloo import GlooSession
    from raycpt.train.worker.loop import run_loop

    for i, job in enumerate(jobs):
        peak = PeakAfterStep()
        config = dataclasses.replace(job["spec"], callbacks=(peak,))
        session = GlooSession(np.load(job["blocks"]), Path(job["checkpoint_root"]))
        base = _rss_kb("VmRSS")
        _reset_peak()
        out = run_loop(config, session)
        record = {"losses": out["losses"], "base_kb": base, "peak_kb": peak.peaks[-1]}
        if i:  # job 0 is the warm-up
            Path(out_dir, f"{job['name']}.rank{rank}.json").write_text(json.dumps(record))


def _model(root: Path, shape: dict) -> Path:
    import torch
    import transformers as T

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny import tiny_tokenizer

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**shape))
    model.save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    return root / "model"


def _jobs(root: Path, model: Path, args) -> list[dict]:
    from raycpt.config import load_config
    from raycpt.strategies import build_plan
    from raycpt.train.worker.spec import WorkerSpec

    jobs = []
    for dist in ("ddp", "fsdp"):
        for key, plan in PLANS.items():
            cfg = load_config(None, [f"model.ref={model}", f"data.seq_len={args.seq}", f"train.distributed={dist}",
                                     "train.num_workers=2", f"train.max_steps={args.steps}",
                                     f"train.checkpoint_every={args.steps}", "train.lr=1e-3",
                                     f"train.micro_batch_size={args.batch}", "train.precision=fp32",
                                     "train.warmup_ratio=0"] + [f"plan.{k}={v}" for k, v in plan.items()])
            p = build_plan(cfg.plan, cfg_layers(model), tied_embeddings=True)
            name = f"{dist}-{key}"
            jobs.append({"name": name, "dist": dist, "plan": key, "cfg": cfg, "plan_obj": p,
                         "spec": WorkerSpec(cfg=cfg, model_path=str(model), plan=p, run_dir=str(root / name),
                                            torch_threads=args.threads),
                         "blocks": str(root / "blocks.npy"), "checkpoint_root": str(root / name / "ckpts")})
    return jobs


def cfg_layers(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["num_hidden_layers"]


def _estimate(job: dict, model: Path) -> float:
    from raycpt.train.driver.prepare import model_skeleton
    from raycpt.train.driver.preflight import estimate_plan
    from raycpt.strategies import apply_plan

    skeleton = model_skeleton(str(model))
    apply_plan(skeleton, job["plan_obj"])
    return estimate_plan(job["cfg"], skeleton, job["plan_obj"]).total


def _result(name: str, value: float, target: float) -> None:
    print(f"RESULT {name} {value:.3g} target <= {target:g} {'PASS' if value <= target else 'FAIL'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.smoke:
        args.seq, args.batch, args.steps = 32, 2, 2
    from raycpt.train.worker.gloo import spawn

    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        root = Path(tmp)
        model = _model(root, SMOKE if args.smoke else SHAPE)
        vocab = (SMOKE if args.smoke else SHAPE)["vocab_size"]
        n_blocks = 2 * args.batch * (args.steps + 1)
        np.save(root / "blocks.npy", np.random.default_rng(0).integers(4, vocab, size=(n_blocks, args.seq)).astype(np.int32))
        jobs = _jobs(root, model, args)
        plain = [{k: j[k] for k in ("name", "spec", "blocks", "checkpoint_root")} for j in jobs]
        warmup = {**plain[-1], "name": "warmup", "checkpoint_root": str(root / "warmup")}
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        spawn(run_jobs, 2, [warmup] + plain, tmp)
        rec = {j["name"]: [json.loads((root / f"{j['name']}.rank{r}.json").read_text()) for r in (0, 1)] for j in jobs}
        measured = {n: max((r["peak_kb"] - r["base_kb"]) * 1024 for r in rs) for n, rs in rec.items()}
        rel = []
        for key in PLANS:
            a, b = np.array(rec[f"fsdp-{key}"][0]["losses"]), np.array(rec[f"ddp-{key}"][0]["losses"])
            rel.append(float(np.max(np.abs(a - b) / np.abs(b))))
        errors = {}
        for j in jobs:
            est = _estimate(j, model)
            errors[j["name"]] = est / measured[j["name"]] - 1
            print(f"{j['name']}: measured {measured[j['name']] / 1e9:.3f} GB per worker, estimate {est / 1e9:.3f} GB "
                  f"({errors[j['name']]:+.1%}); losses {['%.5f' % x for x in rec[j['name']][0]['losses']]}", flush=True)
    print(f"(2 gloo workers, seq {args.seq}, batch {args.batch}, {args.steps} steps, float32"
          f"{', smoke model' if args.smoke else ''}; memory under load on a shared machine: what the kernel counted)")
    _result("fsdp_loss_agreement", max(rel), 1e-4)
    _result("fsdp_memory_ratio", measured["fsdp-full"] / measured["ddp-full"], 0.75)
    _result("fsdp_memory_estimate_error", max(abs(e) for e in errors.values()), 0.2)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
