"""The sweep's ``base`` row and its general probe: the untrained model, evaluated once with the trials' own
evaluation, against which every row's domain gain and forgetting are read (:mod:`raycpt.report.sweep.base`).

The base row is a trial of the grid (:data:`BASE`: its own child run, progress line and ``result.json``, placed
like every trial, on a GPU on a cluster) whose body evaluates instead of training. Its evaluation is cached
under ``<run_root>/base_eval/<key>/``, and a cache entry is a claim about content: the key covers what determines
the numbers (:func:`cache_key`: every file of the model folder by sha256, weights and tokenizer included, hashed once
through a memo of size, times and inode; the evaluation settings and question files; ``model.dtype``; the held-out
and general blocks; the code version of the evaluation), the entry carries the sha256 of each of its files
(``entry.json``, written last) and is verified when read (:func:`entry_problem`). An entry that does not verify,
or has the wrong shape, is moved aside and evaluated again, with one line saying why (:func:`verified_cache`).
A resumed sweep, or a later sweep with the same model and evaluation, reads a verified entry instead of evaluating
again (:func:`raycpt.train.driver.final_eval.final_evaluation` is the memo).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.evaluate import mmlu_questions, question_count
from raycpt.evaluate.general import general_blocks, general_documents
from raycpt.io import atomic_write_json, read_manifest, sha256_file
from raycpt.models.digests import folder_digest
from raycpt.progress import write_phase
from raycpt.report.sweep.outcomes import HELDOUT_DOCS_FILE
from raycpt.train.driver.final_eval import final_evaluation
from raycpt.train.worker.evaluation import EVAL_RESULT_FILE, EvalRequest

BASE = "base"
"""The base row's name and strategy (a sweep has no plan of that name: ``full`` and every plan train)."""
BPB_KEYS = ("heldout_bpb", "general_bpb")
"""Beside ``heldout_loss`` / ``general_loss`` (nats per counted target): the same targets in bits per byte of their
text (:mod:`raycpt.evaluate.heldout`)."""
CACHE_VERSION = 3
"""Part of the cache key: raise it when what an evaluation records changes, so no older record is reused (3: the
held-out and general losses score each document on its own, with bits per byte, :mod:`raycpt.evaluate.heldout`)."""
ENTRY_FILE = "entry.json"
"""In a cache entry, written last: the key's digest and every other file's sha256 (:func:`seal_entry`)."""
ENTRY_FORMAT = "raycpt.base-eval-entry/1"
DIGEST_MEMO = "digests.json"
"""In ``<run_root>/base_eval``: the model files' digests by size, times and inode (:mod:`raycpt.models.digests`)."""


def general_probe(cfg: ExperimentConfig, model_path: str):
    """The general probe's blocks (:mod:`raycpt.evaluate.general`) for ``sweep.general_docs`` documents, in the
    model's tokenizer and ``data.seq_len``; None when ``sweep.general_docs`` is 0."""
    if not cfg.sweep.general_docs:
        return None
    from transformers import AutoTokenizer

    docs = general_documents(mmlu_questions(), cfg.sweep.general_docs)
    return general_blocks(docs, AutoTokenizer.from_pretrained(model_path), cfg.data.seq_len)


def _sha(path: Optional[str]) -> Optional[str]:
    return sha256_file(Path(path)) if path else None


EVAL_CODE = ("raycpt/evaluate", "raycpt/tasks", "raycpt/assets/wordnet_mc.jsonl", "raycpt/train/worker/evaluation.py",
             "raycpt/train/worker/loss.py", "raycpt/train/driver/final_eval.py", "raycpt/models/sources.py",
             "raycpt/jobs/base_row.py")
"""The code and data an evaluation's numbers come from, relative to the package's parent folder."""


