"""CUDA RNG states restored for the devices that are visible now: a restarted rank that sees fewer devices than
when the checkpoint was written (one GPU pinned, eight at save time) restores its own and does not crash. torch.cuda
is simulated (this machine has no GPU): a device index past device_count() raises as the real call does."""

from __future__ import annotations

import pytest
import torch

from raycpt.train.ckpt.rng import rng_state, set_rng_state


def _fake_cuda(monkeypatch, visible: int) -> list:
    calls = []

    def set_state(state, device=0):
        if not 0 <= int(device) < visible:  # what torch does for a device that is not there
            raise IndexError(f"device {device} out of range ({visible} visible)")
        calls.append((state, int(device)))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_state)  # what torch's set_rng_state_all calls
    return calls


@pytest.mark.parametrize("saved, visible", [(8, 1), (2, 1), (1, 4), (4, 4)])
def test_cuda_rng_restore_uses_the_devices_both_sides_have(monkeypatch, saved, visible):
    st = rng_state()  # the CPU parts, as a checkpoint holds them
    st["cuda"] = [torch.full((16,), i, dtype=torch.uint8) for i in range(saved)]
    calls = _fake_cuda(monkeypatch, visible)
    set_rng_state(st)
    expected = list(range(min(saved, visible)))
    assert [d for _, d in calls] == expected
    assert all(torch.equal(state, st["cuda"][d]) for state, d in calls)  # device i gets the state saved for i


def test_the_simulated_device_count_is_what_set_rng_state_all_trips_on(monkeypatch):
    """The failure the fix removes: torch's own restore-all indexes every saved device."""
    _fake_cuda(monkeypatch, 1)
    with pytest.raises(IndexError):
        torch.cuda.set_rng_state_all([torch.zeros(16, dtype=torch.uint8)] * 2)


def test_cpu_states_still_round_trip():
    st = rng_state()
    a = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    set_rng_state(st)
    b = (torch.rand(3), __import__("numpy").random.rand(), __import__("random").random())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
