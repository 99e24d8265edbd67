"""System metrics per logged step window, on rank 0: CPU utilisation, memory and, with a GPU, its
utilisation and memory, logged with the training step under MLflow's own names (``system/...``).

MLflow's :class:`~mlflow.system_metrics.SystemMetricsMonitor` samples on a timer thread every 10 s and
logs with its own counter as the step, and it stops when the run is not the active one's RUNNING run;
a short trial logs nothing. Here MLflow's monitors (the same CPU and NVIDIA GPU collectors) are sampled
once per logged step instead: ``psutil.cpu_percent()`` covers the time since the previous call, so each
value is that step window's utilisation. The GPU monitor needs ``nvidia-ml-py`` (the cluster image
installs it); without it, on CUDA, torch's allocator figures stand in for GPU memory.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)
PREFIX = "system/"


class StepSystemMetrics:
    """``sample()`` -> ``{"system/cpu_utilization_percentage": ..., ...}`` for the window since the
    previous call. Never raises: a collector that fails is dropped with one debug line."""

    def __init__(self):
        self.monitors = []
        self.process = None
        try:
            import psutil

            from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor

            self.monitors.append(CPUMonitor())
            self.process = psutil.Process(os.getpid())
            psutil.cpu_percent()  # starts the first window
        except Exception:  # noqa: BLE001 - psutil missing: no CPU metrics
            log.debug("no CPU system metrics", exc_info=True)
        self.gpu = False
        try:
            from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

            self.monitors.append(GPUMonitor())
            self.gpu = True
        except Exception:  # noqa: BLE001 - no pynvml or no GPU
            pass

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in list(self.monitors):
            try:
                m.collect_metrics()
                out.update(m.aggregate_metrics())
                m.clear_metrics()
            except Exception:  # noqa: BLE001
                log.debug("system metrics collector %s failed", type(m).__name__, exc_info=True)
                self.monitors.remove(m)
        if self.process is not None:
            try:
                out["process_rss_megabytes"] = round(self.process.memory_info().rss / 1e6, 1)
            except Exception:  # noqa: BLE001
                self.process = None
        if not self.gpu:
            out.update(_torch_cuda_memory())
        return {PREFIX + k: float(v) for k, v in out.items()}


def _torch_cuda_memory() -> dict[str, float]:
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        i = torch.cuda.current_device()
        return {f"gpu_{i}_memory_allocated_megabytes": torch.cuda.memory_allocated(i) / 1e6,
                f"gpu_{i}_memory_reserved_megabytes": torch.cuda.memory_reserved(i) / 1e6}
    except Exception:  # noqa: BLE001
        return {}
