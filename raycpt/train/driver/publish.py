"""Publishing a verified checkpoint's ``model/`` as the run's final model folder (``final_model/``): a reflink or
byte copy checked against the checkpoint's sha256s, links to the base model's shards, or hard links; written
aside and renamed into place, with its own manifest."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.models.shards import INDEX_FILE, read_shards, read_tensors, shards_problem, write_referencing_weights
from raycpt.train.ckpt.manifest import (MODEL_DIR, checkpoint_step, find_checkpoints, read_manifest,
                                   verify_checkpoint, write_manifest)
from raycpt.train.driver.prepare import local_mode
from raycpt.io import sha256_file
from raycpt.models.shards import checked_shards, ensure_base_shards
from raycpt.train.ckpt.checkpoint import weights_dtype

log = logging.getLogger(__name__)

_FICLONE = 0x40049409  # linux/fs.h: ioctl(dest_fd, FICLONE, src_fd) = reflink the whole file


def copy_file(src: Path, dst: Path) -> str:
    """Copy ``src`` to a new ``dst``: a reflink (``FICLONE``, shares blocks copy-on-write: writing
    either file never changes the other) where the filesystem supports it, else a byte copy
    (``shutil.copyfile``: ``copy_file_range``/``sendfile`` in the kernel). Returns "reflink" or "copy"."""
    import fcntl

    with open(src, "rb") as fs, open(dst, "wb") as fd:
        try:
            fcntl.ioctl(fd.fileno(), _FICLONE, fs.fileno())
            return "reflink"
        except OSError:
            pass
    shutil.copyfile(src, dst)
    return "copy"


def sweep_leftovers(dest) -> list[Path]:
    """Remove the hidden ``.<name>.<id>`` folders a publish of ``dest`` killed mid-way left beside it."""
    dest = Path(dest)
    gone = [p for p in dest.parent.glob(f".{dest.name}.*") if p.is_dir() and not p.is_symlink()]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def publish_model(ckpt, dest, base_shards=None, link: bool = False) -> dict:
    """Publish a verified checkpoint's ``model/`` as ``dest`` (atomically: written aside, checked
    against the checkpoint's sha256s, renamed into place) with its own ``manifest.json``.

    ``base_shards`` (a folder of :func:`raycpt.models.shards.ensure_base_shards` in the checkpoint's dtype):
    the weights are not copied; the decoder layers (and the rest) equal to the base bit for bit become
    relative links to its verified shards, the others go into one ``model-trained.safetensors``
    (how = ``reference``). Leftovers of a publish killed mid-way are removed first.

    ``link``: the checkpoint is deleted right after (``train.keep_finished_checkpoints: false``): when its
    ``model/`` already references these shards (a local-mode checkpoint), its files become hard links and its
    links links again (how = ``link``; nothing is read, written or hashed twice), else as above.

    Raises RaycptError when the checkpoint fails verification. Returns
    ``{"files", "bytes", "seconds", "how"}`` (how = reflink, copy, reference or link; bytes = bytes written)."""
    ckpt, dest = Path(ckpt), Path(dest)
    why = verify_checkpoint(ckpt)
    if why is not None:
        raise RaycptError(f"checkpoint {ckpt} fails its manifest check ({why}): not published")
    t0 = time.perf_counter()
    sweep_leftovers(dest)
    files = {rel[len(MODEL_DIR) + 1:]: meta for rel, meta in read_manifest(ckpt)["files"].items()
             if rel.startswith(MODEL_DIR + "/")}
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        if link and base_shards is not None and _links_to(ckpt / MODEL_DIR, Path(base_shards)):
            known = _link_model(ckpt / MODEL_DIR, files, tmp, dest)
            write_manifest(tmp, checkpoint_step(ckpt), finite=True, extra={"source": str(ckpt)}, known=known)
            _replace(tmp, dest)
            return {"files": len(list(Path(dest).iterdir())), "bytes": 0, "seconds": time.perf_counter() - t0,
                    "how": "link"}
        if base_shards is not None:
            how, known = {"reference"}, _publish_weights_by_reference(ckpt, files, tmp, dest, Path(base_shards))
            files = {rel: meta for rel, meta in files.items() if not _is_weights(rel)}
        else:
            how, known = set(), {}
        total = 0
        for rel, meta in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            how.add(copy_file(ckpt / MODEL_DIR / rel, tmp / rel))
            if sha256_file(tmp / rel) != meta["sha256"]:
                raise RaycptError(f"publishing {ckpt}: the copy of {rel} differs from the checkpoint's")
            total += meta["size"]
        if base_shards is not None:
            total += sum(p.stat().st_size for p in tmp.iterdir() if p.is_file() and not p.is_symlink()
                         and p.name not in files)
        write_manifest(tmp, checkpoint_step(ckpt), finite=True, extra={"source": str(ckpt)}, known=known)
        _replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"files": len(list(Path(dest).iterdir())), "bytes": total, "seconds": time.perf_counter() - t0,
            "how": "reference" if "reference" in how else "reflink" if how == {"reflink"} else "copy"}


def _replace(tmp: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def _links_to(model_dir: Path, shards: Path) -> bool:
    """Every symbolic link in ``model_dir`` points into ``shards`` (and there is an index naming the files)."""
    links = [p for p in model_dir.iterdir() if p.is_symlink()]
    root = shards.resolve()
    return (model_dir / INDEX_FILE).is_file() and all(p.resolve().parent == root for p in links)


def _link_model(model_dir: Path, files: dict, tmp: Path, dest: Path) -> dict:
    """``model_dir``'s files hard-linked into ``tmp`` (to be renamed to ``dest``), its links to the base shards
    made again relative to ``dest``. Returns the manifest entries: the checkpoint's (verified) sha256 and size of
    each file, since a hard link is the same bytes."""
    known = {}
    for rel, meta in files.items():
        src, out = model_dir / rel, tmp / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target = os.path.relpath(src.resolve(), (dest / rel).parent)
            os.symlink(target, out)
            known[rel] = {**meta, "link": target}
        else:
            os.link(src, out)
            known[rel] = meta
    return known


def _is_weights(rel: str) -> bool:
    return rel.endswith(".safetensors") or rel.endswith(".safetensors.index.json")


def _publish_weights_by_reference(ckpt: Path, files: dict, tmp: Path, dest: Path, shards: Path) -> dict:
    """The checkpoint's weights (already verified) into ``tmp`` as trained tensors + links to the base shards."""
    why = shards_problem(shards)
    if why is not None:
        raise RaycptError(f"the base shards {shards} do not verify ({why}): remove that folder and run again")
    groups = read_shards(shards)
    tensors = read_tensors(ckpt / MODEL_DIR)
    return write_referencing_weights(tensors, shards, groups, tmp, dest)


def verify_model_folder(folder) -> Optional[str]:
    """:func:`verify_checkpoint` for a published model folder (``final_model/``)."""
    return verify_checkpoint(folder, require=("config.json",))


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints over all attempts; delete the rest (Ray prunes
    only the checkpoints it registered; one cut short by a worker kill is not)."""
    complete = find_checkpoints(Path(run_dir) / "ray")
    keep_set = {p.resolve() for _, p in complete[-keep:]}
    removed = []
    for d in Path(run_dir, "ray").glob("*/checkpoint_*"):
        if d.is_dir() and d.resolve() not in keep_set:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


@contextlib.contextmanager
def base_shards_ahead(cfg: ExperimentConfig, model_path: str, root: Path):
    """``with base_shards_ahead(cfg, model_path, root) as ready:`` - a grid whose trials run in local mode and publish
    by reference (``train.publish: reference``, set per trial by the sweep and the scan) links every trial to the
    base model's per-layer shards, written once per run root by whichever process needs them first: write them
    now, in a background thread, while the driver opens its run and Ray starts (that work leaves a core idle), and
    verify them there (their sha256s). ``ready()`` waits for them and returns the verified folders
    (:func:`raycpt.models.shards.checked_shards`, for the grid's ``shared`` dict: a trial process then trusts them
    while their files are unchanged); call it before the first trial. A failure here is the first trial's to meet
    again and report (it writes and verifies the shards itself); leaving the block waits for the thread. ``root``: the
    run root's shards folder (:attr:`raycpt.runs.location.RunLocation.base_shards`)."""
    if not local_mode(cfg, in_process=True):
        yield lambda: {}
        return
    dtype = str(weights_dtype(cfg.train.precision, "cpu")).replace("torch.", "")

    def write() -> None:
        try:
            read_shards(ensure_base_shards(model_path, root, dtype))
        except Exception as e:  # noqa: BLE001 - the first trial writes them again and reports what fails
            log.debug("base shards ahead of the trials: %s", e)

    thread = threading.Thread(target=write, name="raycpt-base-shards", daemon=True)
    thread.start()

    def ready() -> dict:
        thread.join()
        return checked_shards()

    try:
        yield ready
    finally:
        thread.join()


def drop_checkpoints(run_dir: Path) -> list[Path]:
    """Delete every checkpoint of a finished run (weights and optimizer state): ``final_model/`` holds what it
    trained and nothing resumes a finished run (``train.keep_finished_checkpoints: false``)."""
    ray_dir = Path(run_dir, "ray")  # with the half-written ones a killed local-mode run left (.raycpt-ckpt-*)
    gone = [d for d in [*ray_dir.glob("*/checkpoint_*"), *ray_dir.glob("*/.raycpt-ckpt-*")] if d.is_dir()]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone
