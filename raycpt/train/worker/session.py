"""Where the loop runs: a session gives it its rank, device, wrapper, data, collectives and checkpoint storage.

:class:`Session` is the protocol :func:`raycpt.train.worker.loop.run_loop` needs. The sessions: :class:`RaySession`
(a Ray Train worker), :class:`InProcessSession` (Train V2's local mode), :class:`LocalSession` (a plain
process, no Ray) and :class:`raycpt.train.worker.gloo.GlooSession`; they share the defaults of :class:`SessionBase`
(single inheritance) and own their torch.distributed collectives, a :class:`Collectives` value they delegate to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Optional, Protocol

import numpy as np
import torch

from raycpt.data.store import read_store
from raycpt.data.stream import ArrayBlocks, PackedBlocks
from raycpt.errors import RaycptError
from raycpt.train.ckpt.checkpoint import disk_errors_as_oserror
from raycpt.train.ckpt.manifest import checkpoint_step, find_checkpoints, remember_written, verify_checkpoint
from raycpt.train.worker.parallel import wrap_model


class Session(Protocol):
    """What the loop asks of a session (:class:`SessionBase` gives the defaults of the one-process ones)."""

    rank: int
    world_size: int
    local_world_size: int

    def device(self, use_gpu: bool) -> torch.device: ...

    def checkpoint_dir(self, resume_from: Optional[str] = None, checkpoint_root: Optional[str] = None
                       ) -> contextlib.AbstractContextManager: ...

    def wrap(self, model, device, strategy: str, bf16: bool = False): ...

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None: ...

    def batches(self, spec) -> Any: ...

    def replay_batches(self, spec) -> Any: ...

    def barrier(self) -> None: ...

    def all_gather_object(self, obj) -> list: ...

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor: ...


@dataclasses.dataclass(frozen=True)
class Collectives:
    """torch.distributed collectives over the default process group for ``world_size`` processes (a no-op with one
    process): a value a session owns (``session.collectives``) and delegates its ``barrier``, ``all_gather_object``
    and ``all_reduce_mean`` to."""

    world_size: int = 1

    def _dist(self):
        if self.world_size <= 1:  # one process: nothing to talk to (torch.distributed is not even imported)
            return None
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None

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


class SessionBase:
    """The defaults of a session: one process, its collectives the no-ops of :class:`Collectives` with one process;
    a session of several ranks sets ``collectives`` to its own (``Collectives(world_size)``)."""

    rank = 0
    world_size = 1
    local_world_size = 1
    collectives = Collectives()

    def device(self, use_gpu: bool) -> torch.device:
        return torch.device("cuda" if use_gpu and torch.cuda.is_available() else "cpu")

    def checkpoint_dir(self) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def wrap(self, model, device, strategy: str, bf16: bool = False):
        """DDP or FSDP2 applied by raycpt (:func:`raycpt.train.worker.parallel.wrap_model`); one worker: the bare model."""
        return wrap_model(model, device, strategy, self.world_size, bf16=bf16)

    def report(self, metrics: dict, ckpt_dir: Optional[str], step: int) -> None:
        raise NotImplementedError

    def batches(self, spec):
        """The packed corpus (``spec.store``), memory-mapped."""
        return store_blocks(spec.store)

    def replay_batches(self, spec):
        """The replay corpus's packed store (``spec.replay``)."""
        return store_blocks(spec.replay)

    def barrier(self) -> None:
        self.collectives.barrier()

    def all_gather_object(self, obj) -> list:
        return self.collectives.all_gather_object(obj)

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.collectives.all_reduce_mean(t)


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


class RaySession(SessionBase):
    """Inside a Ray Train worker: its collectives are torch.distributed's over Ray Train's process group."""

    def __init__(self):
        import ray.train

        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.world_size = ctx.get_world_size()
        self.local_world_size = ctx.get_local_world_size()
        self.collectives = Collectives(self.world_size)

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


def store_blocks(ref) -> PackedBlocks:
    """The packed store the launcher chose (a :class:`raycpt.train.worker.spec.StoreRef`), memory-mapped; no Ray
    Data. One line when it was removed or re-packed since."""
    store = read_store(Path(ref.path))
    if store is None or store.build_id != (ref.build_id or store.build_id):
        raise RaycptError(f"the packed store {ref.path} was removed or re-packed while this run used it; "
                          "run it again")
    return PackedBlocks(store.path, store.manifest)


class InProcessSession(SessionBase):
    """One worker in the process that calls ``TorchTrainer.fit()``: Train V2's local mode
    (``ScalingConfig(num_workers=0)``, :func:`raycpt.train.driver.prepare.local_mode`). World size 1, the CPU; Ray keeps
    no checkpoint there (and its ``ray.train`` calls refuse to run inside a Tune trial), so this session writes
    each checkpoint beside its place, ``<checkpoint_root>/checkpoint_<step>``, renames it in and keeps the
    newest ``keep``: the same folders a worker group's checkpoints land in, so resume finds them alike."""

    def __init__(self, checkpoint_root: str, keep: int = 2, base_shards: Optional[str] = None):
        self.root = Path(checkpoint_root)
        self.keep = max(1, int(keep))
        self.base_shards = base_shards
        """The base model's per-layer shards (``train.publish: reference``): each checkpoint's ``model/`` links the
        layers equal to the base instead of writing them (:func:`raycpt.train.ckpt.checkpoint.save_model_by_reference`)."""

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


class LocalSession(SessionBase):
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

    def batches(self, spec):
        return ArrayBlocks(self.blocks)

    def replay_batches(self, spec):
        if self.replay is None:
            raise RaycptError("data.replay.ratio > 0 but this session has no replay blocks")
        return ArrayBlocks(self.replay)

