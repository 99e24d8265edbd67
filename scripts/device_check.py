#!/usr/bin/env python
"""The prepared one-GPU check: what only a GPU can show about raycpt's training path, offline, in minutes.

Run on one GPU (an H200 here; at most ~8 minutes): ``python scripts/device_check.py [--out check.json]``.
``--tiny`` runs the same checks on the CPU with a tiny model (the test suite runs it).

Checks (each prints ``CHECK <name> PASS|FAIL <detail>``; the exit code is the number of failures):

1. ``facts``: torch / CUDA / NCCL versions, device name and capability, bf16 support (CPU: gloo available).
2. ``memory_<plan>``: one real training step (bf16 autocast on a GPU, the chunked loss the loop picks) of a
   Qwen3-0.6B-shaped model (random weights, no hub) at the papers' micro-batch 8 x 4096 tokens, for ``full``,
   ``train_shallow`` and ``train_deep`` (split 0.5): the device's peak allocated memory against
   :func:`raycpt.train.memory.estimate_memory` of the same shape; PASS within 20%.
3. ``gradients``: after that step, the freeze check's per-layer table (:mod:`raycpt.train.verify`): every planned
   tensor got a gradient, every frozen one is bitwise unchanged (the frozen prefix under ``no_grad`` on the device).
4. ``bf16_checkpoint_round_trip``: :func:`raycpt.train.loop.run_loop` in bf16, 4 steps with a checkpoint at 2, and
   a second run resumed from it: the same per-step losses to the bit and float32 masters of every trainable tensor.
5. ``eval_paths``: the held-out loss of the in-memory trained model (the float32 masters, what in-worker evaluation
   scores) against the same model reloaded from its checkpoint in the checkpoint's dtype (what ``raycpt eval``
   scores): the difference is reported; PASS when it is below 1% (FAIL says the two paths disagree).
6. ``trace_dtype``: per-layer logit-lens distributions of float32 against bf16 weights on the same prompts: the
   largest per-layer Jensen-Shannon divergence between the two (how much a bf16 trace moves; reported).
7. ``train_killed_worker``: ``raycpt train`` through Ray on one worker (the GPU when there is one), the worker
   SIGKILLed before step 3, restarted by Ray from the step-2 checkpoint: the same losses as an uninterrupted run.

What a single GPU cannot show: FSDP over NCCL needs two GPUs (one process per GPU); on one GPU FSDP is refused
(``train.distributed=fsdp`` needs >= 2 workers), and its gloo stand-in runs in ``tests/integration/test_fsdp.py``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PAPER = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=32768, tie_word_embeddings=True)
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=True)
RESULTS: list[dict] = []


def report(name: str, ok: bool, detail: str, **data) -> None:
    RESULTS.append({"check": name, "pass": bool(ok), "detail": detail, **data})
    print(f"CHECK {name} {'PASS' if ok else 'FAIL'} {detail}", flush=True)


def facts(device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if dist.is_nccl_available() else "none"
        detail = (f"torch {torch.__version__} cuda {torch.version.cuda} nccl {nccl} {p.name} sm_{p.major}{p.minor} "
                  f"{p.total_memory / 1e9:.0f} GB bf16={torch.cuda.is_bf16_supported()}")
        report("facts", torch.cuda.is_bf16_supported() and dist.is_nccl_available(), detail)
    else:
        report("facts", dist.is_gloo_available(), f"torch {torch.__version__} cpu gloo={dist.is_gloo_available()}")


def _model(shape: dict, device: torch.device):
    import transformers as T

    torch.manual_seed(0)
    conf = T.Qwen3Config(**shape)
    conf._attn_implementation = "sdpa"
    return T.AutoModelForCausalLM.from_config(conf).to(device).train()


def _tcfg(tiny: bool):
    from raycpt.config import TrainConfig

    return TrainConfig(lr=1e-4, warmup_ratio=0.0, max_steps=4, precision="bf16", use_gpu=not tiny, loss="auto",
                       loss_chunk_tokens=1024)


def memory_and_gradients(device: torch.device, tiny: bool) -> None:
    from raycpt.config import PlanConfig
    from raycpt.strategies import apply_plan, plan_for_model
    from raycpt.train import verify
    from raycpt.train.steps import FrozenPrefix, forward_backward, make_optimizer, make_scheduler
    from raycpt.train.memory import estimate_memory, model_shape
    from raycpt.train.step_options import loss_chunk_tokens

    shape, (mb, seq) = (TINY, (2, 64)) if tiny else (PAPER, (8, 4096))
    tcfg = _tcfg(tiny)
    for spec in (dict(name="full"), dict(name="train_shallow", split=0.5), dict(name="train_deep", split=0.5)):
        model = _model(shape, device)
        plan = plan_for_model(PlanConfig(**spec), model)
        apply_plan(model, plan)
        prefix = FrozenPrefix(model, plan)
        opt, chunk = make_optimizer(model, plan, tcfg), loss_chunk_tokens(tcfg, model, 1)
        sched = make_scheduler(opt, tcfg)
        est = estimate_memory(model_shape(model), plan, seq_len=seq, micro_batch=mb, bf16=True,
                              gpu=device.type == "cuda", chunk_tokens=chunk)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, shape["vocab_size"], (mb, seq), generator=torch.Generator().manual_seed(1))
        forward_backward(model, [ids], "bf16", device, model=model, chunk_tokens=chunk)
        grads, before = verify.grad_presence(model), verify.frozen_fingerprints(model)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        try:
            rows = verify.check_step(model, plan, opt, grads, before)
            report(f"gradients_{spec['name']}", True, f"{sum(r.got_grad for r in rows)} tensors got a gradient, "
                   f"{sum(r.frozen_changed for r in rows)} frozen changed", table=verify.table_text(rows, "step 1"))
        except Exception as e:  # noqa: BLE001 - the check reports what failed
            report(f"gradients_{spec['name']}", False, str(e))
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
            ratio = est.total / peak
            report(f"memory_{spec['name']}", abs(ratio - 1) <= 0.2, f"measured {peak / 1e9:.2f} GB, estimate "
                   f"{est.total / 1e9:.2f} GB ({ratio - 1:+.1%})", measured=peak, estimate=est.total, terms=est.terms)
        else:
            report(f"memory_{spec['name']}", True, f"estimate {est.total / 1e6:.1f} MB (no device counter on the CPU)",
                   estimate=est.total)
        prefix.remove()
        del model, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _save_small(root: Path) -> Path:
    from tiny import tiny_tokenizer

    model = _model(TINY, torch.device("cpu"))
    model.save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    return root / "model"


def _loop_config(model_dir: Path, run_dir: Path, tiny: bool, steps: int = 4) -> dict:
    from raycpt.config import config_to_dict, load_config
    from raycpt.strategies import build_plan

    cfg = load_config(None, [f"model.ref={model_dir}", "data.seq_len=32", "plan.name=train_deep", "plan.split=0.5",
                             f"train.max_steps={steps}", "train.checkpoint_every=2", "train.lr=0.01",
                             "train.micro_batch_size=2", "train.precision=bf16", f"train.use_gpu={str(not tiny).lower()}",
                             "train.warmup_ratio=0"])
    plan = build_plan(cfg.plan, TINY["num_hidden_layers"], tied_embeddings=True)
    return {"cfg": config_to_dict(cfg), "model_path": str(model_dir), "plan": plan.to_dict(), "run_dir": str(run_dir),
            "torch_threads": 1}


def round_trip_and_eval_paths(root: Path, tiny: bool) -> None:
    from raycpt.models.sources import load_model
    from raycpt.train.loop import run_loop
    from raycpt.train.session import LocalSession

    model_dir = _save_small(root)
    blocks = np.random.default_rng(0).integers(4, TINY["vocab_size"], size=(32, 32)).astype(np.int32)
    cfg = _loop_config(model_dir, root / "a", tiny)
    full = run_loop(cfg, LocalSession(blocks, root / "a" / "ckpts"))
    resumed_cfg = {**copy.deepcopy(cfg), "run_dir": str(root / "b"),
                   "resume_from": str(root / "a" / "ckpts" / "checkpoint_000002")}
    resumed = run_loop(resumed_cfg, LocalSession(blocks, root / "b" / "ckpts"))
    state = torch.load(root / "a" / "ckpts" / "checkpoint_000002" / "train_state.pt", weights_only=True)
    n_master = len(state.get("master") or {})
    ok = resumed["losses"] == full["losses"] and n_master > 0
    report("bf16_checkpoint_round_trip", ok, f"losses {'equal' if resumed['losses'] == full['losses'] else 'DIFFER'} "
           f"after the reload; {n_master} float32 master tensors kept", losses=full["losses"])
    _eval_paths(root, blocks, load_model, tiny)


def _eval_paths(root: Path, blocks, load_model, tiny: bool) -> None:
    """The trained weights as in-worker evaluation holds them (float32 masters) against the checkpoint reload."""
    from raycpt.evaluate.heldout import lm_loss
    from raycpt.train.checkpoint import load_master_weights, read_train_state

    ckpt = root / "a" / "ckpts" / "checkpoint_000004"
    device = "cpu" if tiny else "cuda"
    master_model, _ = load_model(str(ckpt / "model"), dtype="float32", device="cpu")
    load_master_weights(master_model, read_train_state(ckpt)["master"])
    master_model.to(device)
    saved, _ = load_model(str(ckpt / "model"), dtype="auto", device=device)
    held = [list(map(int, b)) for b in blocks[:8]]
    a, b = lm_loss(master_model, held), lm_loss(saved, held)
    rel = abs(a - b) / abs(a)
    report("eval_paths", rel < 0.01, f"held-out loss in-worker (float32 masters) {a:.5f}, checkpoint reload "
           f"({next(saved.parameters()).dtype}) {b:.5f}: {rel:.3%} apart", in_worker=a, checkpoint=b)


def trace_dtype(device: torch.device, tiny: bool) -> None:
    shape = TINY if tiny else PAPER
    model = _model(shape, device).eval()
    ids = torch.randint(4, shape["vocab_size"], (8, 24), generator=torch.Generator().manual_seed(2)).to(device)

    def lens(m) -> list[torch.Tensor]:
        with torch.no_grad():
            hs = m(input_ids=ids, output_hidden_states=True).hidden_states
            norm, head = m.model.norm, m.lm_head
            return [torch.log_softmax(head(norm(h[:, -1]) if i < len(hs) - 1 else h[:, -1]).float(), -1)
                    for i, h in enumerate(hs[1:], start=1)]

    a = lens(model)
    b = lens(copy.deepcopy(model).to(torch.bfloat16))
    js = []
    for la, lb in zip(a, b):
        m = torch.logsumexp(torch.stack([la, lb]), 0) - np.log(2)
        js.append(float((0.5 * (la.exp() * (la - m)).sum(-1) + 0.5 * (lb.exp() * (lb - m)).sum(-1)).mean()))
    report("trace_dtype", True, f"max per-layer JS(float32, bf16) {max(js):.2e} (layer {int(np.argmax(js))}); "
           "(how far a bf16 trace would move from float32)", js=js)


def train_killed_worker(root: Path, tiny: bool) -> None:
    import ray

    from raycpt.config import RayConfig, load_config
    from raycpt.runtime import init_ray
    from raycpt.train.launch import run_training

    model_dir = root / "model"
    corpus = root / "corpus.jsonl"
    rng = np.random.default_rng(3)
    corpus.write_text("".join(json.dumps({"text": " ".join(f"w{x}" for x in rng.integers(0, 50, 40))}) + "\n"
                              for _ in range(60)))
    base = [f"model.ref={model_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32", "plan.name=train_deep",
            f"tracking.run_root={root / 'runs'}", "train.max_steps=4", "train.checkpoint_every=2", "train.num_workers=1",
            "train.cpus_per_worker=0.5", "train.micro_batch_size=2", "train.lr=1e-3", "train.max_failures=1",
            f"train.use_gpu={str(not tiny).lower()}", "eval.tasks=wordnet_mc"]
    started = init_ray(RayConfig(num_cpus=4, object_store_memory=500_000_000))
    try:
        clean = run_training(load_config(None, base + ["name=clean"]))
        killed = run_training(load_config(None, base + ["name=killed"]), faults={"sigkill_step": 3, "sigkill_rank": 0})
    finally:
        if started:
            ray.shutdown()
    same = np.allclose(clean.losses, killed.losses, rtol=1e-5, atol=0)
    report("train_killed_worker", same and (killed.run_dir / ".fault_sigkill_3").is_file(),
           f"losses {'equal' if same else 'DIFFER'} after the restart: {clean.losses} vs {killed.losses}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="the same checks on the CPU with a tiny model")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--skip-ray", action="store_true", help="leave out the Ray train check")
    args = ap.parse_args()
    t0 = time.perf_counter()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if not args.tiny and device.type != "cuda":
        print("no CUDA device: run with --tiny for the CPU version", file=sys.stderr)
        return 2
    facts(device)
    memory_and_gradients(device, args.tiny)
    trace_dtype(device, args.tiny)
    with tempfile.TemporaryDirectory(prefix="raycpt-device-check-") as tmp:
        round_trip_and_eval_paths(Path(tmp), args.tiny)
        if not args.skip_ray:
            train_killed_worker(Path(tmp), args.tiny)
    failed = [r["check"] for r in RESULTS if not r["pass"]]
    print(f"device check: {len(RESULTS) - len(failed)}/{len(RESULTS)} passed in {time.perf_counter() - t0:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"device": str(device), "results": RESULTS}, indent=2, default=str))
    return len(failed)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
