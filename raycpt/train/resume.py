"""What ``--resume`` checks before it continues a training folder: its saved settings, the pack of the corpora its
newest checkpoint was trained on, and which checkpoint to continue from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.runs import resume_changes
from raycpt.train.manifest import STATE_JSON, find_checkpoints
from raycpt.train.result import _read_json

log = logging.getLogger(__name__)


def latest_checkpoint(run_dir: Path, report: bool = False) -> Optional[tuple[int, Path]]:
    """The newest verified checkpoint of any attempt of this run: (step, folder). ``report``: one
    warning line for each checkpoint that fails its manifest check (and so is skipped)."""
    failed: list = []
    cps = find_checkpoints(Path(run_dir) / "ray", failed)
    if report:
        for folder, why in failed:
            log.warning("warning: skipping checkpoint %s: %s", folder, why)
    return cps[-1] if cps else None


def check_resume_settings(run_dir: Path, cfg: ExperimentConfig) -> None:
    """``--resume`` continues a run with the settings it was made with; one line when ``cfg`` differs."""

    changed = resume_changes(run_dir, cfg)
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise RaycptError(f"--resume: {run_dir} was made with other settings: {'; '.join(changed[:3])}{more}. "
                          "A resume continues a run with its own settings (its learning-rate schedule depends on "
                          "them): drop the change, or start a new run without --resume")


def resume_data_mismatch(recorded: Optional[dict], store) -> Optional[str]:
    """None when a checkpoint's ``data`` record (``train_state.json``) names the packed store ``store``
    holds now, else what differs, in a few words. A record without a store (an older raycpt) passes."""
    rec = recorded or {}
    if rec.get("store_identity"):
        if rec.get("store_key") not in (None, store.key):
            return f"packed store {rec['store_key']}, now {store.key}"
        if rec["store_identity"] != store.identity:
            return f"corpus {rec['store_identity']}, now {store.identity} (the corpus files changed and were re-packed)"
        return None
    if rec.get("store_build") and rec["store_build"] != store.build_id:
        return f"store build {rec['store_build'][:12]}, now {store.build_id[:12]} (the corpus was re-packed)"
    return None


def check_resume_data(ckpt: Path, store) -> None:
    """One line when the checkpoint ``--resume`` would continue from was trained on another pack than ``store``:
    the remaining steps would silently read other tokens."""

    why = resume_data_mismatch(_read_json(Path(ckpt) / STATE_JSON).get("data"), store)
    if why is not None:
        raise RaycptError(f"--resume: checkpoint {ckpt} was trained on other data ({why}): its remaining steps would "
                          "read other tokens. Start fresh: the same command without --resume makes a new run (or "
                          "restore the corpus it was trained on and re-pack it with `raycpt data prepare --rebuild`)")


def check_resume_run(run_dir: Path, cfg: ExperimentConfig, store) -> None:
    """``--resume`` of ``run_dir``: its settings (:func:`check_resume_settings`) and the pack its newest
    checkpoint read (:func:`check_resume_data`), before the run's MLflow run is touched."""
    check_resume_settings(run_dir, cfg)
    found = latest_checkpoint(run_dir)
    if found is not None:
        check_resume_data(found[1], store)
