"""The continued pre-training loop: ``train_loop_per_worker(config)``, a plain function Ray Train runs.

One worker: load the model from a resolved folder (or from the checkpoint it resumes), apply the
layer plan (:func:`raycpt.strategies.apply_plan`), wrap it for data parallelism with raycpt's own
:func:`raycpt.train.parallel.wrap_model` (DDP, or FSDP2 per decoder layer then the root; the same code
over gloo on CPU and NCCL on GPU), check that it trains exactly the plan (:mod:`raycpt.train.verify`:
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
:mod:`raycpt.train.checkpoint`: ``model/`` (safetensors in the training dtype), ``train_state.pt``
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

Extension point: :class:`raycpt.train.callbacks.StepCallback` objects (``config["callbacks"]``; the
launcher adds those of the factories registered there) run on every rank every ``callback.every``
steps and may return extra metrics (``train.drift_every`` plugs in here).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from raycpt.data.store import read_store
from raycpt.data.stream import ArrayBlocks, PackedBlocks, iter_micro_batches
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.models.adapters import ADAPTER_DIR, inject_lora, load_adapter_state
from raycpt.strategies import LayerPlan, apply_plan, lisa_interval_index, param_groups
from raycpt.train.checkpoint import (checkpoint, checkpoint_step, find_checkpoints, json_safe, load_master_weights,
                                     load_optim_state, model_state, read_train_state, remember_written,
                                     set_rng_state, verify_checkpoint, weights_dtype)
from raycpt.train.background import BackgroundCalls
from raycpt.train.callbacks import LoopState
from raycpt.train.loss import model_loss
from raycpt.train.parallel import clip_grad_norm, unwrap, wrap_model
from raycpt.train import verify
from raycpt.train.step_options import enable_activation_checkpointing, loss_chunk_tokens, uses_bf16
from raycpt.train.sysmetrics import StepSystemMetrics
from raycpt.train.peakmem import StepPeak
from raycpt.train.throughput import device_name, flops_per_token, peak_flops, throughput_metrics

METRICS_FILE = "train_metrics.jsonl"
STATUS_FILE = "train_status.json"


# ------------------------------------------------------------------------------------ pieces

class FrozenPrefix:
    """Forward pre-hooks: grad mode off at the embeddings, back on at the first trainable module.

    Installed only when the embeddings are frozen. ``first`` is the plan's first trainable module
    (layer index, or N when only final norm/head train)."""

    def __init__(self, model, plan: LayerPlan):
        from raycpt.models.stack import LayerStack

        self.handles = []
        self.active = False
        first = plan.first_trainable
        if first is None or first < 0:
            return
        stack = LayerStack.of(model)
        resume_at = stack.layers[first] if first < stack.num_layers else stack.final_norm
        self._prev: list[bool] = []

        def off(module, args):
            self._prev.append(torch.is_grad_enabled())
            torch.set_grad_enabled(False)

        def on(module, args):
            torch.set_grad_enabled(self._prev.pop() if self._prev else True)

        # prepend: installed after wrapping, these run before FSDP2's own pre-forward of that module, so the
        # first trainable layer unshards and registers its backward hooks with grad mode back on
        self.handles = [stack.embed.register_forward_pre_hook(off, prepend=True),
                        resume_at.register_forward_pre_hook(on, prepend=True)]
        self.active = True
        self.prefix_layers = first

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def make_optimizer(model, plan: LayerPlan, tcfg, wrapped=None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only (per-layer LR groups; no decay on 1-D tensors)."""
    groups = param_groups(model, plan, tcfg.lr, tcfg.weight_decay, wrapped=wrapped)
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)


def make_scheduler(optimizer, tcfg):
    from transformers import get_scheduler

    warmup = int(math.ceil(tcfg.warmup_ratio * tcfg.max_steps))
    return get_scheduler(tcfg.scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=tcfg.max_steps)


