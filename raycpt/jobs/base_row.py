"""The sweep's ``base`` row and its general probe: the untrained model, evaluated once with the trials' own
evaluation, against which every row's domain gain and forgetting are read (:mod:`raycpt.report.sweep_base`).

The base row is a trial of the grid (:data:`BASE`: its own child run, progress line and ``result.json``, placed
like every trial, on a GPU on a cluster) whose body evaluates instead of training. Its evaluation is cached
under ``<run_root>/base_eval/<key>/`` by the model (its source's sha256), the evaluation settings, the held-out
and general blocks and :data:`CACHE_VERSION`: a resumed sweep, or a later sweep with the same model and
evaluation, reads it instead of evaluating again (:func:`raycpt.train.final_eval.final_evaluation` is the memo).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.evaluate import mmlu_questions
from raycpt.evaluate.general import general_blocks, general_documents
from raycpt.io import atomic_write_json, run_root
from raycpt.train.final_eval import final_evaluation
from raycpt.train.worker_eval import EVAL_RESULT_FILE, EvalRequest

BASE = "base"
"""The base row's name and strategy (a sweep has no plan of that name: ``full`` and every plan train)."""
BPB_KEYS = ("heldout_bpb", "general_bpb")
"""Beside ``heldout_loss`` / ``general_loss`` (nats per counted target): the same targets in bits per byte of their
text (:mod:`raycpt.evaluate.heldout`)."""
CACHE_VERSION = 2
"""Part of the cache key: raise it when what an evaluation records changes, so no older record is reused (2: the
held-out and general losses score each document on its own, with bits per byte, :mod:`raycpt.evaluate.heldout`)."""


def general_probe(cfg: ExperimentConfig, model_path: str):
    """The general probe's blocks (:mod:`raycpt.evaluate.general`) for ``sweep.general_docs`` documents, in the
    model's tokenizer and ``data.seq_len``; None when ``sweep.general_docs`` is 0."""
    if not cfg.sweep.general_docs:
        return None
    from transformers import AutoTokenizer

    docs = general_documents(mmlu_questions(), cfg.sweep.general_docs)
    return general_blocks(docs, AutoTokenizer.from_pretrained(model_path), cfg.data.seq_len)


def _sha(path: Optional[str]) -> Optional[str]:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def model_identity(model_path: str) -> str:
    """What the base row's cache knows a model by: the sha256 its pull recorded (``raycpt_source.json``), else its
    resolved folder and the sha256 of its ``config.json``."""
    src = Path(model_path) / "raycpt_source.json"
    if src.is_file():
        sha = json.loads(src.read_text(encoding="utf-8")).get("sha256")
        if sha:
            return f"sha256:{sha}"
    return f"{Path(model_path).resolve()}:{_sha(str(Path(model_path) / 'config.json'))}"


def base_cache_dir(cfg: ExperimentConfig, model_path: str, shared: dict) -> Path:
    """``<run_root>/base_eval/<key>``: the key hashes the model (:func:`model_identity`), the evaluation settings
    (``eval``, ``model.dtype``), the held-out and general blocks (their files' sha256) and :data:`CACHE_VERSION`."""
    key = {"model": model_identity(model_path), "eval": dataclasses.asdict(cfg.eval), "dtype": cfg.model.dtype,
           "heldout": _sha(shared.get("heldout_path")), "general": _sha(shared.get("general_path")),
           "version": CACHE_VERSION}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return run_root(cfg.tracking) / "base_eval" / digest


def base_result(trial, spec) -> dict:
    """The base row's trial body: the cached evaluation of the untrained model (evaluated here when the cache has
    none), copied into the trial's ``eval/``, and the result a trial returns (no training: no losses, nothing
    trainable), its metrics on the trial's child run."""
    cfg, shared = trial.cfg, trial.shared
    model_path = shared["model_path"]
    cache = base_cache_dir(cfg, model_path, shared)
    req = EvalRequest(out_dir=str(cache), name=BASE, heldout_path=shared.get("heldout_path"),
                      general_path=shared.get("general_path"))
    if trial.run.created or not trial.run.run_id:
        spec.log_params(trial.run, cfg.train.seed)
    ev, heldout = final_evaluation(model_path, cfg.eval, req, threads=trial.threads)
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
