"""The continued pre-training loop: ``train_loop_per_worker(config)``, a plain function Ray Train runs.

One worker: load the model from a resolved folder (or from the checkpoint it resumes), apply the
layer plan (:func:`raycpt.strategies.apply_plan`), wrap it for data parallelism with raycpt's own
:func:`raycpt.train.worker.parallel.wrap_model` (DDP, or FSDP2 per decoder layer then the root; the same code
over gloo on CPU and NCCL on GPU), check that it trains exactly the plan (:mod:`raycpt.train.worker.verify`:
after wrapping, after a checkpoint load, after the first step), AdamW over the
trainable parameters only (per-layer LR groups, no decay on norms/biases), a transformers scheduler
with warmup, gradient accumulation, clipping, bf16 autocast on GPU / float32 on CPU (master
weights are always float32).

Freezing saves compute, not only memory:

* frozen parameters have ``requires_grad=False``: no ``.grad`` buffer, no optimizer state, no DDP
  bucket, and autograd computes no weight gradient for them;
* the embeddings and the frozen layers *below* the first trainable module (a frozen prefix, e.g.
  layers [0, b) of ``train_deep``) run under ``torch.no_grad`` (:class:`FrozenPrefix`, a pair of
  forward pre-hooks that switch grad mode off at the embeddings and back on at the first trainable
  module), so no graph is recorded and no activation is kept for them, and the backward pass stops
  at the first trainable layer. (Autograd would record nothing there anyway, since no input of
  those modules requires grad; the explicit switch makes this hold by construction.) DDP is
  unaffected: every parameter it tracks is used in every forward, so ``find_unused_parameters``
  stays off.

Checkpoints (every ``train.checkpoint_every`` steps and at the end) are written by
:mod:`raycpt.train.ckpt.checkpoint`: ``model/`` (safetensors in the training dtype), ``train_state.pt``
(tensors only, loaded with ``weights_only=True``), ``train_state.json`` (step, data position, loss
history, plan, numpy/python RNG states) and ``manifest.json`` (sizes and sha256, written last); only
verified checkpoints are resumed. A restarted worker (``FailureConfig``) resumes from
``ray.train.get_checkpoint()``; a resumed run (``--resume``) passes ``resume_from`` in the loop
config. The data position is the number of micro-batches each rank consumed (``step * grad_accum``):
each rank reads its share of the packed store in a seeded order per epoch (:mod:`raycpt.data.stream`),
so a resume skips by arithmetic and no block is skipped or seen twice.

A NaN/inf loss or gradient norm stops the run before the optimizer step, and weights that are not
finite at a checkpoint step stop it without writing that checkpoint: rank 0 writes
``train_status.json`` and every rank returns; the launcher turns it into one error line naming the
last checkpoint that passes its manifest check. ``train_metrics.jsonl`` is strict JSON (a non-finite
value is written as a string). MLflow gets one point per step: a resumed attempt does not re-log
the steps the run already logged.

Extension point: :class:`raycpt.train.worker.callbacks.StepCallback` objects (``config["callbacks"]``; the
launcher adds those of the factories registered there) run on every rank every ``callback.every``
steps and may return extra metrics (``train.drift_every`` plugs in here).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Iterator

import torch

from raycpt.config import config_from_dict
from raycpt.data.replay import iter_mixed_micro_batches
from raycpt.data.stream import iter_micro_batches
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.models.adapters import ADAPTER_DIR, inject_lora, load_adapter_state
from raycpt.models.sources import load_model
from raycpt.strategies import LayerPlan, apply_plan, lisa_interval_index
from raycpt.train.ckpt.checkpoint import checkpoint, load_master_weights, load_optim_state, read_train_state, weights_dtype
from raycpt.train.ckpt.rng import set_rng_state
from raycpt.train.worker.callbacks import LoopState
from raycpt.train.worker.faults import FaultHooks
from raycpt.train.worker.lisa import lisa_step_metrics, lisa_switch
from raycpt.train.worker.metrics_log import MetricsLogger
from raycpt.train.worker.parallel import unwrap, uses_fsdp
from raycpt.train.worker import verify
from raycpt.train.worker.session import InProcessSession, RaySession, Session
from raycpt.train.worker.step_options import enable_activation_checkpointing, loss_chunk_tokens, uses_bf16
from raycpt.train.worker.steps import (FrozenPrefix, clip_and_norm, forward_backward, make_optimizer, make_scheduler,
                                seed_everything, trainable_params)
from raycpt.train.worker.peakmem import StepPeak
from raycpt.train.worker.throughput import device_name, flops_per_token, peak_flops, throughput_metrics
from raycpt.train.worker.state import WorkerState
from raycpt.train.worker.evaluation import EvalRequest, eval_model, evaluate_in_worker

REPLAY_KEYS = ("replay_store_build", "replay_store_key", "replay_store_identity")
"""The replay corpus's pack, recorded in each checkpoint beside the primary corpus's (``--resume`` compares both)."""

STATUS_FILE = "train_status.json"


def micro_batches(source, data_cfg, mbs: int, rank: int, world: int, seed: int, skip: int, replay=None
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """Endless ``(epoch, (mbs, seq) LongTensor)`` of this rank's share of ``source`` in the seeded
    order of each epoch (:mod:`raycpt.data.stream`), starting after ``skip`` micro-batches. ``replay`` (a
    second block source) mixes in at ``data_cfg.replay.ratio`` (:mod:`raycpt.data.replay`)."""
    seed = data_cfg.shuffle_seed if data_cfg.shuffle_seed is not None else seed
    rcfg = getattr(data_cfg, "replay", None)
    if replay is not None and rcfg is not None and rcfg.ratio > 0:
        it = iter_mixed_micro_batches(source, replay, mbs, ratio=rcfg.ratio, rank=rank, world=world, seed=seed,
                                      window=data_cfg.shuffle_window, skip=skip, mix_window=rcfg.window)
    else:
        it = iter_micro_batches(source, mbs, rank=rank, world=world, seed=seed, window=data_cfg.shuffle_window,
                                skip=skip)
    for epoch, rows in it:
        yield epoch, torch.from_numpy(rows)



def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point (see the module docstring for the config keys; ``local_mode``: Train V2's local
    mode, the loop in the calling process, :class:`InProcessSession`)."""
    if config.get("local_mode"):
        run_loop(config, InProcessSession(config["checkpoint_root"], config["cfg"]["train"]["keep_checkpoints"],
                                          config.get("base_shards")))
    else:
        run_loop(config, RaySession())