@functools.lru_cache(maxsize=1)
def eval_code_version() -> str:
    """The code version of the evaluation: the sha256 of :data:`EVAL_CODE`'s files (an edit of the bridge, a task or
    the loss changes it) and the versions of torch, transformers and lm-eval that compute the numbers."""
    top = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(str(CACHE_VERSION).encode())
    for rel in EVAL_CODE:
        p = top / rel
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f"{f.relative_to(top).as_posix()}\0".encode() + f.read_bytes())
    for dist in ("torch", "transformers", "lm_eval"):
        try:
            h.update(f"{dist}={version(dist)}".encode())
        except PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()


def model_identity(model_path: str, memo: Optional[Path] = None) -> dict:
    """What the base row's cache knows a model by: the sha256 of every file of its folder (weights, config,
    tokenizer: :func:`raycpt.models.digests.folder_digest`, hashed once per file through ``memo``). Not its path or a
    recorded digest: a folder rewritten in place is another model."""
    return folder_digest(model_path, memo)


def _task_files(cfg: ExperimentConfig) -> dict:
    """The digest of each ``eval.tasks`` entry that is a file (a question file): its content, not its path."""
    return {t: sha256_file(Path(t)) for t in cfg.eval.tasks if Path(t).expanduser().is_file()}


def cache_key(cfg: ExperimentConfig, model_path: str, shared: dict, memo: Optional[Path] = None) -> dict:
    """What determines the base row's numbers: the model's files by content (:func:`model_identity`), the
    evaluation settings (``eval``, its question files by content), ``model.dtype``, the held-out and general blocks
    (their files' sha256) and the code version of the evaluation (:func:`eval_code_version`)."""
    return {"model": model_identity(model_path, memo), "eval": dataclasses.asdict(cfg.eval),
            "task_files": _task_files(cfg), "dtype": cfg.model.dtype, "heldout": _sha(shared.get("heldout_path")),
            "general": _sha(shared.get("general_path")), "code": eval_code_version()}


def _key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def base_cache_dir(root: Path, cfg: ExperimentConfig, model_path: str, shared: dict) -> Path:
    """``<run_root>/base_eval/<key>`` (``root``: the run root's ``base_eval``, holding the entries and the digest memo
    of the model files, :data:`DIGEST_MEMO`; :attr:`raycpt.runs.location.RunLocation.base_eval`): the first 16 hex
    digits of the sha256 of :func:`cache_key`."""
    return root / _key_digest(cache_key(cfg, model_path, shared, root / DIGEST_MEMO))[:16]


def _cache_files(cache: Path) -> dict:
    return {p.relative_to(cache).as_posix(): sha256_file(p) for p in sorted(cache.rglob("*"))
            if p.is_file() and p.name != ENTRY_FILE and not p.name.startswith(".")}


def seal_entry(cache: Path, key: dict) -> None:
    """Write ``entry.json`` (last): the entry's key in full and the sha256 of every file of the entry."""
    atomic_write_json(cache / ENTRY_FILE, {"format": ENTRY_FORMAT, "key": _key_digest(key),
                                           "files": _cache_files(cache)})


def record_problem(doc) -> Optional[str]:
    """None when ``doc`` has the shape of an ``eval_result.json`` (scores ``{task: {mode: {key: number}}}``, held-out
    and general losses numbers or null); else what is wrong, in a few words."""
    if not isinstance(doc, dict):
        return f"{EVAL_RESULT_FILE} holds a {type(doc).__name__}, not an object"
    scores = doc.get("scores")
    if not isinstance(scores, dict) or not all(
            isinstance(modes, dict) and all(isinstance(sc, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in sc.values())
                for sc in modes.values()) for modes in scores.values()):
        return "its scores are not {task: {mode: {key: number}}}"
    for k in ("heldout_loss", "general_loss"):
        v = doc.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return f"its {k} is {v!r}, not a finite number"
    return None


