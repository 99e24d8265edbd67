"""What ``--resume`` checks before it continues a training folder: its saved settings, the pack of the corpora its
newest checkpoint was trained on, and which checkpoint to continue from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.runs import check_resume_config
from raycpt.train.ckpt.manifest import STATE_JSON, find_checkpoints
from raycpt.train.driver.result import read_json

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


def check_resume_settings(run_dir: Path, cfg: ExperimentConfig, accept: bool = False) -> None:
    """``--resume`` continues a run with the settings it was made with; one line when ``cfg`` differs (``accept``:
    ``--accept-changes``, :func:`raycpt.runs.check_resume_config`)."""
    check_resume_config(run_dir, cfg, accept=accept,
                        why="A resume continues a run with its own settings (its learning-rate schedule depends on "
                            "them).")


def resume_data_mismatch(recorded: Optional[dict], store, prefix: str = "") -> Optional[str]:
    """None when a checkpoint's ``data`` record (``train_state.json``) names the packed store ``store`` holds now,
    else what differs, in a few words; ``prefix`` ``replay_`` reads the replay corpus's entries. A record without a
    store (an older raycpt) passes."""
    rec = {k[len(prefix):]: v for k, v in (recorded or {}).items() if k.startswith(prefix)} if prefix else \
        (recorded or {})
    if rec.get("store_identity"):
        if rec.get("store_key") not in (None, store.key):
            return f"packed store {rec['store_key']}, now {store.key}"
        if rec["store_identity"] != store.identity:
            return f"corpus {rec['store_identity']}, now {store.identity} (the corpus files changed and were re-packed)"
        return None
    if rec.get("store_build") and rec["store_build"] != store.build_id:
        return f"store build {rec['store_build'][:12]}, now {store.build_id[:12]} (the corpus was re-packed)"
    return None


def check_resume_data(ckpt: Path, store, replay=None) -> None:
    """One line when the checkpoint ``--resume`` would continue from was trained on another pack than ``store`` (the
    primary corpus) or ``replay`` (``data.replay.corpus``'s store, None without replay): the remaining steps would
    silently read other tokens. The line names the setting whose corpus changed."""
    recorded = read_json(Path(ckpt) / STATE_JSON).get("data")
    for setting, st, prefix in (("data.corpus", store, ""), ("data.replay.corpus", replay, "replay_")):
        why = resume_data_mismatch(recorded, st, prefix) if st is not None else None
        if why is not None:
            raise RaycptError(f"--resume: checkpoint {ckpt} was trained on other data ({setting}: {why}): its "
                              "remaining steps would read other tokens. Start fresh: the same command without "
                              f"--resume makes a new run (or restore the {setting} files it was trained on and "
                              "re-pack them with `raycpt data prepare [CONFIG] [overrides] --rebuild`, which packs "
                              "data.corpus and data.replay.corpus)")


def check_resume_run(run_dir: Path, cfg: ExperimentConfig, store, replay=None, accept: bool = False) -> None:
    """``--resume`` of ``run_dir``: the packs its newest checkpoint read (:func:`check_resume_data`), then its
    settings (:func:`check_resume_settings`; ``accept`` rewrites them), before the run's MLflow run is touched."""
    found = latest_checkpoint(run_dir)
    if found is not None:
        check_resume_data(found[1], store, replay)
    check_resume_settings(run_dir, cfg, accept=accept)