def autocast_for(precision: str, device: torch.device):
    """bf16 autocast on GPU for ``auto``/``bf16``; float32 (no autocast) on CPU unless ``bf16``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def trainable_params(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def forward_backward(wrapped, micro_batches: list[torch.Tensor], precision: str, device: torch.device,
                     model=None, chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """Loss and gradients of one optimizer step over ``micro_batches`` (each ``(b, seq)`` token ids).

    Returns the mean loss (a detached scalar). DDP gradients are synchronised on the last
    micro-batch only (``no_sync`` before). ``chunk_tokens``: the chunked LM-head loss
    (:func:`raycpt.train.loss.model_loss`, through ``wrapped``'s forward; ``model`` is the bare
    module); None = the model's own loss over full logits."""
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    try:
        for j, ids in enumerate(micro_batches):
            ids = ids.to(device, non_blocking=True)
            sync = j == n - 1 or not hasattr(wrapped, "no_sync")
            with (contextlib.nullcontext() if sync else wrapped.no_sync()):
                with autocast_for(precision, device):
                    loss = model_loss(wrapped, model if model is not None else wrapped, ids, chunk_tokens)
                loss = loss.float() / n
                loss.backward()
            total += loss.detach()
    finally:
        torch.set_grad_enabled(True)
    return total


def clip_and_norm(wrapped, params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip (max_norm > 0) and return the total gradient norm of the trainable parameters (FSDP2's
    sharded gradients: the norm of the whole gradient, :func:`raycpt.train.parallel.clip_grad_norm`)."""
    limit = max_norm if max_norm > 0 else float("inf")
    if any(hasattr(p, "to_local") for p in params):
        return clip_grad_norm(params, limit)
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


def train_step(wrapped, optimizer, scheduler, micro_batches, precision="fp32", device=None, max_grad_norm=1.0,
               params=None, chunk_tokens: Optional[int] = None) -> dict[str, float]:
    """One complete optimizer step on one process (no cross-rank loss averaging): for tests/benchmarks."""
    device = device or torch.device("cpu")
    params = params if params is not None else trainable_params(wrapped)
    loss = float(forward_backward(wrapped, micro_batches, precision, device, chunk_tokens=chunk_tokens))
    gn = clip_and_norm(wrapped, params, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss, "grad_norm": gn}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------ logging

class MetricsLogger:
    """Rank 0's sink: a JSONL file in the run folder (the driver's progress bar tails it) + MLflow.

    Metric and param writes (a SQLite write or an HTTP round trip each) run on one background thread,
    in order (:class:`raycpt.train.background.BackgroundCalls`), so a step never waits for the store;
    :meth:`close` (end of the loop) waits for what is queued."""

    def __init__(self, run_dir: Optional[Path], mlflow_cfg: Optional[dict]):
        self.path = Path(run_dir) / METRICS_FILE if run_dir else None
        self.client = None
        self.run_id = None
        self.logged_through = 0
        self._queue: Optional[BackgroundCalls] = None
        if mlflow_cfg and mlflow_cfg.get("run_id"):
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=mlflow_cfg["uri"])
            self.run_id = mlflow_cfg["run_id"]
            self.uri = mlflow_cfg["uri"]
            # a resumed attempt re-runs the steps after its checkpoint: MLflow keeps one point per step
            history = self._guarded(self.client.get_metric_history, 1, self.run_id, "loss") or []
            self.logged_through = max((m.step for m in history), default=0)
            self.system = StepSystemMetrics()  # CPU / memory / GPU of this step window, logged with the step

    def _guarded(self, fn, step: Optional[int], *args, **kwargs):
        """``fn(...)`` unless the tracking server was found gone; the first call that finds it gone (it does not
        answer) records that with the step whose record did not arrive (``tracking_lost.json`` in the run folder,
        :func:`raycpt.tracking.mark_lost`): later calls are skipped, training goes on, the driver says so."""
        from raycpt.tracking import mark_lost, tracking_lost, unreachable

        if tracking_lost():
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - only a server that does not answer is swallowed
            if not unreachable(e):
                raise
            mark_lost(self.uri, step, str(e), self.path.parent if self.path is not None else None)
            return None

    def event(self, record: dict) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
                f.flush()

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.client is None or step <= self.logged_through:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step) for k, v in {**metrics, **self.system.sample()}.items()
              if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if ms:
            self._submit(self._guarded, self.client.log_batch, step, self.run_id, metrics=ms)

    def params(self, params: dict[str, Any]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Param

        # a resumed run re-logs the same params: that error is logged and ignored (never fails training)
        self._submit(self._guarded, self.client.log_batch, None, self.run_id,
                     params=[Param(k, str(v)[:500]) for k, v in params.items()])

    def _submit(self, fn, *args, **kwargs) -> None:
        if self._queue is None:
            self._queue = BackgroundCalls()
        self._queue.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Wait until every queued MLflow call has run (then the thread ends)."""
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    def text(self, text: str, artifact_file: str) -> None:
        """A text artifact of the run (queued like the metrics)."""
        if self.client is not None:
            self._submit(self._guarded, self.client.log_text, None, self.run_id, text, artifact_file)

    def artifact(self, path) -> None:
        if self.client is None:
            return
        self.close()  # metrics first, then the artifact (end of training)
        try:
            self._guarded(self.client.log_artifact, None, self.run_id, str(path))
        except Exception:  # noqa: BLE001 - an artifact store hiccup must not fail the training run
            pass


