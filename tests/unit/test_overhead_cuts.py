"""The fixed-cost cuts of issue 28 decide exactly what the code they replace decided: the finiteness check of a
checkpoint (a sum first) against ``isfinite().all()`` per tensor, the bit comparison of a layer with its base
shard (a wide integer view) against the bytes one by one, the held-out loss's seconds in every evaluation record,
lm-eval's environment report left out only for raycpt's call, and the Ray wait that does the driver's imports."""

import json
import threading

import pytest
import torch

from raycpt.models.shards import _same_bits
from raycpt.train.ckpt.manifest import all_finite


def _naive_finite(sd: dict) -> tuple[int, int]:
    fl = [v for v in sd.values() if torch.is_tensor(v) and v.is_floating_point()]
    return sum(int(not bool(torch.isfinite(v).all())) for v in fl), len(fl)


def test_all_finite_counts_as_the_elementwise_check():
    big = torch.finfo(torch.float32).max
    sd = {
        "ok": torch.randn(1000),
        "nan": torch.tensor([1.0, float("nan"), 2.0]),
        "pinf": torch.tensor([float("inf"), 0.0]),
        "ninf": torch.tensor([-float("inf")]),
        "both_inf": torch.tensor([float("inf"), -float("inf")]),  # the sum is NaN
        "overflow": torch.tensor([big, big, big]),  # finite elements whose sum is inf: finite all the same
        "bf16_overflow": torch.tensor([3e38, 3e38], dtype=torch.bfloat16),
        "bf16_nan": torch.tensor([1.0, float("nan")], dtype=torch.bfloat16),
        "f16_ok": torch.tensor([60000.0, 60000.0], dtype=torch.float16),  # sum 120000 > f16 max, elements finite
        "ints": torch.arange(5),  # not floating: not counted
        "step": 3,
    }
    assert all_finite(sd) == _naive_finite(sd) == (5, 9)
    torch.manual_seed(0)
    for _ in range(50):  # random placements of one bad value among finite ones
        t = torch.randn(257)
        i = int(torch.randint(0, 257, ()))
        t[i] = [float("nan"), float("inf"), -float("inf"), 1e30][i % 4]
        assert all_finite({"t": t}) == _naive_finite({"t": t})


def _naive_same(a, b) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x = a.contiguous().view(-1).view(torch.uint8).tolist()
    y = b.contiguous().view(-1).view(torch.uint8).tolist()
    return x == y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8])
