"""``raycpt runs export RUN_DIR OUT_DIR``: a published model as a standalone folder.

A sweep or scan trial's ``final_model/`` holds only the layers it trained; the others are relative links to the
base model's shards, shared by every trial under the run root (``<run_root>/base_shards/``,
:mod:`raycpt.models.shards`). ``cp -r`` of such a folder copies the links, which then lead nowhere; this command
verifies the model (its manifest: every file's size and sha256, a damaged shared shard named as such), copies it
with every link replaced by the bytes it points at, writes it aside and renames it into place: ``OUT_DIR`` then
loads with ``from_pretrained`` anywhere, with no run root beside it. A copy that fails (a full disk, a read-only
folder) is one line and is removed; a target inside the folder exported is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from pathlib import Path

from raycpt.errors import RaycptError
from raycpt.io import copy_chunks
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
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RaycptError(f"runs export: {out} already exists and is not empty: nothing was written; name a new folder")
    inside = next((f for f in (model, src) if out == f or out.is_relative_to(f)), None)
    if inside is not None:  # the copy would grow the run, and the next export would copy the copy
        raise RaycptError(f"runs export: {out} is inside {inside}, the folder being exported: nothing was written; "
                          "name a folder outside it")
    why = verify_checkpoint(model, require=("config.json",)) if (model / MANIFEST_FILE).is_file() else \
        weights_problem(model)
    if why is not None:
        raise RaycptError(f"runs export: {model}: {why}")
    made = [p for p in out.parents if not p.exists()]  # folders this export creates (innermost first)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")
    try:
        files = copy_resolved(model, tmp)  # every link replaced by the file it points at
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
    except OSError as e:  # a full disk, a read-only folder: one line, and nothing of the copy is left
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        code = errno.errorcode.get(e.errno or -1, type(e).__name__)
        raise RaycptError(f"runs export: cannot write {e.filename or tmp}: {e.strerror or e} ({code}); nothing was "
                          f"written to {out} (the partial copy was removed): free some space or make it writable, "
                          "then export again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return (f"exported {model} to {out}: {len(files)} files, {size / 1e6:,.1f} MB, no links (a standalone model "
            "folder: from_pretrained loads it anywhere)")


def copy_resolved(src: Path, dst: Path) -> list[Path]:
    """Copy the folder ``src`` into the new folder ``dst``, every link replaced by the bytes it points at, each file
    through :func:`raycpt.io.copy_chunks` and made the user's (0644: the base shards are read-only); the files."""
    files = []
    for root, _, names in os.walk(src, followlinks=True):
        folder = dst / Path(root).relative_to(src)
        folder.mkdir(parents=True, exist_ok=True)
        for name in sorted(names):
            with open(Path(root) / name, "rb") as fi, open(folder / name, "wb") as fo:
                copy_chunks(fi, fo)
            (folder / name).chmod(0o644)
            files.append(folder / name)
    return files


RUNS_EXPORT = NoRun(export_model)
"""``raycpt runs export``: a command that runs no experiment (it copies another command's model)."""