def run_loop(config: dict, session: Session) -> dict:
    """The loop, for any session. Config keys: ``cfg`` (ExperimentConfig as a dict), ``model_path``,
    ``plan`` (LayerPlan dict), ``run_dir``, ``mlflow`` ({uri, run_id} or None), ``resume_from``
    (checkpoint folder or None), ``store`` / ``store_build`` (the packed store), ``callbacks`` (StepCallback list), ``faults`` (tests,
    :class:`FaultHooks`), ``torch_threads``, ``evaluate`` (see :func:`evaluate_in_worker`). Returns a
    summary (rank 0's view).

    The steps: :func:`_setup` (config, device, threads, seed, logger) -> :func:`_load_model` (from the
    checkpoint it resumes, else the model folder; plan, wrapping, optimizer, restored state) ->
    :func:`_data` -> :func:`_start` -> :func:`_train` (one :func:`_step` per optimizer step, a
    checkpoint every ``train.checkpoint_every``) -> :func:`_finish` (status file) -> evaluation in the
    worker (rank 0, when asked and training finished)."""
    w = _setup(config, session)
    _load_model(w)
    data = _data(w)
    state = _start(w)
    status = _train(w, data, state)
    _finish(w, state, status)
    if config.get("evaluate") and status["status"] == "finished":
        _evaluate(w, state, config["evaluate"])
    return {"status": status, "losses": w.history, "step_times": w.step_times, "step_cpu": w.step_cpu,
            "counts": w.counts, "tokens_per_step": _tokens_per_step(w)}


def _evaluate(w: WorkerState, state: LoopState, req: EvalRequest) -> None:
    """In-worker evaluation of the final weights (:func:`evaluate_in_worker`) on this worker's own device."""
    model, session = eval_model(w)
    if model is None:
        return
    if w.logger is not None:
        w.logger.event({"event": "evaluate", "step": state.step, "time": time.time()})
    t_eval = time.perf_counter()
    evaluate_in_worker(model, w.tokenizer, w.cfg.eval, req, session)
    if w.logger is not None:
        w.logger.event({"timing": "evaluated", "step": state.step, "time": time.time(),
                        "seconds": time.perf_counter() - t_eval})