# ------------------------------------------------------------------------------------ sessions

class _Session:
    rank = 0
    world_size = 1
    local_world_size = 1

    def device(self, use_gpu: bool) -> torch.device:
        return torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")

    def checkpoint_dir(self) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def wrap(self, model, device, strategy: str, bf16: bool = False):
        """DDP or FSDP2 applied by raycpt (:func:`raycpt.train.parallel.wrap_model`); one worker: the bare model."""
        return wrap_model(model, device, strategy, self.world_size, bf16=bf16)

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        raise NotImplementedError

    def batches(self, config: dict) -> Any:
        raise NotImplementedError

    def barrier(self) -> None:
        pass

    def all_gather_object(self, obj) -> list:
        return [obj]

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        return t


def newest_checkpoint(ray_dir: Optional[str], checkpoint_root: Optional[str], resume_from: Optional[str]
                      ) -> Optional[str]:
    """The newest verified checkpoint among Ray's (``ray_dir``), those under ``checkpoint_root`` and
    ``resume_from`` (the last only when there is no other), or None."""
    cands = [(checkpoint_step(ray_dir), ray_dir)] if ray_dir and verify_checkpoint(ray_dir) is None else []
    if checkpoint_root:
        cands += [(st, str(p)) for st, p in find_checkpoints(checkpoint_root)]
    if resume_from and not cands and verify_checkpoint(resume_from) is None:
        cands.append((checkpoint_step(resume_from), str(resume_from)))
    return max(cands, key=lambda c: c[0])[1] if cands else None


class _Collectives:
    """torch.distributed collectives over the default process group (a no-op with one process)."""

    world_size = 1

    def _dist(self):
        import torch.distributed as dist

        return dist if self.world_size > 1 and dist.is_available() and dist.is_initialized() else None

    def barrier(self) -> None:
        d = self._dist()
        if d is not None:
            d.barrier()

    def all_gather_object(self, obj) -> list:
        d = self._dist()
        if d is None:
            return [obj]
        out = [None] * self.world_size
        d.all_gather_object(out, obj)
        return out

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        d = self._dist()
        if d is None:
            return t
        t = t.clone()
        d.all_reduce(t)
        return t / self.world_size


class RaySession(_Collectives, _Session):
    """Inside a Ray Train worker."""

    def __init__(self):
        import ray.train

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.local_world_size = ctx.get_local_world_size()

    def device(self, use_gpu: bool) -> torch.device:
        if use_gpu:
            import ray.train.torch

            d = ray.train.torch.get_device()
            return d[0] if isinstance(d, list) else d
        return torch.device("cpu")

    @contextlib.contextmanager
    def checkpoint_dir(self, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None):
        """The folder to resume from: the newest of Ray's checkpoint (``get_checkpoint()``), any newer
        complete one of this run on disk (a report cut short by a killed worker is uploaded but never
        registered with Ray) and ``resume_from``. Rank 0 decides; every rank uses its choice."""
        import ray.train

        ckpt = ray.train.get_checkpoint()
        with (ckpt.as_directory() if ckpt is not None else contextlib.nullcontext(None)) as d:
            # only rank 0 reads and hashes the checkpoints; the others take its choice
            best = newest_checkpoint(d, checkpoint_root, resume_from) if self.rank == 0 else None
            yield self.all_gather_object(best)[0]

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        import ray.train

        from raycpt.train.checkpoint import disk_errors_as_oserror

        ckpt = ray.train.Checkpoint.from_directory(ckpt_dir) if ckpt_dir else None
        with disk_errors_as_oserror(self.storage_dir(step)):  # Ray's copy into the run folder, on a full disk
            ray.train.report(metrics, checkpoint=ckpt, checkpoint_dir_name=f"checkpoint_{step:06d}")

    def storage_dir(self, step: int) -> str:
        """Where Ray persists this step's checkpoint (the words of an error name it)."""
        import ray.train

        try:
            return str(Path(ray.train.get_context().get_storage().experiment_fs_path) / f"checkpoint_{step:06d}")
        except Exception:  # noqa: BLE001 - a Ray without that view: the checkpoint's name alone
            return f"checkpoint_{step:06d}"

    def batches(self, config: dict, key: str = "store"):
        return store_blocks(config, key)

    def replay_batches(self, config: dict):
        """The replay corpus's packed store (``config["replay_store"]``)."""
        return self.batches(config, "replay_store")


