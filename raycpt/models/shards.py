"""Base-model shards by decoder layer: what a published model references instead of copying frozen layers.

A sweep's trials train a few layers of one base model; the rest of each trial's weights are the base's, byte
for byte. :func:`ensure_base_shards` writes the base model once per run root (and weights dtype) as one
safetensors file per decoder layer (``layer-007.safetensors``) plus one for everything else
(``rest.safetensors``: embeddings, final norm, an untied head), with a ``shards.json`` manifest (written
last: per file its size, sha256 and tensor names). A published model (:func:`raycpt.train.driver.publish.publish_model`
with ``base_shards``) then holds only the groups that differ from the base, in ``model-trained.safetensors``,
relative symbolic links to the base shards of the others, and a ``model.safetensors.index.json`` naming the one
file of every tensor, so ``from_pretrained`` loads it as any sharded checkpoint. Each tensor lives in exactly one
file: transformers loads every tensor of every listed file (the last one wins), so a link to the whole base
file would overwrite the trained layers.

Pure file work (no Ray, no MLflow); a group is "the base's" only when every tensor in it is bitwise equal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Optional

from raycpt.io import read_manifest, sha256_file
from raycpt.models.digests import file_digests

SHARDS_FILE = "shards.json"
SHARDS_FORMAT = "raycpt.base-shards/1"
TRAINED_FILE = "model-trained.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
READ_ONLY = 0o444
"""The mode of every base shard file: a write through one trial's link would change every model that links it."""
_CHECKED: dict[str, tuple] = {}  # shards folder -> stat signature of files whose sha256 matched (this process)


def group_of(name: str) -> str:
    """The shard a tensor name belongs to: ``layer-NNN`` for decoder layer NNN, else ``rest``."""
    m = _LAYER.search(name)
    return f"layer-{int(m.group(1)):03d}" if m else "rest"


def _sha256(path: Path) -> str:
    return sha256_file(path)


def weight_files(model_dir) -> list[Path]:
    """The safetensors weight files of a model folder (one file, or the shards its index names)."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [model_dir / n for n in names]
    return sorted(model_dir.glob("*.safetensors"))


def read_tensors(model_dir, dtype: Optional[str] = None) -> dict:
    """Every tensor of a model folder's safetensors files (floating ones cast to ``dtype`` when given)."""
    import torch
    from safetensors import safe_open

    out = {}
    cast = getattr(torch, dtype) if dtype else None
    for f in weight_files(model_dir):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                out[k] = t.to(cast) if cast is not None and t.is_floating_point() else t
    return out


DIGEST_MEMO = "digests.json"
"""In the shards' root: the base model's weight files' sha256 by size, times and inode (:mod:`raycpt.models.digests`)."""


def shards_key(model_dir, dtype: str, memo: Optional[Path] = None) -> str:
    """Names the shards of one base model in one dtype by content: the sha256 of each of its weight files (hashed
    once through the digest memo ``memo``, :func:`raycpt.models.digests.file_digests`: a file rewritten in place,
    even with its mtime set back, is hashed again), not its path or times: a changed base model gets new shards."""
    files = weight_files(model_dir)
    digests = file_digests(files, memo)
    parts = [dtype] + [f"{f.name}:{digests[str(f)]}" for f in files]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _seal(doc: dict) -> str:
    return hashlib.sha256(json.dumps({k: v for k, v in doc.items() if k != "seal"}, sort_keys=True).encode()
                          ).hexdigest()


