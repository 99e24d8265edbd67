"""``raycpt runs export RUN_DIR OUT_DIR``: a published model as a standalone folder.

A sweep or scan trial's ``final_model/`` holds only the layers it trained; the others are relative links to the
base model's shards, shared by every trial under the run root (``<run_root>/base_shards/``,
:mod:`raycpt.models.shards`). ``cp -r`` of such a folder copies the links, which then lead nowhere; this command
verifies the model (its manifest: every file's size and sha256, a damaged shared shard named as such), copies it
with every link replaced by the bytes it points at, writes it aside and renames it into place: ``OUT_DIR`` then
loads with ``from_pretrained`` anywhere, with no run root beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from raycpt.errors import RaycptError
from raycpt.jobs.job import NoRun, Options
from raycpt.models.folders import find_model_in_run, is_model_folder
from raycpt.models.shards import weights_problem
from raycpt.train.ckpt.manifest import MANIFEST_FILE, verify_checkpoint


def export_model(cfg, options: Options) -> str:
    """Copy the model of a run (or trial, or model) folder into ``OUT_DIR`` with its links resolved; the line said."""
    del cfg  # the model is the folder's, not the command line's config
    if len(options.rest) != 2:
        raise RaycptError("runs export: name the run, trial or model folder and the folder to write, e.g. raycpt "
                          "runs export RUNS/sweep-NAME-ID/trials/full ./full-model")
    src, out = (Path(w).expanduser().resolve() for w in options.rest)
    model = src if is_model_folder(src) else (find_model_in_run(src) if src.is_dir() else None)
    if model is None:
        raise RaycptError(f"runs export: {src} holds no published model (a final_model/ folder)")
    why = verify_checkpoint(model, require=("config.json",)) if (model / MANIFEST_FILE).is_file() else \
        weights_problem(model)
    if why is not None:
        raise RaycptError(f"runs export: {model}: {why}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RaycptError(f"runs export: {out} already exists and is not empty: nothing was written; name a new folder")
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
    try:
        shutil.copytree(model, tmp, symlinks=False)  # every link replaced by the file it points at
        files = [f for f in tmp.rglob("*") if f.is_file()]
        for f in files:
            f.chmod(0o644)  # the base shards are read-only; the copy is the user's
        manifest = tmp / MANIFEST_FILE
        if manifest.is_file():
            doc = json.loads(manifest.read_text())
            for meta in doc.get("files", {}).values():
                meta.pop("link", None)
            manifest.write_text(json.dumps(doc, indent=1))
            why = verify_checkpoint(tmp, require=("config.json",))
            if why is not None:  # pragma: no cover - the copy differs from what was just verified
                raise RaycptError(f"runs export: the copy in {tmp} fails its manifest check: {why}")
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return (f"exported {model} to {out}: {len(files)} files, {size / 1e6:,.1f} MB, no links (a standalone model "
            "folder: from_pretrained loads it anywhere)")


RUNS_EXPORT = NoRun(export_model)
"""``raycpt runs export``: a command that runs no experiment (it copies another command's model)."""