@pytest.mark.parametrize("n", [1, 3, 7, 8, 33, 1024])
def test_same_bits_is_byte_equality(dtype, n):
    torch.manual_seed(n)
    a = (torch.randn(n) * 10).to(dtype)
    assert _same_bits(a, a.clone()) and _naive_same(a, a.clone())
    for pos in {0, n // 2, n - 1}:  # one element changed anywhere, by one unit of its bytes
        b = a.clone()
        b.view(-1).view(torch.uint8)[pos * a.element_size()] ^= 1
        assert _same_bits(a, b) is False and _naive_same(a, b) is False
    assert _same_bits(a, a.clone().reshape(1, n)) is False  # another shape
    if dtype.is_floating_point:
        assert _same_bits(a, a.to(torch.float32 if dtype != torch.float32 else torch.float64)) is False


def test_same_bits_sees_what_value_equality_does_not():
    z, nz = torch.zeros(4), torch.zeros(4)
    nz[2] = -0.0
    assert torch.equal(z, nz) and not _same_bits(z, nz)  # -0.0 == 0.0 as values, not as bits
    nan = torch.full((4,), float("nan"))
    assert not torch.equal(nan, nan.clone()) and _same_bits(nan, nan.clone())  # the same NaN bits


def test_same_bits_on_views_with_an_offset():
    base = torch.randn(11)
    a, b = base[1:], base.clone()[1:]  # storage offset 4 bytes: no int64 view of the storage as it lies
    assert _same_bits(a, b)
    b[5] += 1
    assert not _same_bits(a, b)


def test_every_evaluation_record_has_the_heldout_seconds(tiny_dir, tmp_path):
    """The untrained base of a scan is evaluated by ``final_evaluation``, the trained trials in their worker: both
    write the held-out loss's seconds, which the overhead benchmark counts as computation."""
    from raycpt.config import load_config
    from raycpt.train.driver.final_eval import final_evaluation
    from raycpt.train.worker.evaluation import EvalRequest

    blocks = tmp_path / "heldout.json"
    blocks.write_text(json.dumps([[1, 2, 3, 4, 5, 6, 7, 8]] * 3))
    cfg = load_config(None, ["eval.tasks=[wordnet_mc]", "eval.modes=[logit]", "eval.limit=2"])
    req = EvalRequest(out_dir=str(tmp_path / "eval"), name="base", heldout_path=str(blocks))
    ev, heldout = final_evaluation(tiny_dir, cfg.eval, req, threads=1)
    rec = json.loads((tmp_path / "eval" / "eval_result.json").read_text())
    assert heldout == rec["heldout_loss"] and heldout > 0
    assert rec["seconds"]["heldout"] > 0 and rec["seconds"]["logit"] > 0


def test_lm_eval_environment_report_is_left_out_only_inside_the_call():
    import lm_eval.evaluator as ev

    from raycpt.evaluate import _no_environment_report

    original = ev.add_env_info
    with _no_environment_report():
        results = {"x": 1}
        assert ev.add_env_info(results) is None and results == {"x": 1}  # nothing added, no subprocess run
    assert ev.add_env_info is original
    with pytest.raises(RuntimeError), _no_environment_report():
        raise RuntimeError("an evaluation that fails")
    assert ev.add_env_info is original


class _Starting:
    def __init__(self, up: bool):
        self.up, self.started, self.error = threading.Event(), False, None
        if up:
            self.up.set()

    def join(self):
        self.up.set()


@pytest.mark.parametrize("pending", [True, False])
def test_ray_session_does_the_waiting_work_only_while_ray_starts(monkeypatch, pending):
    import raycpt.runtime as rt

    calls, order = [], []
    early = _Starting(up=not pending)
    monkeypatch.setattr(rt, "_EARLY", [early])
    monkeypatch.setattr(rt, "init_ray", lambda cfg: order.append("init") or False)
    with rt.ray_session(rt.RayConfig(), meanwhile=lambda: calls.append(early.up.is_set()) or order.append("warm")):
        order.append("body")
    assert calls == ([False] if pending else [])  # before the wait, while the start is still under way
    assert order == (["warm", "init", "body"] if pending else ["init", "body"])


def test_a_trial_process_trusts_the_shards_the_driver_verified_until_a_file_changes(tiny_dir, tmp_path, monkeypatch):
    import raycpt.models.shards as sh

    folder = sh.ensure_base_shards(tiny_dir, tmp_path / "base_shards", "float32")
    assert sh.read_shards(folder) is not None  # the driver hashes them (base_shards_ahead's thread)
    handed = json.loads(json.dumps(sh.checked_shards()))  # through Tune's param_space
    monkeypatch.setattr(sh, "_CHECKED", {})  # another process: nothing verified yet
    hashed = []
    real = sh._sha256
    monkeypatch.setattr(sh, "_sha256", lambda p: hashed.append(p.name) or real(p))
    sh.trust_checked(handed)
    assert sh.read_shards(folder) is not None and hashed == []  # unchanged files: not hashed again
    victim = folder / "layer-001.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # one bit pattern changed in place, the size kept (the write moves its modification time)
    victim.write_bytes(bytes(data))
    assert sh.read_shards(folder) is None and "layer-001.safetensors" in hashed  # changed: hashed, refused


def test_log_points_logs_every_finite_point_in_batches(tmp_path):
    """Into a real SQLite store: 1,500 points (two batches) of two keys with a NaN and an infinity among them; the
    histories hold exactly the finite points at their steps."""
    import math

    import mlflow

    from raycpt.tracking import log_points

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}")
    client = mlflow.tracking.MlflowClient()
    exp = client.create_experiment("e")
    run = client.create_run(exp)
    series = [("l2_change", i, i / 7) for i in range(1200)] + [("contribution", i, 1.0 - i) for i in range(300)]
    series[5] = ("l2_change", 5, float("nan"))
    series[1203] = ("contribution", 3, float("inf"))
    assert log_points(client, run.info.run_id, series) == 1498
    hist = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
            for k in ("l2_change", "contribution")}
    assert hist["l2_change"] == [(i, i / 7) for i in range(1200) if i != 5]
    assert hist["contribution"] == [(i, 1.0 - i) for i in range(300) if i != 3]
    other = client.create_run(exp).info.run_id
    assert log_points(client, other, [("x", 2, 0.5), ("x", 1, math.pi)]) == 2
    assert sorted((m.step, m.value) for m in client.get_metric_history(other, "x")) == [(1, math.pi), (2, 0.5)]


def test_state_json_says_how_a_run_ended_when_the_disk_has_no_room_for_a_temporary_file(tmp_path, monkeypatch):
    """The fallback of a full disk (the real one: tests/integration/test_full_disk.py, as root): the temporary
    file cannot be written, the state file is rewritten in place; any other write still goes through a rename, and
    other errors, or a file that does not exist yet, still raise."""
    import errno
    from pathlib import Path

    from raycpt.io import atomic_write_text
    from raycpt.runs import read_state, write_state

    write_state(tmp_path, status="running", command="train")
    real = Path.write_text

    def full(self, *a, **k):
        if self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    write_state(tmp_path, status="failed", error="ENOSPC")
    assert read_state(tmp_path) == {"status": "failed", "command": "train", "error": "ENOSPC"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left
    with pytest.raises(OSError):  # not asked for: the atomic write's error
        atomic_write_text(tmp_path / "state.json", "{}")
    with pytest.raises(OSError):  # nothing to rewrite
        atomic_write_text(tmp_path / "new.json", "{}", in_place_when_full=True)