def _setup(config: dict, session: Session) -> WorkerState:
    """The config rebuilt, this rank's device and torch threads, the seed, rank 0's logger."""
    cfg = config_from_dict(config["cfg"])
    tcfg = cfg.train
    rank, world = session.rank, session.world_size
    run_dir = Path(config["run_dir"]) if config.get("run_dir") else None
    device = session.device(tcfg.use_gpu)
    if device.type == "cpu":
        torch.set_num_threads(int(config.get("torch_threads") or max(1, (os.cpu_count() or 1) // max(1, session.local_world_size))))
    seed_everything(tcfg.seed)
    logger = MetricsLogger(run_dir, config.get("mlflow")) if rank == 0 else None
    return WorkerState(config=config, session=session, cfg=cfg, rank=rank, world=world, run_dir=run_dir, device=device,
                   plan=LayerPlan.from_dict(config["plan"]), fsdp=uses_fsdp(tcfg.distributed, world),
                   logger=logger, faults=FaultHooks(config.get("faults"), rank, run_dir),
                   callbacks=list(config.get("callbacks") or []))


def _load_model(w: WorkerState) -> None:
    """The model (from the checkpoint this run resumes, else ``model_path``), the plan applied, the
    frozen prefix, the wrapper, optimizer and scheduler; a checkpoint's state restored."""
    config, session, tcfg = w.config, w.session, w.cfg.train
    with session.checkpoint_dir(config.get("resume_from"), config.get("checkpoint_root")) as ckpt:
        state = None
        model_path = config["model_path"]
        lora = w.plan.adapter == "lora"
        if ckpt is not None:
            state = read_train_state(ckpt)  # weights_only: tensors and plain containers only
            if state["master"] is None and not lora:  # float32 checkpoint: its model/ holds the master weights
                model_path = str(Path(ckpt) / "model")
        model, tokenizer = load_model(model_path, dtype="float32", device="cpu")  # wrap() moves it to the device
        if lora:  # the base model + adapters (a checkpoint's model/ is merged: a resume starts from the base)
            inject_lora(model, w.plan)
            if ckpt is not None:
                load_adapter_state(model, Path(ckpt) / ADAPTER_DIR)
        if state is not None and state["master"] is not None:  # bf16 checkpoint: base + float32 master copies
            load_master_weights(model, state.pop("master"))
    model.train()
    model.config.use_cache = False
    w.model, w.tokenizer = model, tokenizer
    # LISA: the draw of the checkpoint's interval (its optimizer state is that draw's); step 1's on a fresh start
    w.step_plan = w.plan.at_step(max(w.start_step_of(state), 1))
    w.counts = apply_plan(model, w.step_plan)
    enable_activation_checkpointing(model, tcfg)
    w.chunk_tokens = loss_chunk_tokens(tcfg, model, w.world)
    w.flops_per_token = flops_per_token(model, w.plan, w.cfg.data.seq_len)
    w.peak_flops = peak_flops(device_name(w.device), tcfg.peak_tflops)
    w.wrapped = session.wrap(model, w.device, tcfg.distributed, bf16=uses_bf16(tcfg))
    w.model = unwrap(w.wrapped)  # FSDP2 shards in place: the same object, its parameters now DTensors
    w.prefix = FrozenPrefix(w.model, w.plan)  # after wrapping: its hooks run before FSDP's own
    w.optimizer = make_optimizer(w.model, w.step_plan, tcfg)
    w.scheduler = make_scheduler(w.optimizer, tcfg)
    w.params = trainable_params(w.wrapped)
    _verify(w, verify.check_setup(w.model, w.step_plan, w.optimizer, "after wrapping"), "after_wrapping")
    if state is not None:
        _restore(w, state)
        _verify(w, verify.check_setup(w.model, w.step_plan, w.optimizer, "after loading the checkpoint",
                                      resumed=w.start_step > 0 and state["optimizer"] is not None),
                "after_checkpoint_load")



def _verify(w: WorkerState, rows: list, when: str) -> None:
    """Rank 0 logs a freeze check's per-part table to MLflow (the check itself raised on a mismatch)."""
    if w.rank == 0 and w.logger is not None:
        w.logger.text(verify.table_text(rows, when.replace("_", " ")), f"freeze_check/{when}.txt")


def _restore(w: WorkerState, state: dict) -> None:
    """Optimizer, scheduler, this rank's RNG states, the step and the loss history of a checkpoint. A final
    checkpoint (no optimizer state) resumes only to evaluate and publish: training on from it is refused."""
    if state["optimizer"] is None:
        if int(state["step"]) < w.cfg.train.max_steps:
            raise RaycptError(f"the checkpoint of step {state['step']} was its run's last (no optimizer state): it "
                              f"cannot train on to train.max_steps={w.cfg.train.max_steps}; start a new run")
    else:
        load_optim_state(w.model, w.optimizer, state["optimizer"], w.fsdp)
    w.scheduler.load_state_dict(state["scheduler"])
    rngs = state.get("rng") or []
    if w.rank < len(rngs):
        set_rng_state(rngs[w.rank])
    w.start_step = int(state["step"])
    w.history = list(state.get("losses", []))


def _tokens_per_step(w: WorkerState) -> int:
    t = w.cfg.train
    return w.world * t.grad_accum * t.micro_batch_size * w.cfg.data.seq_len


def _data(w: WorkerState) -> Iterator[tuple[int, torch.Tensor]]:
    """This rank's micro-batches, after the ones the steps before ``start_step`` consumed."""
    config, session, tcfg = w.config, w.session, w.cfg.train
    ga, mbs, start_step = tcfg.grad_accum, tcfg.micro_batch_size, w.start_step
    replay = session.replay_batches(config) if w.cfg.data.replay.ratio > 0 else None
    return micro_batches(session.batches(config), w.cfg.data, mbs, w.rank, w.world, tcfg.seed, skip=start_step * ga,
                         replay=replay)


def _start(w: WorkerState) -> LoopState:
    """The callbacks' view of the loop; rank 0 logs the plan and a start/resume event; callbacks start."""
    state = LoopState(step=w.start_step, max_steps=w.cfg.train.max_steps, model=w.model, wrapped=w.wrapped,
                      plan=w.plan, rank=w.rank, world_size=w.world, device=w.device, cfg=w.cfg, run_dir=w.run_dir,
                      logger=w.logger)
    if w.rank == 0:
        counts, plan = w.counts, w.plan
        w.logger.params({"plan": plan.describe()[:500], "plan.layer_map": plan.layer_map(),
                         "trainable_params": counts["trainable"], "frozen_params": counts["frozen"],
                         "plan.frozen_prefix_no_grad": w.prefix.active, "world_size": w.world})
        w.logger.event({"event": "start" if w.start_step == 0 else "resume", "step": w.start_step,
                        "trainable": counts["trainable"], "frozen": counts["frozen"], "world_size": w.world,
                        "time": time.time(), "pid": os.getpid(), "setup_s": time.perf_counter() - w.t_setup})
    for cb in w.callbacks:
        cb.on_train_start(state)
    return state


def _train(w: WorkerState, data, state: LoopState) -> dict:
    """Steps ``start_step + 1 .. max_steps``; a checkpoint every ``checkpoint_every`` and at the end.
    Returns the status: ``finished``, or ``nonfinite`` (loss or gradient norm) at the step it stopped."""
    tcfg = w.cfg.train
    last_ckpt = w.start_step if w.start_step else None
    for step in range(w.start_step + 1, tcfg.max_steps + 1):
        w.faults.before_step(step)
        metrics = _step(w, data, step)
        if metrics.get("status") == "nonfinite":
            return {"status": "nonfinite", "step": step, "what": metrics["what"], "value": metrics["value"],
                    "last_checkpoint_step": last_ckpt}
        state.step, state.metrics = step, metrics
        _after_step(w, state, step, metrics)
        if step % tcfg.checkpoint_every == 0 or step == tcfg.max_steps:
            t_ckpt = time.perf_counter()
            why = checkpoint(w.session, w.model, w.wrapped, w.tokenizer, w.optimizer, w.scheduler, step, w.history,
                             w.plan, w.fsdp, data_pos={"micro_batches_consumed": step * tcfg.grad_accum,
                                                       "epoch": metrics["epoch"],
                                                       "store_build": w.config.get("store_build"),
                                                       "store_key": w.config.get("store_key"),
                                                       "store_identity": w.config.get("store_identity"),
                                                       **{k: w.config[k] for k in REPLAY_KEYS if w.config.get(k)}},
                             metrics={"step": step, "loss": metrics["loss"]},
                             dtype=weights_dtype(tcfg.precision, w.device),
                             before_write=lambda folder, s=step: w.faults.checkpoint_write(s, folder),
                             final=step == tcfg.max_steps and not tcfg.keep_finished_checkpoints)
            if why is not None:  # never a checkpoint from non-finite weights
                return {"status": "nonfinite", "step": step, "what": "weights", "value": why,
                        "last_checkpoint_step": last_ckpt}
            last_ckpt = step
            if w.logger is not None:
                w.logger.event({"timing": "checkpoint", "step": step, "seconds": time.perf_counter() - t_ckpt})
    return {"status": "finished"}


def _step(w: WorkerState, data, step: int) -> dict:
    """One optimizer step over ``grad_accum`` micro-batches: its metrics, or ``{"status": "nonfinite",
    "what", "value"}`` (gradients dropped, no update) when the mean loss or the gradient norm is not finite."""
    tcfg, optimizer, scheduler, device = w.cfg.train, w.optimizer, w.scheduler, w.device
    switched = lisa_switch(w, step)  # LISA: a new interval trains its own draw
    w.peak = w.peak or StepPeak(device)
    w.peak.start()
    t0, c0 = time.perf_counter(), time.process_time()
    batch = []
    epoch = 0
    for _ in range(tcfg.grad_accum):
        epoch, ids = next(data)
        batch.append(ids)
    loss_local = forward_backward(w.wrapped, batch, tcfg.precision, device, model=w.model, chunk_tokens=w.chunk_tokens)
    loss_local = w.faults.loss(step, loss_local)
    w.faults.drop_grads(step, w.model)
    first = step == w.start_step + 1 or switched
    if first:  # the freeze check after this step: who got a gradient, frozen bits before the update
        grads, before = verify.grad_presence(w.model), verify.frozen_fingerprints(w.model)
    loss = float(w.session.all_reduce_mean(loss_local))
    grad_norm = clip_and_norm(w.wrapped, w.params, tcfg.max_grad_norm) if math.isfinite(loss) else float("nan")
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        optimizer.zero_grad(set_to_none=True)
        return {"status": "nonfinite", "what": what, "value": str(loss if what == "loss" else grad_norm)}
    lr = scheduler.get_last_lr()[0] / (optimizer.param_groups[0].get("lr_scale", 1.0) or 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if first:  # LISA: on the first step of every interval, against that interval's draw
        k = lisa_interval_index(step, w.plan.lisa_interval) if switched else None
        tag, text = ("after_first_step", "after the first step") if k is None else (
            f"lisa_interval_{k}", f"at the first step of LISA interval {k}")
        _verify(w, verify.check_step(w.model, w.step_plan, optimizer, grads, before, when=text), tag)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    w.step_times.append(dt)
    w.step_cpu.append(cpu)
    w.history.append(loss)
    peak = w.peak.read_mb()
    return {"loss": loss, "lr": lr, "grad_norm": grad_norm, "step_time_s": dt, "step_cpu_s": cpu,
            "tokens_per_s": _tokens_per_step(w) / dt, "epoch": epoch,
            **({"peak_memory_mb": round(peak, 1)} if peak is not None else {}), **lisa_step_metrics(w.step_plan),
            **throughput_metrics(_tokens_per_step(w), w.world, dt, w.flops_per_token, w.peak_flops)}


def _after_step(w: WorkerState, state: LoopState, step: int, metrics: dict) -> None:
    """Callbacks due at this step (their extra metrics join ``metrics``), then rank 0 logs."""
    for cb in w.callbacks:
        if cb.every and step % cb.every == 0:
            extra = cb.on_step_end(state)
            if extra:
                metrics.update(extra)
    if w.rank == 0:
        w.logger.event({"step": step, **metrics})
        if step % w.cfg.train.log_every == 0 or step == w.cfg.train.max_steps:
            w.logger.log(metrics, step)


def _finish(w: WorkerState, state: LoopState, status: dict) -> None:
    """Hooks off, callbacks end, rank 0 writes ``train_status.json`` and the end event; all ranks meet."""
    w.prefix.remove()
    for cb in w.callbacks:
        cb.on_train_end(state)
    if w.logger is not None:
        w.logger.close()  # every queued MLflow call has run
    if w.rank == 0 and w.run_dir is not None:
        atomic_write_json(w.run_dir / STATUS_FILE, status)
        w.logger.event({"event": status["status"], "step": state.step, "time": time.time()})
    w.session.barrier()
