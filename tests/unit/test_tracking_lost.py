"""Issue 27 helpers, no Ray and no server: what counts as a tracking server gone, what a lost server makes
:func:`raycpt.tracking.tracked` do, the step metrics ``raycpt runs sync`` replays, a folder's state never left
``running``, and the test-only full-disk fault."""

import errno
import json
import time

import pytest



def test_unreachable_reads_the_cause_chain_not_any_mlflow_error(fresh_lost):
    from mlflow.exceptions import MlflowException

    tr = fresh_lost
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as inner:
            raise MlflowException("API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed") from inner
    except MlflowException as e:
        wrapped = e
    assert tr.unreachable(wrapped)
    assert tr.unreachable(MlflowException("API request to http://h/x failed with exception "
                                          "HTTPConnectionPool(host='h'): Max retries exceeded with url: /x"))
    assert not tr.unreachable(MlflowException("Changing param values is not allowed. Param with key='lr'"))
    assert not tr.unreachable(ValueError("no"))


def test_tracked_swallows_only_a_server_gone_then_skips_every_later_call(fresh_lost, tmp_path):
    import os

    tr = fresh_lost
    calls = []

    def gone():
        calls.append("gone")
        raise ConnectionError("refused")

    assert tr.tracked(lambda: 7) == 7
    with pytest.raises(ValueError):
        tr.tracked(lambda: (_ for _ in ()).throw(ValueError("a bug stays loud")))
    assert tr.tracking_lost() is None
    assert tr.tracked(gone) is None and calls == ["gone"]
    assert tr.tracking_lost() is not None
    assert tr.tracked(lambda: calls.append("later")) is None and calls == ["gone"]  # skipped
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"  # nothing waits on MLflow's retries again
    rec = tr.mark_lost("http://127.0.0.1:9", 3, "x", tmp_path)
    assert json.loads((tmp_path / tr.LOST_FILE).read_text()) == rec == tr.read_lost(tmp_path)
    line = tr.lost_line(tmp_path, {"uri": "http://127.0.0.1:9", "since_step": 3})
    assert tr.adopt_lost(tmp_path, since=time.time() + 60) is None  # a file of an earlier attempt
    assert tr.adopt_lost(tmp_path) == rec
    assert line == (f"warning: tracking server http://127.0.0.1:9 unreachable since step 3: results are in {tmp_path}; "
                    f"sync them with `raycpt runs sync {tmp_path}` (add --tracking-uri URI for another store)")


def test_ended_state_never_leaves_running(tmp_path):
    from raycpt.runs import ended_state, read_state, write_state

    write_state(tmp_path, status="running")
    with pytest.raises(OSError):
        with ended_state(tmp_path):
            raise OSError(errno.ENOSPC, "No space left on device", "/x")
    st = read_state(tmp_path)
    assert st["status"] == "failed" and "No space left on device" in st["error"]
    write_state(tmp_path, status="running")
    with pytest.raises(KeyboardInterrupt):
        with ended_state(tmp_path):
            raise KeyboardInterrupt
    assert read_state(tmp_path)["status"] == "interrupted"
    write_state(tmp_path, status="running")
    with ended_state(tmp_path):
        pass
    assert read_state(tmp_path)["status"] == "running"  # success is the caller's to write


def test_the_full_disk_fault_fails_only_its_step_half_written(tmp_path):
    from raycpt.errors import environment_error
    from raycpt.train.worker.faults import FaultHooks

    hooks = FaultHooks({"oserror_step": 2}, 0, tmp_path)
    hooks.checkpoint_write(1, str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as e:
        hooks.checkpoint_write(2, str(tmp_path))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "model.safetensors")
    assert (tmp_path / "train_state.json").is_file()  # what a disk that filled mid-write leaves
    line = str(environment_error(e.value))
    assert f"cannot write {tmp_path / 'model.safetensors'}: No space left on device (ENOSPC)" in line
    with pytest.raises(OSError) as e:
        FaultHooks({"oserror_step": 3, "oserror_errno": "EACCES"}, 0, None).checkpoint_write(3, str(tmp_path))
    assert e.value.errno == errno.EACCES


