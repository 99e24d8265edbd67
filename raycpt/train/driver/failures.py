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
