"""Peak memory of one training step, as the device counts it: a step's activations are freed before any
sampler runs, so the resident memory after the step is not its peak.

CUDA: ``torch.cuda.max_memory_allocated`` since ``reset_peak_memory_stats`` (the allocator's own peak).
CPU on Linux: the kernel's high-water mark of this process's resident set (``VmHWM`` in
``/proc/self/status``), reset to the current RSS before the step by writing ``5`` to
``/proc/self/clear_refs`` (cheap: it only resets the counter). Elsewhere (no ``/proc``, a sandbox that
refuses the write): None, and the step logs no peak.
"""

from __future__ import annotations

from typing import Optional

import torch

STATUS, CLEAR = "/proc/self/status", "/proc/self/clear_refs"


def hwm_kb(status_text: str) -> Optional[int]:
    """``VmHWM`` in KiB from the text of ``/proc/<pid>/status``; None without that line."""
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


class StepPeak:
    """``start()`` before a step, ``read_mb()`` after it: that step's peak memory in MB (1e6 bytes), or None."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.ok = True

    def start(self) -> None:
        if not self.ok:
            return
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open(CLEAR, "w") as f:
                f.write("5")
        except OSError:
            self.ok = False

    def read_mb(self) -> Optional[float]:
        if not self.ok:
            return None
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 1e6
        try:
            with open(STATUS) as f:
                kb = hwm_kb(f.read())
        except OSError:
            kb = None
        if kb is None:
            self.ok = False
            return None
        return kb * 1024 / 1e6
