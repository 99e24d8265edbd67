"""Ray Train's failure policy, taught which worker failures a retry cannot cure.

``train.max_failures`` restarts the worker group from the last checkpoint after a worker error. A full disk
(ENOSPC, EDQUOT), a read-only file system (EROFS) or a run root this user may not write (EACCES, EPERM) stays
so on the next attempt: :class:`OneLineFailurePolicy` raises such a failure at once (one attempt, then the
driver's one line, :func:`raycpt.errors.environment_error`). Ray 2.x has no public failure classifier: the
trainer builds its policy from ``FailureConfig`` with ``create_failure_policy`` (in the driver; the policy object
then travels to the controller), which :func:`raycpt_failure_policy` replaces for the time of one ``fit()``.
"""

from __future__ import annotations

import contextlib
from unittest import mock

from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy
from ray.train.v2._internal.execution.failure_handling.failure_policy import FailureDecision

from raycpt.errors import non_retryable_oserror

TRIAL_MAX_FAILURES = 1
"""Retries of a grid trial whose process died (Tune's ``FailureConfig(max_failures)``; the inline grid the same)."""


class OneLineFailurePolicy(DefaultFailurePolicy):
    """The default policy, except that a failure whose chain holds a non-retryable ``OSError`` is raised."""

    def make_decision(self, training_failed_error) -> FailureDecision:
        if non_retryable_oserror(training_failed_error) is not None:
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


@contextlib.contextmanager
def raycpt_failure_policy():
    """Inside: every ``TorchTrainer.fit()`` of this process uses :class:`OneLineFailurePolicy` (a Ray without the
    hook keeps its own policy)."""
    from ray.train.v2.api import data_parallel_trainer as dpt

    if not hasattr(dpt, "create_failure_policy"):
        yield
        return
    with mock.patch.object(dpt, "create_failure_policy", OneLineFailurePolicy):
        yield


WORKER_DEATHS = {"OutOfMemoryError": "killed by Ray's memory monitor (out of memory)",
                 "ActorDiedError": "its process died (ActorDiedError)",
                 "RayActorError": "its process died (RayActorError)",
                 "WorkerCrashedError": "its worker process crashed (WorkerCrashedError)",
                 "NodeDiedError": "its node died (NodeDiedError)"}
"""Ray's exceptions for a process that was killed under the work (by class name, through the class's bases: Ray
raises subclasses, e.g. ``ActorDiedError`` is a ``RayActorError``), and how a trial's failure line says it."""
_OOM_WORDS = ("memory monitor", "outofmemory", "out of memory", "low on memory")


def worker_death(exc: BaseException) -> "str | None":
    """How a worker death anywhere in ``exc``'s chain (``cause``, ``__cause__``, ``__context__``, Ray Train's
    ``worker_failures``) reads in a trial's failure line, e.g. "killed by Ray's memory monitor (out of memory)";
    None when nothing in the chain is a worker death. A death whose message names the memory monitor is said as an
    out-of-memory kill whatever its class; Ray Train's "worker(s) were killed" ``RuntimeError`` is a death too."""
    seen, todo, found = set(), [exc], None
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        text = str(cur).lower()
        names = [c.__name__ for c in type(cur).__mro__]
        if "OutOfMemoryError" in names or (any(n in WORKER_DEATHS for n in names) and
                                           any(w in text for w in _OOM_WORDS)):
            return WORKER_DEATHS["OutOfMemoryError"]
        name = next((n for n in names if n in WORKER_DEATHS), None)
        if name is not None:
            found = found or WORKER_DEATHS.get(names[0]) or f"its process died ({names[0]})"
        elif isinstance(cur, RuntimeError) and "were killed" in text:
            found = found or "its worker process was killed (Ray Train: worker(s) were killed)"
        errs = getattr(cur, "worker_failures", None)
        todo += [getattr(cur, "cause", None), cur.__cause__, cur.__context__,
                 *(errs.values() if isinstance(errs, dict) else [])]
    return found
