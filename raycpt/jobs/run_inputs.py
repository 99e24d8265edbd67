"""What a sweep's (or a decision's) MLflow run says it read and made (issue 48), from what the run folder holds: the
training corpus (its packed store: key, content identity, blocks, tokens), the held-out, validation and general
slices (their blocks files, by content), each benchmark that ran (its questions, by content), and the row the
verdict recommends (or leads with) as a model linked to its trial's final model folder.

Pure but for reading those files: records out (:mod:`raycpt.runs.inputs`), which the run's
:meth:`raycpt.runs.run.Run.log_inputs` writes and projects (``raycpt runs sync`` replays them)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable, Optional

from raycpt.config import ExperimentConfig
from raycpt.data.store import read_store, store_key, store_root, tokenizer_hash
from raycpt.errors import RaycptError, read_user_json
from raycpt.evaluate import task_limit
from raycpt.runs.inputs import blocks_profile, dataset_record, model_record, short_digest
from raycpt.splits import split_index

CORPUS, HELDOUT, VALIDATION, GENERAL = "training_corpus", "heldout_slice", "validation_slice", "general_probe"
SLICES = (("heldout_path", HELDOUT, "evaluation"), ("validation_path", VALIDATION, "validation"),
          ("general_path", GENERAL, "evaluation"))
"""The sweep's shared settings naming a blocks file -> the dataset it is and its context."""


def corpus_dataset(root: Path, cfg: ExperimentConfig, model_path: str) -> Optional[dict]:
    """The training corpus as its packed store (``data.corpus`` in the model's tokenizer, under the run root
    ``root`` unless ``data.store_dir`` names the folder): digest its content
    identity (:attr:`raycpt.data.store.StoreInfo.identity`: the store key and every source file's hash), rows its
    blocks; None when no store is there to read (packed on a cluster's own storage)."""
    try:
        key = store_key(cfg.data, tokenizer_hash(model_path))
        store = read_store(store_root(cfg.data, root) / key)
    except (RaycptError, OSError):
        return None
    if store is None:
        return None
    m = store.manifest
    return dataset_record(CORPUS, store.identity, str(store.path), "training",
                          {"rows": store.num_blocks, "tokens": store.num_tokens, "seq_len": m.get("seq_len"),
                           "documents": m.get("num_documents"), "store_key": store.key,
                           "sources": ", ".join(map(str, m.get("sources") or []))})


def slice_datasets(shared: dict) -> list[dict]:
    """The held-out, validation and general slices the trials read (their blocks files in the run folder), each
    digested by its file's bytes."""
    out = []
    for key, name, context in SLICES:
        path = shared.get(key)
        data = Path(path).read_bytes() if path and Path(path).is_file() else b"null"
        profile = blocks_profile(data)
        if profile is not None:
            out.append(dataset_record(name, short_digest(data), path, context, profile))
    return out


def question_digest(questions: list[dict]) -> str:
    """A benchmark's questions by content: the digest of their sorted ``[id, question]`` pairs."""
    pairs = sorted([str(q.get("id")), str(q.get("question", ""))] for q in questions)
    return short_digest(json.dumps(pairs, ensure_ascii=False).encode("utf-8"))


def benchmark_datasets(eval_cfg, trials: list[dict]) -> list[dict]:
    """Each benchmark that ran, from the first trial (by name) whose evaluation recorded questions: its name, its
    question count and ``eval.limit``, a digest of its questions (:func:`question_digest`)."""
    for t in sorted(trials, key=lambda t: str(t.get("name"))):
        f = t.get("eval_file")
        if not f or not Path(f).is_file():
            continue
        questions = read_user_json(f, "trial evaluation file").get("questions") or {}
        if questions:
            return [dataset_record(task, question_digest(rows), f, "evaluation",
                                   {"questions": len(rows), "limit": task_limit(eval_cfg, task) or "all"})
                    for task, rows in sorted(questions.items()) if rows]
    return []


def run_datasets(root: Path, cfg: ExperimentConfig, model_path: str, shared: dict, trials: list[dict]) -> list[dict]:
    """Every dataset input of the run: the corpus (its store under the run root ``root``), the slices, the
    benchmarks."""
    corpus = corpus_dataset(root, cfg, model_path)
    return ([corpus] if corpus else []) + slice_datasets(shared) + benchmark_datasets(cfg.eval, trials)


def trained_layers(strategy: str, split: Optional[float], num_layers: Optional[int]) -> Optional[str]:
    """The decoder layers a row trains, ``0-9`` (train_shallow: [0, b), train_deep: [b, N), full: all); None for a
    plan that is not one of them."""
    if strategy == "full" and num_layers:
        return f"0-{num_layers - 1}"
    if strategy in ("train_shallow", "train_deep") and split is not None and num_layers:
        b = split_index(split, num_layers)
        return f"0-{b - 1}" if strategy == "train_shallow" else f"{b}-{num_layers - 1}"
    return None


def model_name(row: str) -> str:
    """A row's name as MLflow takes a model's (no ``.``, ``/``, ``:`` ...): ``train_shallow-r0_33``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", row).strip("_") or "row"


def _finite(x) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def row_model(rec: Optional[dict], trials: list[dict], num_layers: Optional[int], lr_of: Callable[[dict], object],
              datasets: list[dict] = ()) -> Optional[dict]:
    """The recommended (or leading) row of :func:`raycpt.report.sweep.views.advice.recommendation` as a model record:
    the row's run with the lowest validation loss (the held-out loss is a test: it never chooses; without validation
    losses the lowest seed), linked to that trial's final model folder, with
    its plan, split, layers trained, lr (``lr_of(trial)`` when the trial did not record one), seed and held-out loss
    (linked to the held-out slice when it is among ``datasets``). None without a row or a trained trial of it."""
    if rec is None:
        return None
    runs = [t for t in trials if (t.get("group") or t.get("name")) == rec["row"] and t.get("final_model_dir")]
    if not runs:
        return None
    if all(_finite(r.get("validation_loss")) is not None for r in runs):
        t = min(runs, key=lambda r: (_finite(r.get("validation_loss")), r.get("seed") or 0))
    else:
        t = min(runs, key=lambda r: r.get("seed") or 0)
    heldout = next(((d["dataset"]["name"], d["dataset"]["digest"]) for d in datasets
                    if d["dataset"]["name"] == HELDOUT), None)
    lr = t.get("lr") if t.get("lr") is not None else lr_of(t)
    params = {"plan": t.get("strategy"), "split": t.get("split"),
              "layers_trained": trained_layers(t.get("strategy"), t.get("split"), num_layers) or rec["words"],
              "lr": lr, "seed": t.get("seed"), "trial": t.get("name")}
    metrics = {k: _finite(t.get(k)) for k in ("heldout_loss", "general_loss") if _finite(t.get(k)) is not None}
    tags = {"raycpt.row": rec["row"], "raycpt.claim": rec["claim"], "mlflow.note.content": rec["words"]}
    return model_record(model_name(rec["row"]), t["final_model_dir"], params, metrics, tags,
                        heldout if "heldout_loss" in metrics else None)