def test_a_full_disk_or_unwritable_root_is_not_retryable_wherever_ray_hangs_it():
    import errno

    from raycpt.errors import non_retryable_oserror

    full = OSError(errno.ENOSPC, "No space left on device", "/r/model.safetensors")

    class Group(Exception):  # Ray Train's WorkerGroupError: rank -> the worker's own exception
        def __init__(self, failures):
            super().__init__("worker group failed")
            self.worker_failures = failures

    class Wrapped(Exception):  # Ray's UserExceptionWithTraceback / RayTaskError shapes
        def __init__(self, base):
            super().__init__("wrapped")
            self._base_exc, self.cause = base, None

    assert non_retryable_oserror(full) is full
    assert non_retryable_oserror(Group({1: ValueError("x"), 0: full})) is full
    assert non_retryable_oserror(Wrapped(Group({0: full}))) is full
    try:
        try:
            raise full
        except OSError as inner:
            raise RuntimeError("checkpoint failed") from inner
    except RuntimeError as e:
        assert non_retryable_oserror(e) is full
    for name in ("EROFS", "EACCES", "EPERM", "EDQUOT"):
        err = OSError(getattr(errno, name), "x", "/r")
        assert non_retryable_oserror(Group({0: err})) is err, name
    # a flaky device, a connection reset, a plain bug: Ray's own retries decide
    assert non_retryable_oserror(Group({0: OSError(errno.EIO, "I/O error")})) is None
    assert non_retryable_oserror(Group({0: ConnectionResetError(errno.ECONNRESET, "reset")})) is None
    assert non_retryable_oserror(Group({0: ValueError("bug")})) is None
    assert non_retryable_oserror(None) is None


def test_the_failure_policy_raises_a_full_disk_at_once_and_retries_the_rest():
    import errno

    pytest.importorskip("ray.train.v2")
    from ray.train import FailureConfig
    from ray.train.v2._internal.execution.failure_handling.failure_policy import FailureDecision
    from ray.train.v2.api.exceptions import WorkerGroupError

    from raycpt.train.driver.failures import OneLineFailurePolicy

    policy = OneLineFailurePolicy(FailureConfig(max_failures=2))
    full = WorkerGroupError("w", {0: OSError(errno.ENOSPC, "No space left on device", "/r/x")})
    assert policy.make_decision(full) == FailureDecision.RAISE
    other = WorkerGroupError("w", {0: RuntimeError("a worker died")})
    decisions = [policy.make_decision(other) for _ in range(3)]  # max_failures=2: two retries, then raise
    assert decisions == [FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]


def test_a_full_disk_told_in_words_becomes_the_oserror_of_the_one_line(tmp_path, monkeypatch):
    import errno

    from raycpt.errors import environment_error, oserror_in_words
    from raycpt.train.ckpt import checkpoint as ck
    # what safetensors and pyarrow said on a full 1 MB tmpfs here (torch.save said only "unexpected pos 576 vs 534")
    st = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    e = oserror_in_words(st, tmp_path / "ckpt")
    assert (e.errno, e.filename) == (errno.ENOSPC, str(tmp_path / "ckpt"))
    arrow = OSError("Failed to open local file '/runs/train-x/ray/a1/checkpoint_000002/model.safetensors'. "
                    "Detail: [errno 30] Read-only file system")
    e = oserror_in_words(arrow, "/elsewhere")
    assert (e.errno, e.filename) == (errno.EROFS, "/runs/train-x/ray/a1/checkpoint_000002/model.safetensors")
    assert "Read-only file system (EROFS)" in str(environment_error(e))
    assert oserror_in_words(RuntimeError("Permission denied"), "/r").errno == errno.EACCES
    assert oserror_in_words(RuntimeError("unexpected pos 576 vs 534"), "/r") is None  # no words: statvfs decides
    assert oserror_in_words(OSError(errno.ENOSPC, "x"), "/r") is None  # has its errno already
    assert oserror_in_words(RuntimeError("errno 104 connection reset"), "/r") is None

    monkeypatch.setattr("raycpt.errors.disk_full", lambda path, spare=1 << 20: True)
    with pytest.raises(OSError) as got:
        with ck.disk_errors_as_oserror(tmp_path):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert (got.value.errno, got.value.filename) == (errno.ENOSPC, str(tmp_path))
    monkeypatch.setattr("raycpt.errors.disk_full", lambda path, spare=1 << 20: False)
    with pytest.raises(RuntimeError):  # a disk with room: torch's error stays what it is
        with ck.disk_errors_as_oserror(tmp_path):
            raise RuntimeError("unexpected pos 576 vs 534")


def test_an_oserror_without_its_path_gets_the_folder_written(tmp_path):
    import errno

    from raycpt.train.ckpt import checkpoint as ck
    # what pyarrow raised when Ray copied a checkpoint onto a full tmpfs: errno 28, no filename
    with pytest.raises(OSError) as got:
        with ck.disk_errors_as_oserror(tmp_path / "checkpoint_000002"):
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert (got.value.errno, got.value.filename) == (errno.ENOSPC, str(tmp_path / "checkpoint_000002"))