def store_blocks(config: dict, key: str = "store") -> PackedBlocks:
    """The packed store the launcher chose (``config[key]``: ``store`` or ``replay_store``), memory-mapped; no Ray Data."""
    store = read_store(Path(config[key]))
    if store is None or store.build_id != config.get(f"{key}_build", store.build_id):
        raise RaycptError(f"the packed store {config[key]} was removed or re-packed while this run used it; "
                          "run it again")
    return PackedBlocks(store.path, store.manifest)


class InProcessSession(_Session):
    """One worker in the process that calls ``TorchTrainer.fit()``: Train V2's local mode
    (``ScalingConfig(num_workers=0)``, :func:`raycpt.train.launch.local_mode`). World size 1, the CPU; Ray keeps
    no checkpoint there (and its ``ray.train`` calls refuse to run inside a Tune trial), so this session writes
    each checkpoint beside its place, ``<checkpoint_root>/checkpoint_<step>``, renames it in and keeps the
    newest ``keep``: the same folders a worker group's checkpoints land in, so resume finds them alike."""

    def __init__(self, checkpoint_root: str, keep: int = 2, base_shards: Optional[str] = None):
        self.root = Path(checkpoint_root)
        self.keep = max(1, int(keep))
        self.base_shards = base_shards
        """The base model's per-layer shards (``train.publish: reference``): each checkpoint's ``model/`` links the
        layers equal to the base instead of writing them (:func:`raycpt.train.checkpoint.save_model_by_reference`)."""

    @contextlib.contextmanager
    def checkpoint_dir(self, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None):
        yield newest_checkpoint(None, checkpoint_root, resume_from)

    def checkpoint_scratch(self) -> str:
        """Where a checkpoint is written before :meth:`report` renames it into place (the same filesystem)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return str(self.root)

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        if not ckpt_dir:
            return
        dest = self.root / f"checkpoint_{step:06d}"
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(ckpt_dir, dest)
        remember_written(dest)  # its manifest was hashed from these files a moment ago: publish need not again
        for old in sorted(p for p in self.root.glob("checkpoint_*") if p.is_dir())[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def batches(self, config: dict, key: str = "store"):
        return store_blocks(config, key)

    def replay_batches(self, config: dict):
        """The replay corpus's packed store (``config["replay_store"]``)."""
        return self.batches(config, "replay_store")


class LocalSession(_Session):
    """The same loop in a plain process (no Ray): blocks from a numpy array, checkpoints in a folder."""

    def __init__(self, blocks: np.ndarray, checkpoint_root: Optional[Path] = None,
                 replay_blocks: Optional[np.ndarray] = None):
        self.blocks = np.asarray(blocks)
        self.replay = None if replay_blocks is None else np.asarray(replay_blocks)
        self.root = Path(checkpoint_root) if checkpoint_root else None
        self.reports: list[tuple[dict, Optional[str]]] = []

    @contextlib.contextmanager
    def checkpoint_dir(self, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None):
        yield resume_from

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        dest = None
        if ckpt_dir and self.root is not None:
            dest = self.root / f"checkpoint_{step:06d}"
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(ckpt_dir, dest)
        self.reports.append((metrics, str(dest) if dest else None))

    def batches(self, config: dict):
        return ArrayBlocks(self.blocks)

    def replay_batches(self, config: dict):
        if self.replay is None:
            raise RaycptError("data.replay.ratio > 0 but this session has no replay blocks")
        return ArrayBlocks(self.replay)