def entry_problem(cache: Path, key: dict) -> Optional[str]:
    """None when the cache entry ``cache`` verifies: its ``entry.json`` names this key and every file of the entry
    with its sha256, and its ``eval_result.json`` has the shape of one (:func:`record_problem`); else why not."""
    seal, why = read_manifest(cache / ENTRY_FILE, ENTRY_FORMAT, " (cut short, or written by an older raycpt)")
    if why is not None:
        return why
    if not isinstance(seal.get("files"), dict):
        return f"its {ENTRY_FILE} is not a {ENTRY_FORMAT} record"
    if seal.get("key") != _key_digest(key):
        return "it was written for another model, evaluation or code version"
    if EVAL_RESULT_FILE not in seal["files"]:
        return f"its {ENTRY_FILE} lists no {EVAL_RESULT_FILE}"
    found = _cache_files(cache)
    for rel, digest in seal["files"].items():
        if rel not in found:
            return f"{rel} is missing"
        if found[rel] != digest:
            return f"{rel} does not match its sha256 in {ENTRY_FILE} (changed after it was written)"
    try:
        doc = json.loads((cache / EVAL_RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"{EVAL_RESULT_FILE} cannot be read ({type(e).__name__})"
    return record_problem(doc)


def verified_cache(root: Path, cfg: ExperimentConfig, model_path: str, shared: dict, say=print) -> Path:
    """The base row's cache folder for this model and evaluation under ``root`` (the run root's ``base_eval``), ready
    to be read or filled: an entry that does not verify (:func:`entry_problem`) is moved aside
    (``<key>.refused-<n>``, kept for a look) with one line saying why, so the evaluation runs again into an empty
    folder."""
    key = cache_key(cfg, model_path, shared, root / DIGEST_MEMO)
    cache = root / _key_digest(key)[:16]
    if not cache.exists():
        return cache
    why = entry_problem(cache, key)
    if why is None:
        return cache
    n = 1
    while cache.with_name(f"{cache.name}.refused-{n}").exists():
        n += 1
    aside = cache.with_name(f"{cache.name}.refused-{n}")
    os.replace(cache, aside)
    say(f"warning: base row: cache entry {cache} refused ({why}); evaluating the base model again "
        f"(the refused entry is kept as {aside.name})")
    return cache


def writable_cache(cache: Path, fallback: Path, say=print) -> Path:
    """``cache`` when its folder can be made and written, else ``fallback`` (the trial's own folder) with one line
    saying why: a base-row cache that cannot be written costs the cache, never the sweep (issue 51)."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = cache / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        return cache
    except OSError as e:
        say(f"warning: base row: the cache folder {cache.parent} cannot be written ({e.strerror or e}); evaluating "
            f"the base model without the cache, into {fallback}")
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def base_result(trial, spec) -> dict:
    """The base row's trial body: the cached evaluation of the untrained model (evaluated here when the cache has
    none that verifies), copied into the trial's ``eval/``, and the result a trial returns (no training: no losses,
    nothing trainable), its metrics on the trial's child run."""
    cfg, shared, root = trial.cfg, trial.shared, trial.run.location.base_eval  # the command's run root
    model_path = shared["model_path"]
    write_phase(trial.dir, "starting", label=BASE_LABEL, doing="checking the cached evaluation of the untrained model")
    cache = verified_cache(root, cfg, model_path, shared, say=_warn)
    fresh = not (cache / ENTRY_FILE).is_file()
    write_phase(trial.dir, "evaluating", label=BASE_LABEL,
                doing=evaluation_words(cfg, shared) + ("" if fresh else "; reading the verified cache"))
    if fresh:
        shutil.rmtree(cache, ignore_errors=True)  # a folder cut short before its seal: none of it is trusted
        cache = writable_cache(cache, trial.dir / "base_eval_uncached", say=_warn)
    req = EvalRequest(out_dir=str(cache), name=BASE, heldout_path=shared.get("heldout_path"),
                      general_path=shared.get("general_path"))
    if trial.run.created or not trial.run.run_id:
        spec.log_params(trial.run, cfg.train.seed)
    ev, heldout = final_evaluation(model_path, cfg.eval, req, threads=trial.threads, trusted=not fresh)
    if fresh:
        seal_entry(cache, cache_key(cfg, model_path, shared, root / DIGEST_MEMO))
    (trial.dir / "eval").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cache / EVAL_RESULT_FILE, trial.dir / "eval" / EVAL_RESULT_FILE)
    record = json.loads((cache / EVAL_RESULT_FILE).read_text(encoding="utf-8"))
    general = record.get("general_loss")
    result = {"name": spec.name, "strategy": BASE, "split": None, "b": None, "seed": cfg.train.seed,
              "group": spec.name, "eval_file": str(trial.dir / "eval" / EVAL_RESULT_FILE), "trainable_params": 0,
              "frozen_params": None, "tokens_per_s": 0.0, "wall_s": trial.elapsed, "losses": [], "final_loss": None,
              "final_model_dir": str(model_path), "scores": ev.metrics(), "mlflow_run_id": trial.run.run_id,
              "heldout_loss": heldout, "general_loss": general, "peak_memory_mb": None, "trainable_per_step": None,
              "pid": None, "base_cache": str(cache), **{k: record.get(k) for k in BPB_KEYS}}
    trial.run.log_metrics({**ev.metrics(), "wall_time_s": trial.elapsed,
                           **{k: result[k] for k in ("heldout_loss", "general_loss", *BPB_KEYS)
                              if result[k] is not None}})
    return result


