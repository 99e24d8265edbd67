"""Per-step peak memory (raycpt.train.worker.peakmem) and the train result's peak / LISA per-step count."""

import os

import pytest
import torch

from raycpt.train.worker.peakmem import StepPeak, hwm_kb


def test_hwm_parsed_from_status_text():
    text = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  123456 kB\nVmRSS:\t  100000 kB\n"
    assert hwm_kb(text) == 123456
    assert hwm_kb("Name:\tpython\n") is None


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024 / 1e6


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_a_freed_step_allocation_is_in_the_peak_and_the_next_step_forgets_it():
    peak = StepPeak(torch.device("cpu"))
    peak.start()
    before = _rss_mb()
    x = torch.ones(50_000_000)  # 200 MB, touched, then freed before the read: RSS after the step misses it
    del x
    first = peak.read_mb()
    assert first is not None and first - before >= 190
    assert _rss_mb() < first - 150  # the sampler after the step would not have seen it
    peak.start()  # the next step's peak starts from the current RSS
    second = peak.read_mb()
    assert second < first - 150


def test_train_result_peak_and_lisa_count_from_records():
    from raycpt.strategies import LayerPlan
    from raycpt.train.driver.result import peak_of, per_step_trainable

    assert peak_of([{"step": 1, "peak_memory_mb": 10.5}, {"step": 2}, {"step": 3, "peak_memory_mb": 12.0}]) == 12.0
    assert peak_of([{"step": 1}]) is None
    lisa = LayerPlan(name="lisa", num_layers=4, trainable_layers=(0, 1, 2, 3), lisa_layers=1, lisa_interval=2)
    events = [{"event": "start", "step": 0, "trainable": 700}, {"event": "lisa_draw", "step": 3, "trainable": 700},
              {"event": "finished", "step": 4}]
    assert per_step_trainable(lisa, events) == 700
    plain = LayerPlan(name="full", num_layers=4, trainable_layers=(0, 1, 2, 3))
    assert per_step_trainable(plain, events) is None