def micro_batches(source, data_cfg, mbs: int, rank: int, world: int, seed: int, skip: int, replay=None
                  ) -> Iterator[tuple[int, torch.Tensor]]:
    """Endless ``(epoch, (mbs, seq) LongTensor)`` of this rank's share of ``source`` in the seeded
    order of each epoch (:mod:`raycpt.data.stream`), starting after ``skip`` micro-batches. ``replay`` (a
    second block source) mixes in at ``data_cfg.replay.ratio`` (:mod:`raycpt.data.replay`)."""
    seed = data_cfg.shuffle_seed if data_cfg.shuffle_seed is not None else seed
    rcfg = getattr(data_cfg, "replay", None)
    if replay is not None and rcfg is not None and rcfg.ratio > 0:
        from raycpt.data.replay import iter_mixed_micro_batches

        it = iter_mixed_micro_batches(source, replay, mbs, ratio=rcfg.ratio, rank=rank, world=world, seed=seed,
                                      window=data_cfg.shuffle_window, skip=skip, mix_window=rcfg.window)
    else:
        it = iter_micro_batches(source, mbs, rank=rank, world=world, seed=seed, window=data_cfg.shuffle_window,
                                skip=skip)
    for epoch, rows in it:
        yield epoch, torch.from_numpy(rows)


class FaultHooks:
    """Test-only fault injection, from ``config["faults"]`` (the launcher merges ``RAYCPT_FAULTS``).

    ``sigkill_step`` (with ``sigkill_rank``, default 0): SIGKILL this worker once, before that step
    (a marker file in the run folder makes a restarted worker go on); ``step_sleep``: seconds to
    sleep before every step; ``nan_step``: that step's loss becomes NaN; ``drop_grad_layer``: that
    decoder layer's gradients are dropped after every backward (the freeze check must stop the run);
    ``oserror_step`` (with ``oserror_errno``, a name such as ``ENOSPC``, the default): that step's checkpoint
    write fails as a full disk does, ``OSError(errno, strerror, <its folder>/model.safetensors)``, after a first
    file is written into the folder (every attempt: a full disk stays full). The loop calls :meth:`before_step`
    before a step's timer starts and :meth:`loss` on the step's local loss."""

    def __init__(self, faults: Optional[dict], rank: int, run_dir: Optional[Path]):
        self.faults = dict(faults or {})
        self.rank = rank
        self.run_dir = run_dir

    def before_step(self, step: int) -> None:
        f = self.faults
        if f.get("sigkill_step") == step and f.get("sigkill_rank", 0) == self.rank and self.run_dir is not None:
            marker = self.run_dir / f".fault_sigkill_{step}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        if f.get("step_sleep"):
            time.sleep(float(f["step_sleep"]))

    def checkpoint_write(self, step: int, folder: str) -> None:
        """``oserror_step``: the checkpoint write of that step fails, half-written (see the class docstring)."""
        if self.faults.get("oserror_step") != step:
            return
        import errno

        code = getattr(errno, str(self.faults.get("oserror_errno", "ENOSPC")))
        Path(folder, "train_state.json").write_text("{")  # what a disk that filled mid-write leaves
        raise OSError(code, os.strerror(code), str(Path(folder) / "model.safetensors"))

    def loss(self, step: int, loss_local: torch.Tensor) -> torch.Tensor:
        return loss_local * float("nan") if self.faults.get("nan_step") == step else loss_local

    def drop_grads(self, step: int, model) -> None:
        """``drop_grad_layer``: that layer's gradients vanish after backward (what a wrapper bug does)."""
        layer = self.faults.get("drop_grad_layer")
        if layer is None:
            return
        from raycpt.models.stack import LayerStack

        for p in LayerStack.of(model).layers[int(layer)].parameters():
            p.grad = None


