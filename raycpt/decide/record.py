"""Which horizon a sweep's ranking was measured to hold at (issue 47, item 4): ``raycpt decide`` leaves a record under
``<run_root>/decisions/<key>.json``; a sweep with the same model, data and steps reads it and says in its verdict's
first line whether its ranking may be read as a longer run's. The key covers what the measurement depends on (the
model reference and revision, the corpus, the sequence length, the batch and the steps); a record that does not
read back as one is treated as absent (the sweep then says the horizon is not measured).

Measurements made for a shipped config travel with raycpt (``raycpt/assets/decisions/<key>.json``, the same format,
``run_dir`` saying when and where it was measured): a sweep of the embedded default reads the default's measurement
from a fresh clone. A record under the run root (the user's own ``raycpt decide``) comes first."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "decisions"
"""Records measured for the shipped configs (read after the run root's own)."""


def decision_key(cfg, steps: int) -> str:
    """16 hex of the settings a decision's measurement holds for, at ``steps`` training steps."""
    doc = {"model": [cfg.model.ref, cfg.model.revision], "corpus": list(cfg.data.corpus),
           "max_documents": cfg.data.max_documents, "seq_len": cfg.data.seq_len,
           "batch": [cfg.train.micro_batch_size, cfg.train.grad_accum, cfg.train.num_workers], "steps": int(steps),
           "lr": cfg.train.lr, "scheduler": cfg.train.scheduler}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_path(folder: Path, cfg, steps: int) -> Path:
    """The record of this config at ``steps`` in ``folder`` (the run root's ``decisions``:
    :attr:`raycpt.runs.location.RunLocation.decisions`)."""
    return Path(folder) / f"{decision_key(cfg, steps)}.json"


def read_record(folder: Path, cfg, steps: int) -> Optional[dict]:
    """The record for this config at ``steps``: in ``folder`` (:func:`record_path`), else the shipped one, else None
    (absent, unreadable, or not a record)."""
    own = record_path(folder, cfg, steps)
    for path in (own, SHIPPED / own.name):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        keys = {"short_steps", "long_steps", "passed", "accuracy_all", "pairs_all", "run_dir"}
        if isinstance(doc, dict) and keys <= set(doc) and doc["short_steps"] == steps:
            return doc
    return None


def horizon_line(steps: int, record: Optional[dict]) -> str:
    """The verdict's first line: whether this ``steps``-step ranking is known to hold at a longer run."""
    if record is None:
        return (f"Horizon: not measured whether this {steps}-step ranking holds in a longer run (raycpt decide CONFIG "
                f"measures it); read the table as a pipeline check, not a decision.")
    acc = f"{record['accuracy_all']:.0%} of {record['pairs_all']} pairs"
    regret = ((record.get("results") or {}).get("top1_regret_sd") or {}).get("value")
    if isinstance(regret, (int, float)) and not record["passed"]:
        acc += f" ordered alike, its pick {regret:.1f} run SDs from the {record['long_steps']}-step best"
    else:
        acc += " ordered alike"
    if record["passed"]:
        return (f"Horizon: this {steps}-step ranking held at {record['long_steps']} steps ({acc}, every "
                f"target of raycpt decide met; {record['run_dir']}).")
    return (f"Horizon: this {steps}-step ranking does NOT predict a {record['long_steps']}-step run ({acc}; "
            f"raycpt decide, {record['run_dir']}): do not act on it - decide at the longer horizon: raycpt sweep "
            f"CONFIG train.max_steps={record['long_steps']}.")
