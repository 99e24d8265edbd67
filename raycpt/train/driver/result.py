"""A training run's result (``train_result.json``) and the numbers read from its step records: tokens/s, peak
memory, the per-step trainable count, the end metrics its run gets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError


@dataclass
class TrainResult:
    """What a training run produced."""

    run_dir: Path
    final_model_dir: Path
    losses: list[float]
    steps: list[int]
    tokens_per_s: float
    wall_s: float
    trainable_params: int
    frozen_params: int
    mlflow_run_id: Optional[str]
    plan: dict
    last_checkpoint: Optional[Path] = None
    resumed_from_step: Optional[int] = None
    step_times: list[float] = field(default_factory=list)
    reused: bool = False
    """True when ``--resume`` found the run finished and re-ran nothing (the figures are the saved ones)."""
    peak_memory_mb: Optional[float] = None
    """The largest per-step peak memory of rank 0 (:mod:`raycpt.train.worker.peakmem`); None where it cannot be read."""
    trainable_per_step: Optional[int] = None
    """LISA: the parameters one step trains (γ layers + the always-trained ones); ``trainable_params`` counts
    every layer a draw can pick. None for other plans (every step trains ``trainable_params``)."""
    pid: Optional[int] = None
    """Rank 0's process id (its start event): trials that share a process (Ray Train's local mode in one
    reused Tune actor) share its resident memory, so a later trial's peak includes what earlier ones left."""

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("run_dir", "final_model_dir", "last_checkpoint"):
            d[k] = None if d[k] is None else str(d[k])
        return d


def final_metrics(res: TrainResult) -> dict:
    """The end-of-run metrics of a training run's MLflow run (``raycpt runs sync`` logs the same)."""
    out = {"final_loss": res.losses[-1] if res.losses else float("nan"), "wall_time_s": res.wall_s,
           "median_tokens_per_s": res.tokens_per_s}
    if res.peak_memory_mb is not None:
        out["peak_memory_mb"] = res.peak_memory_mb
    return out


def peak_of(records: list[dict]) -> Optional[float]:
    """The largest ``peak_memory_mb`` of the step records; None when no step has one."""
    peaks = [float(r["peak_memory_mb"]) for r in records if r.get("peak_memory_mb") is not None]
    return max(peaks) if peaks else None


def start_pid(events: list[dict]) -> Optional[int]:
    pids = [e["pid"] for e in events if e.get("event") in ("start", "resume") and e.get("pid") is not None]
    return int(pids[-1]) if pids else None


def per_step_trainable(plan, events: list[dict]) -> Optional[int]:
    """LISA: the largest count one step trained (the start / resume and ``lisa_draw`` events); else None."""
    if not plan.is_lisa:
        return None
    counts = [int(e["trainable"]) for e in events
              if e.get("event") in ("start", "resume", "lisa_draw") and e.get("trainable") is not None]
    return max(counts) if counts else None


def median_tokens_per_s(records: list[dict]) -> float:
    if not records:
        return 0.0
    rates = sorted(float(r["tokens_per_s"]) for r in records)
    return rates[len(rates) // 2]  # median: robust to the first (warm-up) step


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def result_from_files(run_dir: Path, state: dict, records: Optional[list[dict]] = None) -> TrainResult:
    """The saved result of a finished run (``--resume`` re-runs nothing). An older or hand-edited
    ``train_result.json`` that lacks what the step records (``records``, ``train_metrics.jsonl``) also hold - the
    losses, steps, step times, tokens/s - gets them from there; one that lacks what only it holds is one line."""
    path = Path(run_dir) / "train_result.json"
    d, records = read_json(path), list(records or [])
    derived = {"losses": [float(r["loss"]) for r in records], "steps": [int(r["step"]) for r in records],
               "step_times": [float(r["step_time_s"]) for r in records if "step_time_s" in r],
               "tokens_per_s": median_tokens_per_s([r for r in records if "tokens_per_s" in r]) if records else None,
               "wall_s": state.get("wall_s")}
    d = {**{k: v for k, v in derived.items() if v is not None and (v != [] or k == "step_times")}, **d}
    missing = [k for k in ("final_model_dir", "losses", "steps", "tokens_per_s", "wall_s", "trainable_params",
                           "frozen_params", "plan") if d.get(k) is None]
    if missing:
        raise RaycptError(f"--resume: {path} lacks {', '.join(missing)} (an older or hand-edited record, and its step "
                          "records do not hold them either): the saved result cannot be read back; start a new run "
                          "without --resume")
    return TrainResult(run_dir=run_dir, final_model_dir=Path(d["final_model_dir"]), losses=d["losses"],
                       steps=d["steps"], tokens_per_s=float(d["tokens_per_s"]), wall_s=float(d["wall_s"]),
                       trainable_params=d["trainable_params"], frozen_params=d["frozen_params"],
                       mlflow_run_id=d.get("mlflow_run_id"), plan=d["plan"],
                       last_checkpoint=Path(d["last_checkpoint"]) if d.get("last_checkpoint") else None,
                       resumed_from_step=d.get("resumed_from_step"), step_times=d.get("step_times", []), reused=True,
                       peak_memory_mb=d.get("peak_memory_mb"), trainable_per_step=d.get("trainable_per_step"),
                       pid=d.get("pid"))