def ensure_base_shards(model_dir, root, dtype: str = "float32") -> Path:
    """The per-layer shards of ``model_dir`` in ``dtype`` under ``root`` (written now when missing, or when the folder
    there does not verify - :func:`shards_problem`, e.g. a shard deleted - with one warning line: aside, manifest
    last, renamed into place; a concurrent writer's folder is kept). Returns the folder."""
    from safetensors.torch import save_file

    dest = Path(root) / shards_key(model_dir, dtype, Path(root) / DIGEST_MEMO)
    if (dest / SHARDS_FILE).is_file():
        why = shards_problem(dest)
        if why is None:
            return dest
        # a shard deleted or changed: written again (the same bytes: every trial's link to them reads right again)
        logging.getLogger(__name__).warning("warning: the base shards %s do not verify (%s): written again", dest, why)
        aside = dest.with_name(f".{dest.name}.bad-{uuid.uuid4().hex[:8]}")
        os.replace(dest, aside)
        shutil.rmtree(aside, ignore_errors=True)
    tensors = read_tensors(model_dir, dtype)
    groups: dict[str, dict] = {}
    for k, t in tensors.items():
        groups.setdefault(group_of(k), {})[k] = t.contiguous()
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        files = {}
        for g, part in sorted(groups.items()):
            save_file(part, str(tmp / f"{g}.safetensors"), metadata={"format": "pt"})
            p = tmp / f"{g}.safetensors"
            files[g] = {"file": p.name, "size": p.stat().st_size, "sha256": _sha256(p), "tensors": sorted(part)}
        doc = {"format": SHARDS_FORMAT, "source": str(Path(model_dir).resolve()), "dtype": dtype, "groups": files}
        doc["seal"] = _seal(doc)
        (tmp / SHARDS_FILE).write_text(json.dumps(doc, indent=2), encoding="utf-8")
        for f in tmp.iterdir():  # read-only: every trial's model links these bytes, none may write through its link
            f.chmod(READ_ONLY)
        try:
            os.replace(tmp, dest)
        except OSError:  # another trial wrote them first: theirs are as good
            if not (dest / SHARDS_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _stat_sig(p: Path):
    try:
        st = p.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _groups_shape_ok(groups) -> bool:
    return isinstance(groups, dict) and bool(groups) and all(
        isinstance(m, dict) and isinstance(m.get("file"), str) and "/" not in m["file"]
        and isinstance(m.get("size"), int) and isinstance(m.get("sha256"), str) and isinstance(m.get("tensors"), list)
        for m in groups.values())


def shards_problem(folder) -> Optional[str]:
    """None when a shards folder verifies: its ``shards.json`` is a sealed record of this format (an edit does not
    match its seal) and every file it lists has its recorded size and sha256 (hashed once per process and file
    state: size, times and inode, so a file rewritten in place with its mtime set back is hashed again); else why
    not. What every reader of the shards checks (:func:`read_shards`: a trial's checkpoint, a publish)."""
    folder = Path(folder)
    doc, why = read_manifest(folder / SHARDS_FILE, SHARDS_FORMAT)
    if why is not None:
        return why
    if not _groups_shape_ok(doc.get("groups")):
        return f"its {SHARDS_FILE} is not a {SHARDS_FORMAT} record"
    if doc.get("seal") != _seal(doc):
        return f"its {SHARDS_FILE} does not match its seal (edited, or written by an older raycpt)"
    groups = doc["groups"]
    sig = tuple((m["file"], *(_stat_sig(folder / m["file"]) or [None])) for m in groups.values())
    if _CHECKED.get(str(folder)) != sig:
        for m in groups.values():
            p = folder / m["file"]
            if not p.is_file():
                return f"its {m['file']} is missing"
            if p.stat().st_size != m["size"] or _sha256(p) != m["sha256"]:
                return f"its {m['file']} does not match its size and sha256 in {SHARDS_FILE}"
        _CHECKED[str(folder)] = sig
    return None


def read_shards(folder) -> Optional[dict]:
    """The ``groups`` of a shards folder's manifest when it verifies (:func:`shards_problem`), else None."""
    if shards_problem(folder) is not None:
        return None
    return json.loads((Path(folder) / SHARDS_FILE).read_text(encoding="utf-8"))["groups"]


def checked_shards() -> dict[str, list]:
    """The shard folders this process verified (:func:`read_shards`), each with its files' stat signatures then,
    as JSON-able lists: what :func:`trust_checked` takes in another process of the same command."""
    return {folder: [list(entry) for entry in sig] for folder, sig in _CHECKED.items()}


def trust_checked(checked: Optional[dict]) -> None:
    """Shard folders that another process of this command verified (:func:`checked_shards`): :func:`read_shards`
    hashes such a folder again only when a file's size or modification time differs from what was verified, the
    trust it gives its own earlier check (a grid's driver verifies the shards while its run opens, so the first
    checkpoint of every trial process does not hash the whole base model again: 0.58 s on the default)."""
    for folder, sig in (checked or {}).items():
        _CHECKED.setdefault(str(folder), tuple(tuple(entry) for entry in sig))


def _same_bits(a, b) -> bool:
    """The same dtype, shape and bytes. The bytes are compared through the widest integer view their length
    allows (the same bits either way; int64 is 4x faster than uint8 on the default model, measured)."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    for wide in (torch.int64, torch.int32, torch.int16):
        if x.numel() % wide.itemsize == 0:
            try:
                return torch.equal(x.view(wide), y.view(wide))
            except RuntimeError:  # a storage offset the wider view cannot take: the bytes as they are
                break
    return torch.equal(x, y)


def split_by_base(tensors: dict, shards: Path, groups: dict) -> tuple[dict, dict]:
    """``(trained, linked)``: the tensors of every group that differs from the base shard (or has no base
    shard) and, per group equal to the base bit for bit, its shard file name."""
    from safetensors import safe_open

    by_group: dict[str, dict] = {}
    for k, t in tensors.items():
        by_group.setdefault(group_of(k), {})[k] = t
    trained, linked = {}, {}
    for g, part in by_group.items():
        meta = groups.get(g)
        same = meta is not None and sorted(part) == meta["tensors"]
        if same:
            with safe_open(str(Path(shards) / meta["file"]), framework="pt") as sf:
                same = all(_same_bits(part[k], sf.get_tensor(k)) for k in part)
        if same:
            linked[g] = meta["file"]
        else:
            trained.update({k: t.contiguous() for k, t in part.items()})
    return trained, linked


def write_referencing_weights(tensors: dict, shards: Path, groups: dict, out: Path, final: Path) -> dict:
    """Write ``tensors`` into folder ``out`` (to be renamed to ``final``) as trained groups + links to the base
    shards + the index. Returns ``{rel: {"size", "sha256", "link"}}`` of the links (their recorded hashes: the
    manifest need not hash them again)."""
    from safetensors.torch import save_file

    trained, linked = split_by_base(tensors, shards, groups)
    weight_map = {}
    if trained:
        save_file(trained, str(Path(out) / TRAINED_FILE), metadata={"format": "pt"})
        weight_map.update({k: TRAINED_FILE for k in trained})
    known = {}
    for g, name in sorted(linked.items()):
        target = os.path.relpath(Path(shards) / name, Path(final))
        os.symlink(target, Path(out) / name)
        meta = groups[g]
        weight_map.update({k: name for k in meta["tensors"]})
        known[name] = {"size": meta["size"], "sha256": meta["sha256"], "link": target}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (Path(out) / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=2, sort_keys=True), encoding="utf-8")
    return known


def layer_l2_by_reference(model_dir, base_dir, num_layers: int) -> Optional[list[float]]:
    """``||W_l - W_l(base)||_F`` over all tensors of every decoder layer ``l < num_layers`` of a published model
    that references the base model's shards (:func:`write_referencing_weights`), read from its files: a tensor in
    a link to a base shard is the base's bit for bit (its change is 0), and only the tensors of
    ``model-trained.safetensors`` are compared, each against the base folder's own tensor (float64 sums).
    None when ``model_dir`` is not such a folder (the caller compares whole models)."""
    import torch
    from safetensors import safe_open

    model_dir, base_dir = Path(model_dir), Path(base_dir)
    index = model_dir / INDEX_FILE
    if not index.is_file() or not (model_dir / TRAINED_FILE).is_file():
        return None
    weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    if any(not (model_dir / f).is_symlink() for f in set(weight_map.values()) - {TRAINED_FILE}):
        return None
    base_file = {}
    for f in weight_files(base_dir):
        with safe_open(str(f), framework="pt") as sf:
            base_file.update({k: f for k in sf.keys()})
    sq = [0.0] * num_layers
    with safe_open(str(model_dir / TRAINED_FILE), framework="pt") as tf:
        for k in tf.keys():
            m = _LAYER.search(k)
            if m is None or int(m.group(1)) >= num_layers:
                continue
            if k not in base_file:
                return None
            with safe_open(str(base_file[k]), framework="pt") as bf:
                d = tf.get_tensor(k).double().view(-1)
                d.sub_(bf.get_tensor(k).view(-1))  # in float64, in place: one float64 copy, not three
            sq[int(m.group(1))] += float(torch.dot(d, d))
            del d
    return [math.sqrt(v) for v in sq]



# ------------------------------------------------------------------------------------ whole files, shared links

def safetensors_problem(path) -> Optional[str]:
    """None when ``path`` is a whole safetensors file - its header parses and the file is as long as the data the
    header lays out - else why, in a few words (a file cut short would reach transformers as a 60-line
    ``SafetensorError``). Reads the header only."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > min(size - 8, 100 << 20):
                return f"{path.name} is not a whole safetensors file ({size:,} bytes: cut short, or not safetensors)"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{path.name} cannot be read as safetensors ({str(e)[:100]})"
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    want = 8 + n + max(ends, default=0)
    if size != want:
        return f"{path.name} has {size:,} bytes, its header lays out {want:,} (cut short or damaged)"
    return None


def weights_problem(folder) -> Optional[str]:
    """None when every safetensors file of a model folder (all ``*.safetensors``, and every file its index names) is
    whole (:func:`safetensors_problem`), else why; a link into the base model's shared shards that leads nowhere is
    said as such (:func:`shared_note`)."""
    folder = Path(folder)
    files = set(folder.glob("*.safetensors"))
    if (folder / INDEX_FILE).is_file():
        try:
            files |= {folder / n for n in json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
                      ["weight_map"].values()}
        except (OSError, ValueError, KeyError, AttributeError):
            return f"{INDEX_FILE} is not a readable weight index"
    for f in sorted(files):
        if not f.exists():
            return shared_note(f, "missing") if f.is_symlink() else f"{f.name} (named by {INDEX_FILE}) is missing"
        why = safetensors_problem(f)
        if why is not None:
            return shared_note(f, "damaged") if f.is_symlink() else why
    return None


def sharers(shards_folder, limit: int = 200) -> list[Path]:
    """The published models under the run root of ``shards_folder`` (``<run_root>/base_shards/<key>``) that link
    into it: a sweep trial's, a scan's, a train run's ``final_model/``."""
    shards_folder = Path(os.path.abspath(shards_folder))
    root, out = shards_folder.parent.parent, []
    for pattern in ("*/final_model", "*/*/*/final_model", "*/*/*/*/final_model"):
        for model in root.glob(pattern):
            links = [p for p in model.glob("*.safetensors") if p.is_symlink()]
            if any(Path(os.path.abspath(p.parent / os.readlink(p))).parent == shards_folder for p in links):
                out.append(model)
                if len(out) >= limit:
                    return out
    return sorted(out)


def shared_note(link, what: str) -> str:
    """The line for a weight file that is a link into the base model's shared shards whose target is ``missing`` or
    ``damaged``: the link, its target, and every model of the run root that shares it."""
    link = Path(link)
    target = Path(os.path.abspath(link.parent / os.readlink(link)))
    users = sharers(target.parent)
    names = ", ".join(str(u.relative_to(target.parent.parent.parent)) for u in users[:3])
    shared = f"shared by {len(users)} model(s) of {target.parent.parent.parent}" + (f": {names}" if names else "") + \
        (" ..." if len(users) > 3 else "")
    if what == "missing":
        return (f"{link.name} is a link to the base model's shard {target}, which is missing ({shared}): "
                f"{target.parent} is not a cache; put it back (`raycpt runs export` copies a model with its shards "
                "into a standalone folder)")
    return (f"{link.name} is a link to the base model's shard {target}, which is damaged ({shared}; written through "
            f"another model's link?): every model that links it is affected; delete {target.parent} and the next "
            "sweep or scan of this run root writes it again from the base model")


def tensor_names(folder) -> list[str]:
    """The tensor names of a model folder's safetensors files, from their headers (no weights read)."""
    names = []
    for f in weight_files(folder):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    return names


def config_weights_problem(folder) -> Optional[str]:
    """None when the decoder layers a folder's ``config.json`` declares (``num_hidden_layers``) are the ones its
    weights hold (``layers.N.`` in the tensor names), else the mismatch in a line: a plan built on the config would
    name layers the weights lack (or leave out layers they have). Call after :func:`weights_problem`."""
    folder = Path(folder)
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        declared = (conf.get("text_config") or {}).get("num_hidden_layers") or conf.get("num_hidden_layers")
        layers = {int(m.group(1)) for k in tensor_names(folder) if (m := _LAYER.search(k))}
    except (OSError, ValueError, AttributeError):
        return None  # transformers' own loading says what is wrong with such a folder
    if not isinstance(declared, int) or not layers or len(layers) == declared and max(layers) == declared - 1:
        return None
    return (f"config.json declares {declared} decoder layers, its weights hold {len(layers)} (layers "
            f"{min(layers)}..{max(layers)}): the config does not belong to these weights")