BASE_LABEL = "base row"
"""How the progress line names the base row."""


def evaluation_words(cfg: ExperimentConfig, shared: dict) -> str:
    """What a trial's evaluation covers, for its progress line: ``48 questions, 30 held-out documents, 25 general
    documents`` (a benchmark whose questions are not counted here is named; blocks where the documents are not
    recorded)."""
    counts = {t: question_count(cfg.eval, t) for t in cfg.eval.tasks}
    known = sum(n for n in counts.values() if n is not None)
    unknown = [t for t, n in counts.items() if n is None]
    words = [f"{known} questions" if not unknown else
             (f"{known} questions and " if known else "") + "the questions of " + ", ".join(unknown)]
    words += [d for d in (_documents(shared.get("heldout_path"), HELDOUT_DOCS_FILE, "held-out"),
                          _documents(shared.get("general_path"), GENERAL_DOCS_FILE, "general")) if d]
    return ", ".join(words)


def _documents(blocks_path: Optional[str], docs_name: str, what: str) -> Optional[str]:
    """``30 held-out documents`` from the documents file beside the blocks (``12 held-out blocks`` without one)."""
    if not blocks_path:
        return None
    try:
        docs = json.loads((Path(blocks_path).parent / docs_name).read_text(encoding="utf-8"))
        return f"{len({json.dumps(d, sort_keys=True) for d in docs})} {what} documents"
    except (OSError, ValueError, TypeError):
        pass
    try:
        return f"{len(json.loads(Path(blocks_path).read_text(encoding='utf-8')))} {what} blocks"
    except (OSError, ValueError, TypeError):
        return None


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


GENERAL_DOCS_FILE = "general_docs.json"
"""Next to the sweep's ``general_blocks.json``: the document of each general block (the interval's clusters)."""


def probe_files(run_dir: Path, blocks) -> dict:
    """The general probe's blocks written into the sweep's folder (``general_blocks.json``, and the document of each
    block): ``{"general_path": file}`` for the trials' shared settings; {} without a probe."""
    if not blocks:
        return {}
    if getattr(blocks, "documents", None):
        atomic_write_json(Path(run_dir) / GENERAL_DOCS_FILE, list(blocks.documents))
    return {"general_path": str(atomic_write_json(Path(run_dir) / "general_blocks.json", list(blocks)))}


def eval_value(eval_dir: Path, key: str):
    """One value of a trial's ``eval_result.json`` (None when the file or the key is absent)."""
    f = Path(eval_dir) / EVAL_RESULT_FILE
    return json.loads(f.read_text(encoding="utf-8")).get(key) if f.is_file() else None
