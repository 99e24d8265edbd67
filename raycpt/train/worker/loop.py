"""The continued pre-training recipe: :class:`TrainingRecipe`, run by ``train_loop_per_worker({"spec": spec})``.

Read top to bottom, in torchtune's shape: :meth:`~TrainingRecipe.setup` (device, seed, logger, the model and its
plan, wrapper, optimizer, a checkpoint's state) -> :meth:`~TrainingRecipe.train` (one :meth:`~TrainingRecipe.step`
per optimizer step, :meth:`~TrainingRecipe.save_checkpoint` every ``train.checkpoint_every``) ->
:meth:`~TrainingRecipe.cleanup` (status file, all ranks meet) -> :meth:`~TrainingRecipe.evaluate` (the final
weights, in the worker). The recipe owns its state; what it is given is one frozen
:class:`~raycpt.train.worker.spec.WorkerSpec`.

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
``ray.train.get_checkpoint()``; a resumed run (``--resume``) passes ``resume_from`` in the worker's
spec. The data position is the number of micro-batches each rank consumed (``step * grad_accum``):
each rank reads its share of the packed store in a seeded order per epoch (:mod:`raycpt.data.stream`),
so a resume skips by arithmetic and no block is skipped or seen twice.

A NaN/inf loss or gradient norm stops the run before the optimizer step, and weights that are not
finite at a checkpoint step stop it without writing that checkpoint: rank 0 writes
``train_status.json`` and every rank returns; the launcher turns it into one error line naming the
last checkpoint that passes its manifest check. ``train_metrics.jsonl`` is strict JSON (a non-finite
value is written as a string). MLflow gets one point per step: a resumed attempt does not re-log
the steps the run already logged.

Extension point: :class:`raycpt.train.worker.callbacks.StepCallback` objects (``spec.callbacks``; the
launcher adds those of the factories registered there) run on every rank every ``callback.every``
steps and may return extra metrics (``train.drift_every`` plugs in here).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from raycpt.data.replay import iter_mixed_micro_batches
from raycpt.data.stream import iter_micro_batches
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.models.adapters import ADAPTER_DIR, inject_lora, load_adapter_state
from raycpt.models.sources import load_model
from raycpt.models.stack import LayerStack
from raycpt.strategies import LayerPlan, apply_plan, lisa_interval_index, param_groups
from raycpt.train.ckpt.checkpoint import checkpoint, load_master_weights, load_optim_state, read_train_state, weights_dtype
from raycpt.train.ckpt.rng import set_rng_state
from raycpt.train.worker import verify
from raycpt.train.worker.callbacks import LoopState
from raycpt.train.worker.evaluation import eval_model, evaluate_in_worker
from raycpt.train.worker.faults import FaultHooks
from raycpt.train.worker.metrics_log import MetricsLogger
from raycpt.train.worker.parallel import unwrap, uses_fsdp
from raycpt.train.worker.peakmem import StepPeak
from raycpt.train.worker.session import InProcessSession, RaySession, Session
from raycpt.train.worker.spec import WorkerSpec
from raycpt.train.worker.step_options import (compile_decoder_layers, enable_activation_checkpointing, loss_chunk_tokens,
                                              resolve_sdpa_backend, sdpa_probe, uses_bf16)
from raycpt.train.worker.steps import (FrozenPrefix, clip_and_norm, forward_backward, make_optimizer, make_scheduler,
                                       seed_everything, trainable_params)
from raycpt.train.worker.throughput import device_name, flops_per_token, peak_flops, throughput_metrics

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


def lisa_step_metrics(step_plan: LayerPlan) -> dict:
    """LISA: the layers this step trained, as the step's metrics ``lisa/layer_<j>`` (the j-th of the draw, in
    layer order): every step's draw is in the trial's records and its MLflow run; {} for any other plan."""
    if not step_plan.is_lisa:
        return {}
    return {f"lisa/layer_{j}": float(i) for j, i in enumerate(step_plan.trainable_layers)}


def train_loop_per_worker(config: dict) -> None:
    """Ray Train's entry point: ``config`` is ``{"spec": WorkerSpec}`` (``spec.local_mode``: Train V2's local mode,
    the recipe in the calling process, :class:`InProcessSession`)."""
    spec: WorkerSpec = config["spec"]
    if spec.local_mode:
        run_loop(spec, InProcessSession(spec.checkpoint_root, spec.cfg.train.keep_checkpoints, spec.base_shards))
    else:
        run_loop(spec, RaySession())


def run_loop(spec: WorkerSpec, session: Session) -> dict:
    """The recipe, for any session; returns a summary (rank 0's view): ``status``, ``losses``, ``step_times``,
    ``step_cpu``, ``counts``, ``tokens_per_step``."""
    recipe = TrainingRecipe(spec, session)
    recipe.setup()
    status = recipe.train()
    recipe.cleanup(status)
    if spec.evaluate is not None and status["status"] == "finished":
        recipe.evaluate()
    return recipe.summary(status)


class TrainingRecipe:
    """One rank's continued pre-training: ``setup -> train -> cleanup -> evaluate``, state owned here."""

    def __init__(self, spec: WorkerSpec, session: Session):
        self.spec, self.session, self.cfg = spec, session, spec.cfg
        self.t_setup = time.perf_counter()  # when this rank's setup began
        self.rank, self.world = session.rank, session.world_size
        self.run_dir = Path(spec.run_dir) if spec.run_dir else None
        self.plan: LayerPlan = spec.plan
        self.fsdp = uses_fsdp(spec.cfg.train.distributed, self.world)
        self.model: Any = None
        self.tokenizer: Any = None
        self.wrapped: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.params: list = []
        self.counts: dict = {}
        self.prefix: Optional[FrozenPrefix] = None
        self.start_step = 0
        self.history: list = []
        self.step_times: list = []
        self.step_cpu: list = []  # this process's CPU seconds per step (all its threads)
        self.chunk_tokens: Optional[int] = None  # the chunked loss's rows per chunk; None = the plain loss
        self.flops_per_token = 0.0
        self.peak_flops: Optional[float] = None
        self.step_plan: Optional[LayerPlan] = None  # what trains now: ``plan``, or LISA's current interval's draw
        self.step_plan_step = 1  # a step of step_plan's interval
        self.peak: Optional[StepPeak] = None  # this rank's per-step peak memory (:mod:`raycpt.train.worker.peakmem`)
        self.loop: Optional[LoopState] = None
        self.data: Optional[Iterator[tuple[int, torch.Tensor]]] = None
        self.device: Optional[torch.device] = None
        self.logger: Optional[MetricsLogger] = None
        self.faults: Optional[FaultHooks] = None
        self.callbacks = list(spec.callbacks)
        self.sdpa_backend = "auto"  # train.sdpa_backend resolved for the device
        self.sdpa_ran: Optional[list[str]] = None  # the SDPA kernels the first step ran (sdpa_probe)
        self.fallbacks: list[str] = []  # one line per fast-path option this device lacks
        self.optimizer_fused = False  # AdamW's fused kernel runs (train.fused_adamw)

    # ------------------------------------------------------------------------------------------------ setup

    def setup(self) -> None:
        """This rank's device and torch threads, the seed, rank 0's logger; the model (:meth:`load_model`); the data
        after the steps a checkpoint already consumed; the callbacks' view; rank 0 logs the plan and start event."""
        tcfg, session = self.cfg.train, self.session
        self.device = session.device(tcfg.use_gpu)
        if self.device.type == "cpu":
            torch.set_num_threads(int(self.spec.torch_threads
                                      or max(1, (os.cpu_count() or 1) // max(1, session.local_world_size))))
        seed_everything(tcfg.seed)
        self.logger = MetricsLogger(self.run_dir, self.spec.tracking) if self.rank == 0 else None
        self.faults = FaultHooks(self.spec.faults, self.rank, self.run_dir)
        self.load_model()
        self.data = self._data()
        self._start()

    def load_model(self) -> None:
        """The model (from the checkpoint this run resumes, else ``spec.model_path``), the plan applied, the
        frozen prefix, the wrapper, optimizer and scheduler; a checkpoint's state restored."""
        spec, session, tcfg = self.spec, self.session, self.cfg.train
        with session.checkpoint_dir(spec.resume_from, spec.checkpoint_root) as ckpt:
            state = None
            model_path = spec.model_path
            lora = self.plan.adapter == "lora"
            if ckpt is not None:
                state = read_train_state(ckpt)  # weights_only: tensors and plain containers only
                if state["master"] is None and not lora:  # float32 checkpoint: its model/ holds the master weights
                    model_path = str(Path(ckpt) / "model")
            model, tokenizer = load_model(model_path, dtype="float32", device="cpu")  # wrap() moves it to the device
            if lora:  # the base model + adapters (a checkpoint's model/ is merged: a resume starts from the base)
                inject_lora(model, self.plan)
                if ckpt is not None:
                    load_adapter_state(model, Path(ckpt) / ADAPTER_DIR)
            if state is not None and state["master"] is not None:  # bf16 checkpoint: base + float32 master copies
                load_master_weights(model, state.pop("master"))
        model.train()
        model.config.use_cache = False
        self.model, self.tokenizer = model, tokenizer
        # LISA: the draw of the checkpoint's interval (its optimizer state is that draw's); step 1's on a fresh start
        self.step_plan_step = max(int(state["step"]) if state is not None else 0, 1)
        self.step_plan = self.plan.at_step(self.step_plan_step)
        self.counts = apply_plan(model, self.step_plan)
        enable_activation_checkpointing(model, tcfg)
        self.sdpa_backend, sdpa_note = resolve_sdpa_backend(tcfg.sdpa_backend, self.device)
        self.fallbacks = [n for n in (sdpa_note, compile_decoder_layers(model, tcfg, self.device)) if n]
        self.chunk_tokens = loss_chunk_tokens(tcfg, model, self.world)
        self.flops_per_token = flops_per_token(model, self.plan, self.cfg.data.seq_len)
        self.peak_flops = peak_flops(device_name(self.device), tcfg.peak_tflops)
        self.wrapped = session.wrap(model, self.device, tcfg.distributed, bf16=uses_bf16(tcfg))
        self.model = unwrap(self.wrapped)  # FSDP2 shards in place: the same object, its parameters now DTensors
        self.prefix = FrozenPrefix(self.model, self.plan)  # after wrapping: its hooks run before FSDP's own
        self.optimizer = make_optimizer(self.model, self.step_plan, tcfg)
        self.optimizer_fused = bool(self.optimizer.defaults.get("fused"))
        if tcfg.fused_adamw and not self.optimizer_fused:
            self.fallbacks.append(f"train.fused_adamw=true: no fused AdamW on {self.device.type}; torch's default ran")
        self.scheduler = make_scheduler(self.optimizer, tcfg)
        self.params = trainable_params(self.wrapped)
        self._verify(verify.check_setup(self.model, self.step_plan, self.optimizer, "after wrapping"), "after_wrapping")
        if state is not None:
            self._restore(state)
            self._verify(verify.check_setup(self.model, self.step_plan, self.optimizer, "after loading the checkpoint",
                                            resumed=self.start_step > 0 and state["optimizer"] is not None),
                         "after_checkpoint_load")

    def _verify(self, rows: list, when: str) -> None:
        """Rank 0 logs a freeze check's per-part table to MLflow (the check itself raised on a mismatch)."""
        if self.rank == 0 and self.logger is not None:
            self.logger.text(verify.table_text(rows, when.replace("_", " ")), f"freeze_check/{when}.txt")

    def _restore(self, state: dict) -> None:
        """Optimizer, scheduler, this rank's RNG states, the step and the loss history of a checkpoint. A final
        checkpoint (no optimizer state) resumes only to evaluate and publish: training on from it is refused."""
        if state["optimizer"] is None:
            if int(state["step"]) < self.cfg.train.max_steps:
                raise RaycptError(f"the checkpoint of step {state['step']} was its run's last (no optimizer state): "
                                  f"it cannot train on to train.max_steps={self.cfg.train.max_steps}; start a new run")
        else:
            load_optim_state(self.model, self.optimizer, state["optimizer"], self.fsdp)
        self.scheduler.load_state_dict(state["scheduler"])
        rngs = state.get("rng") or []
        if self.rank < len(rngs):
            set_rng_state(rngs[self.rank])
        self.start_step = int(state["step"])
        self.history = list(state.get("losses", []))

    def tokens_per_step(self) -> int:
        t = self.cfg.train
        return self.world * t.grad_accum * t.micro_batch_size * self.cfg.data.seq_len

    def _data(self) -> Iterator[tuple[int, torch.Tensor]]:
        """This rank's micro-batches, after the ones the steps before ``start_step`` consumed."""
        spec, session, tcfg = self.spec, self.session, self.cfg.train
        replay = session.replay_batches(spec) if self.cfg.data.replay.ratio > 0 else None
        return micro_batches(session.batches(spec), self.cfg.data, tcfg.micro_batch_size, self.rank, self.world,
                             tcfg.seed, skip=self.start_step * tcfg.grad_accum, replay=replay)

    def _start(self) -> None:
        """The callbacks' view of the loop; rank 0 logs the plan and a start/resume event; callbacks start."""
        self.loop = LoopState(step=self.start_step, max_steps=self.cfg.train.max_steps, model=self.model,
                              wrapped=self.wrapped, plan=self.plan, rank=self.rank, world_size=self.world,
                              device=self.device, cfg=self.cfg, run_dir=self.run_dir, logger=self.logger)
        if self.rank == 0:
            counts, plan = self.counts, self.plan
            self.logger.params({"plan": plan.describe()[:500], "plan.layer_map": plan.layer_map(),
                                "trainable_params": counts["trainable"], "frozen_params": counts["frozen"],
                                "plan.frozen_prefix_no_grad": self.prefix.active, "world_size": self.world,
                                "optimizer_fused": self.optimizer_fused,
                                "sdpa_backend_forced": self.sdpa_backend})
            for line in self.fallbacks:
                self.logger.event({"event": "fallback", "line": line})
            self.logger.event({"event": "start" if self.start_step == 0 else "resume", "step": self.start_step,
                               "trainable": counts["trainable"], "frozen": counts["frozen"],
                               "world_size": self.world, "time": time.time(), "pid": os.getpid(),
                               "setup_s": time.perf_counter() - self.t_setup})
        for cb in self.callbacks:
            cb.on_train_start(self.loop)

    # ------------------------------------------------------------------------------------------------ train

    def train(self) -> dict:
        """Steps ``start_step + 1 .. max_steps``; a checkpoint every ``checkpoint_every`` and at the end.
        Returns the status: ``finished``, or ``nonfinite`` (loss, gradient norm or weights) at the step it stopped."""
        tcfg = self.cfg.train
        last_ckpt = self.start_step if self.start_step else None
        for step in range(self.start_step + 1, tcfg.max_steps + 1):
            self.faults.before_step(step)
            metrics = self.step(step)
            if metrics.get("status") == "nonfinite":
                return {"status": "nonfinite", "step": step, "what": metrics["what"], "value": metrics["value"],
                        "last_checkpoint_step": last_ckpt}
            self.loop.step, self.loop.metrics = step, metrics
            self._after_step(step, metrics)
            if step % tcfg.checkpoint_every == 0 or step == tcfg.max_steps:
                why = self.save_checkpoint(step, metrics)
                if why is not None:  # never a checkpoint from non-finite weights
                    return {"status": "nonfinite", "step": step, "what": "weights", "value": why,
                            "last_checkpoint_step": last_ckpt}
                last_ckpt = step
        return {"status": "finished"}

    def step(self, step: int) -> dict:
        """One optimizer step over ``grad_accum`` micro-batches: its metrics, or ``{"status": "nonfinite",
        "what", "value"}`` (gradients dropped, no update) when the mean loss or the gradient norm is not finite."""
        tcfg, optimizer, scheduler, device = self.cfg.train, self.optimizer, self.scheduler, self.device
        switched = self._lisa_switch(step)  # LISA: a new interval trains its own draw
        self.peak = self.peak or StepPeak(device)
        self.peak.start()
        t0, c0 = time.perf_counter(), time.process_time()
        batch = []
        epoch = 0
        for _ in range(tcfg.grad_accum):
            epoch, ids = next(self.data)
            batch.append(ids)
        probe = sdpa_probe() if step == self.start_step + 1 else contextlib.nullcontext()
        with probe as ran:  # the first step of this attempt: which attention kernel the code users run picks
            loss_local = forward_backward(self.wrapped, batch, tcfg.precision, device, model=self.model,
                                          chunk_tokens=self.chunk_tokens, sdpa_backend=self.sdpa_backend)
        if ran is not None:
            self.sdpa_ran = ran
            if self.logger is not None:
                # a record of its own (not an "event": those are the run's lifecycle, start/resume/finished)
                self.logger.event({"sdpa_backend": ran, "step": step, "forced": self.sdpa_backend})
        loss_local = self.faults.loss(step, loss_local)
        self.faults.drop_grads(step, self.model)
        first = step == self.start_step + 1 or switched
        if first:  # the freeze check after this step: who got a gradient, frozen bits before the update
            grads, before = verify.grad_presence(self.model), verify.frozen_fingerprints(self.model)
        loss = float(self.session.all_reduce_mean(loss_local))
        grad_norm = clip_and_norm(self.wrapped, self.params, tcfg.max_grad_norm) if math.isfinite(loss) else float("nan")
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            optimizer.zero_grad(set_to_none=True)
            return {"status": "nonfinite", "what": what, "value": str(loss if what == "loss" else grad_norm)}
        lr = scheduler.get_last_lr()[0] / (optimizer.param_groups[0].get("lr_scale", 1.0) or 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if first:  # LISA: on the first step of every interval, against that interval's draw
            k = lisa_interval_index(step, self.plan.lisa_interval) if switched else None
            tag, text = ("after_first_step", "after the first step") if k is None else (
                f"lisa_interval_{k}", f"at the first step of LISA interval {k}")
            self._verify(verify.check_step(self.model, self.step_plan, optimizer, grads, before, when=text), tag)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.step_times.append(dt)
        self.step_cpu.append(cpu)
        self.history.append(loss)
        peak = self.peak.read_mb()
        tokens = self.tokens_per_step()
        return {"loss": loss, "lr": lr, "grad_norm": grad_norm, "step_time_s": dt, "step_cpu_s": cpu,
                "tokens_per_s": tokens / dt, "epoch": epoch,
                **({"peak_memory_mb": round(peak, 1)} if peak is not None else {}), **lisa_step_metrics(self.step_plan),
                **throughput_metrics(tokens, self.world, dt, self.flops_per_token, self.peak_flops)}

    def _lisa_switch(self, step: int) -> bool:
        """LISA: when ``step`` opens a new interval, train that interval's draw (:meth:`LayerPlan.at_step`) and
        reset the AdamW state of every decoder layer, keeping that of the embeddings, final norm and head (LMFlow's
        ``LISATrainer`` builds a new optimizer per interval and copies the state of its non-layer groups only). The
        optimizer's groups then hold exactly the draw's parameters (the freeze check's "in the optimizer"); the
        scheduler is untouched. Returns whether it switched."""
        plan = self.plan
        if not plan.is_lisa or lisa_interval_index(step, plan.lisa_interval) == \
                lisa_interval_index(max(self.step_plan_step, 1), plan.lisa_interval):
            return False
        new = plan.at_step(step)
        for layer in LayerStack.of(self.model).layers:
            for p in layer.parameters():
                self.optimizer.state.pop(p, None)
        self.counts = apply_plan(self.model, new)
        lists = {(g["lr_scale"], g["decay"]): g["params"]
                 for g in param_groups(self.model, new, self.cfg.train.lr, self.cfg.train.weight_decay)}
        for g in self.optimizer.param_groups:
            g["params"] = lists.pop((g["lr_scale"], g["decay"]), [])
        if lists:
            raise RaycptError(f"lisa: interval of step {step} needs optimizer groups {sorted(lists)} the run lacks")
        self.params = trainable_params(self.wrapped)
        self.step_plan, self.step_plan_step = new, step
        if self.logger is not None:
            self.logger.event({"event": "lisa_draw", "step": step,
                               "interval": lisa_interval_index(step, plan.lisa_interval),
                               "layers": list(new.trainable_layers), "trainable": self.counts["trainable"]})
        return True

    def _after_step(self, step: int, metrics: dict) -> None:
        """Callbacks due at this step (their extra metrics join ``metrics``), then rank 0 logs."""
        for cb in self.callbacks:
            if cb.every and step % cb.every == 0:
                extra = cb.on_step_end(self.loop)
                if extra:
                    metrics.update(extra)
        if self.rank == 0:
            self.logger.event({"step": step, **metrics})
            if step % self.cfg.train.log_every == 0 or step == self.cfg.train.max_steps:
                self.logger.log(metrics, step)

    def save_checkpoint(self, step: int, metrics: dict) -> Optional[str]:
        """A checkpoint of this step (every rank takes part; rank 0 writes): None when written, else why not."""
        tcfg = self.cfg.train
        if self.logger is not None:  # the progress line says "checkpointing" until the timing record below
            self.logger.event({"timing": "checkpoint_begin", "step": step, "time": time.time()})
        t_ckpt = time.perf_counter()
        why = checkpoint(self.session, self.model, self.wrapped, self.tokenizer, self.optimizer, self.scheduler, step,
                         self.history, self.plan, self.fsdp, data_pos=self.spec.data_position(step, metrics["epoch"]),
                         metrics={"step": step, "loss": metrics["loss"]},
                         dtype=weights_dtype(tcfg.precision, self.device),
                         before_write=lambda folder, s=step: self.faults.checkpoint_write(s, folder),
                         final=step == tcfg.max_steps and not tcfg.keep_finished_checkpoints)
        if why is None and self.logger is not None:
            self.logger.event({"timing": "checkpoint", "step": step, "seconds": time.perf_counter() - t_ckpt})
        return why

    # ------------------------------------------------------------------------------------------------ after

    def cleanup(self, status: dict) -> None:
        """Hooks off, callbacks end, rank 0 writes ``train_status.json`` and the end event; all ranks meet."""
        self.prefix.remove()
        for cb in self.callbacks:
            cb.on_train_end(self.loop)
        if self.logger is not None:
            self.logger.close()  # every queued MLflow call has run
        if self.rank == 0 and self.run_dir is not None:
            atomic_write_json(self.run_dir / STATUS_FILE, status)
            self.logger.event({"event": status["status"], "step": self.loop.step, "time": time.time()})
        self.session.barrier()

    def evaluate(self) -> None:
        """In-worker evaluation of the final weights (:func:`evaluate_in_worker`) on this worker's own device."""
        self.optimizer = None  # training is over (its state is in the final checkpoint): freed before any gather
        model, session = eval_model(self.model, self.wrapped, self.plan, self.fsdp, self.rank, self.device,
                                    self.cfg.train.precision, self.session)
        if model is None:
            return
        if self.logger is not None:
            self.logger.event({"event": "evaluate", "step": self.loop.step, "time": time.time()})
        t_eval = time.perf_counter()
        evaluate_in_worker(model, self.tokenizer, self.cfg.eval, self.spec.evaluate, session)
        if self.logger is not None:
            self.logger.event({"timing": "evaluated", "step": self.loop.step, "time": time.time(),
                               "seconds": time.perf_counter() - t_eval})

    def summary(self, status: dict) -> dict:
        return {"status": status, "losses": self.history, "step_times": self.step_times, "step_cpu": self.step_cpu,
                "counts": self.counts, "tokens_per_step": self.tokens_per_step(), "sdpa_ran": self.sdpa_ran,
                "optimizer_fused": self.optimizer_fused,
                "fallbacks": self.fallbacks}