@dataclass
class _Worker:
    """Everything the steps of :func:`run_loop` share on one rank."""

    config: dict
    session: Any
    cfg: Any
    rank: int
    world: int
    run_dir: Optional[Path]
    device: torch.device
    plan: LayerPlan
    fsdp: bool
    logger: Optional[MetricsLogger]
    faults: FaultHooks
    callbacks: list
    model: Any = None
    tokenizer: Any = None
    wrapped: Any = None
    optimizer: Any = None
    scheduler: Any = None
    params: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    prefix: Optional[FrozenPrefix] = None
    start_step: int = 0
    history: list = field(default_factory=list)
    step_times: list = field(default_factory=list)
    step_cpu: list = field(default_factory=list)  # this process's CPU seconds per step (all its threads)
    t_setup: float = field(default_factory=time.perf_counter)  # when this rank's setup began
    chunk_tokens: Optional[int] = None  # the chunked loss's rows per chunk; None = the plain loss
    flops_per_token: float = 0.0
    peak_flops: Optional[float] = None
    step_plan: Optional[LayerPlan] = None  # what trains now: ``plan`` itself, or LISA's current interval's draw
    step_plan_step: int = 1  # a step of step_plan's interval
    peak: Optional[StepPeak] = None  # this rank's per-step peak memory (:mod:`raycpt.train.peakmem`)

    def start_step_of(self, state: Optional[dict]) -> int:
        """The step a checkpoint state was written at (0 without one); also where step_plan's interval is."""
        self.step_plan_step = max(int(state["step"]) if state is not None else 0, 1)
        return self.step_plan_step


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point (see the module docstring for the config keys; ``local_mode``: Train V2's local
    mode, the loop in the calling process, :class:`InProcessSession`)."""
    if config.get("local_mode"):
        run_loop(config, InProcessSession(config["checkpoint_root"], config["cfg"]["train"]["keep_checkpoints"],
                                          config.get("base_shards")))
    else:
        run_loop(config, RaySession())


def run_loop(config: dict, session: _Session) -> dict:
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


def _evaluate(w: _Worker, state: LoopState, req: "EvalRequest") -> None:
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


def cast_weights(model, dtype: torch.dtype):
    """``model``'s parameters in ``dtype``, in place; its buffers as they are: a model loaded in ``dtype`` keeps
    float32 buffers (RoPE's ``inv_freq``), and ``model.to(dtype)`` would round them, so that in-worker evaluation
    scored another function than the saved model (scripts/device_check.py's eval_same_model)."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def eval_model(w: _Worker) -> tuple[Any, Optional[_Session]]:
    """The model in-worker evaluation scores, and the session that shards its questions.

    One dtype for both evaluation paths: the trained weights in the dtype the checkpoint stores them in
    (:func:`weights_dtype`: bf16 when training in bf16), which is what evaluating the saved model scores
    (:func:`raycpt.train.launch.final_evaluation` loads it in that dtype). DDP / one worker: the model
    itself, cast in place (training is over), every rank a share of the questions. FSDP: the full state
    is gathered (every rank takes part), rank 0 evaluates a plain copy alone on its device; the other
    ranks return (None, None)."""
    dtype = weights_dtype(w.cfg.train.precision, w.device)
    if w.plan.adapter == "lora":  # the merged weights, as the final checkpoint's model/ holds them
        from raycpt.models.adapters import merge_lora_

        w.optimizer = None
        merge_lora_(w.model)
    if not w.fsdp:
        return cast_weights(w.model, dtype), w.session
    from transformers import AutoModelForCausalLM

    w.optimizer = None  # its state is in the final checkpoint; free it before the gather
    msd = model_state(w.model, w.wrapped, True)
    if w.rank != 0:
        return None, None
    plain = AutoModelForCausalLM.from_config(w.model.config)
    plain.load_state_dict(msd)
    return plain.to(w.device, dtype).eval(), None


def _setup(config: dict, session: _Session) -> _Worker:
    """The config rebuilt, this rank's device and torch threads, the seed, rank 0's logger."""
    from raycpt.config import config_from_dict

    cfg = config_from_dict(config["cfg"])
    tcfg = cfg.train
    rank, world = session.rank, session.world_size
    run_dir = Path(config["run_dir"]) if config.get("run_dir") else None
    device = session.device(tcfg.use_gpu)
    if device.type == "cpu":
        torch.set_num_threads(int(config.get("torch_threads") or max(1, (os.cpu_count() or 1) // max(1, session.local_world_size))))
    seed_everything(tcfg.seed)
    logger = MetricsLogger(run_dir, config.get("mlflow")) if rank == 0 else None
    return _Worker(config=config, session=session, cfg=cfg, rank=rank, world=world, run_dir=run_dir, device=device,
                   plan=LayerPlan.from_dict(config["plan"]), fsdp=tcfg.distributed == "fsdp" and world > 1,
                   logger=logger, faults=FaultHooks(config.get("faults"), rank, run_dir),
                   callbacks=list(config.get("callbacks") or []))


def _load_model(w: _Worker) -> None:
    """The model (from the checkpoint this run resumes, else ``model_path``), the plan applied, the
    frozen prefix, the wrapper, optimizer and scheduler; a checkpoint's state restored."""
    from raycpt.models.sources import load_model

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


def lisa_switch(w: "_Worker", step: int) -> bool:
    """LISA: when ``step`` opens a new interval, train that interval's draw (:meth:`LayerPlan.at_step`) and
    reset the AdamW state of every decoder layer, keeping that of the embeddings, final norm and head (LMFlow's
    ``LISATrainer`` builds a new optimizer per interval and copies the state of its non-layer groups only). The
    optimizer's groups then hold exactly the draw's parameters (the freeze check's "in the optimizer"); the
    scheduler is untouched. Returns whether it switched."""
    plan = w.plan
    if not plan.is_lisa or lisa_interval_index(step, plan.lisa_interval) == \
            lisa_interval_index(max(w.step_plan_step, 1), plan.lisa_interval):
        return False
    from raycpt.models.stack import LayerStack

    new = plan.at_step(step)
    for layer in LayerStack.of(w.model).layers:
        for p in layer.parameters():
            w.optimizer.state.pop(p, None)
    w.counts = apply_plan(w.model, new)
    lists = {(g["lr_scale"], g["decay"]): g["params"]
             for g in param_groups(w.model, new, w.cfg.train.lr, w.cfg.train.weight_decay)}
    for g in w.optimizer.param_groups:
        g["params"] = lists.pop((g["lr_scale"], g["decay"]), [])
    if lists:
        raise RaycptError(f"lisa: interval of step {step} needs optimizer groups {sorted(lists)} the run lacks")
    w.params = trainable_params(w.wrapped)
    w.step_plan, w.step_plan_step = new, step
    if w.logger is not None:
        w.logger.event({"event": "lisa_draw", "step": step, "interval": lisa_interval_index(step, plan.lisa_interval),
                        "layers": list(new.trainable_layers), "trainable": w.counts["trainable"]})
    return True


def _verify(w: _Worker, rows: list, when: str) -> None:
    """Rank 0 logs a freeze check's per-part table to MLflow (the check itself raised on a mismatch)."""
    if w.rank == 0 and w.logger is not None:
        w.logger.text(verify.table_text(rows, when.replace("_", " ")), f"freeze_check/{when}.txt")


def _restore(w: _Worker, state: dict) -> None:
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


def _tokens_per_step(w: _Worker) -> int:
    t = w.cfg.train
    return w.world * t.grad_accum * t.micro_batch_size * w.cfg.data.seq_len


def _data(w: _Worker) -> Iterator[tuple[int, torch.Tensor]]:
    """This rank's micro-batches, after the ones the steps before ``start_step`` consumed."""
    config, session, tcfg = w.config, w.session, w.cfg.train
    ga, mbs, start_step = tcfg.grad_accum, tcfg.micro_batch_size, w.start_step
    replay = session.replay_batches(config) if w.cfg.data.replay.ratio > 0 else None
    return micro_batches(session.batches(config), w.cfg.data, mbs, w.rank, w.world, tcfg.seed, skip=start_step * ga,
                         replay=replay)


def _start(w: _Worker) -> LoopState:
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


def _train(w: _Worker, data, state: LoopState) -> dict:
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
                                                       "store_identity": w.config.get("store_identity")},
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


def _step(w: _Worker, data, step: int) -> dict:
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
            **({"peak_memory_mb": round(peak, 1)} if peak is not None else {}),
            **throughput_metrics(_tokens_per_step(w), w.world, dt, w.flops_per_token, w.peak_flops)}


def _after_step(w: _Worker, state: LoopState, step: int, metrics: dict) -> None:
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


def _finish(w: _Worker, state: LoopState, status: dict) -> None:
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


EVAL_RESULT_FILE = "eval_result.json"


@dataclass(frozen=True)
class EvalRequest:
    """Evaluate the final weights in the training worker (``run_training(evaluate=...)``) with the loop
    config's own ``cfg.eval``; :func:`raycpt.train.launch.final_evaluation` reads what it wrote."""

    out_dir: str
    """Folder of the evaluation files and ``eval_result.json``."""
    name: str
    """Name of the evaluated model in those files."""
    heldout_path: Optional[str] = None
    """JSON file of token blocks: also write their language-model loss (``heldout_loss``)."""


def evaluate_in_worker(model, tokenizer, eval_cfg, req: EvalRequest, session: Optional[_Session] = None
                       ) -> Optional[Path]:
    """Evaluate the trained model where it already is (this worker's device and threads), with the
    eval bridge, and write ``<out_dir>/eval_result.json`` (``EvalResult.to_dict()``, the flat ``metrics``,
    ``heldout_loss``); :func:`raycpt.train.launch.final_evaluation` reads it.

    With several workers (``session.world_size > 1``) every rank evaluates its share of the
    questions (``evaluate_model(shard=(rank, world))``), rank 0 gathers them
    (:func:`raycpt.evaluate.merge_shards`: the same per-question records and scores as one worker)
    and writes; the other ranks return None.

    The in-memory model equals the final checkpoint (it was saved from these weights), so nothing is
    reloaded; on a cluster the evaluation runs on the training GPU instead of a CPU-only trial actor.
    With ``req.heldout_path`` the file also holds ``heldout_loss`` (:func:`raycpt.evaluate.lm_loss`)."""
    from raycpt.evaluate import evaluate_model, merge_shards

    rank, world = (session.rank, session.world_size) if session is not None else (0, 1)
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = True  # generation mode: the training loop turned the KV cache off
    ckpt = getattr(model, "is_gradient_checkpointing", False)
    if ckpt:
        model.gradient_checkpointing_disable()
    try:
        if world > 1:
            part = evaluate_model(model, eval_cfg, tokenizer=tokenizer, name=req.name, shard=(rank, world))
            parts = session.all_gather_object(part)
            if rank != 0:
                return None
            res = merge_shards(parts, out_dir=req.out_dir)
        else:
            res = evaluate_model(model, eval_cfg, tokenizer=tokenizer, out_dir=req.out_dir, name=req.name)
    finally:
        model.config.use_cache = use_cache
    out = eval_result_record(res, model, req.heldout_path, eval_cfg.batch_size)
    return atomic_write_json(Path(req.out_dir) / EVAL_RESULT_FILE, out)


def eval_result_record(res, model, heldout_path: Optional[str], batch_size: int) -> dict:
    """What ``eval_result.json`` holds: ``EvalResult.to_dict()``, the flat ``metrics``, and with a held-out
    blocks file its ``heldout_loss`` (token mean) and ``heldout_block_losses`` / ``heldout_block_weights``
    (per block, for the paired bootstrap over blocks), and its seconds as ``seconds["heldout"]``; None / absent
    without one."""
    out = {**res.to_dict(), "metrics": res.metrics(), "heldout_loss": None}
    if heldout_path:
        from raycpt.evaluate import block_weights

        t0 = time.perf_counter()
        blocks = json.loads(Path(heldout_path).read_text())
        losses, weights = heldout_block_losses(model, blocks, batch_size), block_weights(blocks)
        out.update(heldout_loss=sum(x * n for x, n in zip(losses, weights)) / sum(weights),
                   heldout_block_losses=losses, heldout_block_weights=weights,
                   seconds={**out.get("seconds", {}), "heldout": time.perf_counter() - t0})
    return out


def heldout_block_losses(model, blocks: list[list[int]], batch_size: int) -> list[float]:
    """Per-block held-out losses: chunked over the vocabulary when the head allows
    (:func:`raycpt.train.loss.chunked_block_losses`), else the full-logit reference."""
    from raycpt.train.loss import chunked_block_losses, chunked_supported

    if chunked_supported(model) is None:
        return chunked_block_losses(model, blocks, batch_size)
    from raycpt.evaluate import lm_block_losses

    return lm_block_losses(model, blocks, batch_size=batch_size)
