"""Test-only fault injection in the training worker (:class:`FaultHooks`)."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path
from typing import Optional

import torch

from raycpt.models.stack import LayerStack


class FaultHooks:
    """Test-only fault injection, from ``config["faults"]`` (the launcher merges ``RAYCPT_FAULTS``).

    ``sigkill_step`` (with ``sigkill_rank``, default 0): SIGKILL this worker once, before that step
    (a marker file in the run folder makes a restarted worker go on); ``step_sleep``: seconds to
    sleep before every step; ``nan_step``: that step's loss becomes NaN; ``drop_grad_layer``: that
    decoder layer's gradients are dropped after every backward (the freeze check must stop the run);
    ``oserror_step`` (with ``oserror_errno``, a name such as ``ENOSPC``, the default): that step's checkpoint
    write fails as a full disk does, ``OSError(errno, strerror, <its folder>/model.safetensors)``, after a first
    file is written into the folder (every attempt: a full disk stays full). The loop calls :meth:`before_step`
    before a step's timer starts and :meth:`loss` on the step's local loss. ``kill_ray_step`` (with
    ``kill_ray_process``, ``gcs_server`` by default, or ``raylet``): SIGKILL that process of this node's Ray before
    that step, as ``kill -9`` or the out-of-memory killer would."""

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
        if f.get("kill_ray_step") == step and self.rank == 0:
            kill_ray_process(str(f.get("kill_ray_process", "gcs_server")))
        if f.get("step_sleep"):
            time.sleep(float(f["step_sleep"]))

    def checkpoint_write(self, step: int, folder: str) -> None:
        """``oserror_step``: the checkpoint write of that step fails, half-written (see the class docstring)."""
        if self.faults.get("oserror_step") != step:
            return

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
        for p in LayerStack.of(model).layers[int(layer)].parameters():
            p.grad = None



def kill_ray_process(name: str) -> None:
    """SIGKILL the Ray process ``name`` of this worker's node: the first one found among the children of this
    process's ancestors (the raylet is the worker's parent; the GCS its sibling under the driver)."""
    import psutil

    cur = psutil.Process()
    while cur is not None:
        for p in [cur, *cur.children()]:
            if p.name() == name:
                p.kill()
                return
        cur = cur.parent()
