"""``raycpt select CONFIG --method bi|snr|layertracer|random --k N``: one layer selector's score per layer ->
``ranking.json`` (read by ``plan.name=elite plan.ranking_file=...``), a PNG of the scores, ``scores.csv``, and
the per-layer scores as an MLflow metric series (``select/<method>``, step = layer).

Every number comes from :mod:`raycpt.diagnostics.selectors`; this module only places the work: ``bi`` and
``snr`` run in the driver (one forward per few corpus blocks / one SVD per matrix: no Ray needed),
``layertracer`` runs the trace (:func:`raycpt.jobs.trace.run_trace`, its actor pool on Ray) nested under this
run, in ``<run>/trace``. Bad input (``--k`` outside 1..N, a bad trace setting) is one line before any work.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from raycpt.config import ExperimentConfig
from raycpt.data.corpus import eos_id_of, iter_documents, pack_token_lists, spread_sample
from raycpt.diagnostics.selectors import SelectorInputs, select_scores, top_k, write_selection
from raycpt.errors import RaycptError
from raycpt.jobs.grid import model_layers
from raycpt.jobs.job import Options, RunSpec, Steps
from raycpt.jobs.trace import prepare_trace, run_trace
from raycpt.models.sources import load_model
from raycpt.models.stack import LayerStack
from raycpt.progress import progress_bar
from raycpt.registry import SELECTORS
from raycpt.report.select import scores_csv, scores_plot

BATCH = 4  # corpus blocks per forward of bi


@dataclass
class SelectResult:
    run_dir: Path
    run_id: Optional[str]
    model_ref: str
    method: str
    k: int
    num_layers: int
    scores: np.ndarray
    top_k: list[int]
    paths: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0
    note: str = ""


@dataclass
class _Prepared:
    cfg: ExperimentConfig
    model_path: str
    num_layers: int
    k: int
    trace: Any = None


def check_k(k: Optional[int], n: int) -> int:
    """``--k``: 1..N (None = half the layers, at least 1)."""
    if k is None:
        return max(1, n // 2)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise RaycptError(f"--k {k!r}: expected an integer from 1 to {n} (this model has {n} layers)")
    return k


def prepare(cfg: ExperimentConfig, options: Options) -> _Prepared:
    """Every user-input check, before any model weights, Ray or MLflow."""
    model_path, n = model_layers(cfg)
    k = check_k(cfg.select.k, n)
    trace = None
    if cfg.select.method == "layertracer":
        trace = prepare_trace(cfg)
    return _Prepared(cfg=cfg, model_path=model_path, num_layers=n, k=k, trace=trace)


def corpus_blocks(cfg: ExperimentConfig, tokenizer) -> np.ndarray:
    """``select.samples`` blocks of ``select.seq_len`` tokens (null: data.seq_len) packed the way training packs
    (documents joined with EOS), from documents spread over the whole corpus (seeded strata)."""
    s = cfg.select
    seq_len = s.seq_len or cfg.data.seq_len
    docs = list(iter_documents(cfg.data.corpus, cfg.data.text_field, cfg.data.max_documents))
    eos = eos_id_of(tokenizer)
    need = s.samples * seq_len
    num = max(1, s.samples * 4)
    while True:  # widen the sample until the documents fill enough blocks (or the corpus is used up)
        pick = spread_sample(len(docs), num, seed=s.seed)
        ids = [tokenizer(docs[i], add_special_tokens=False)["input_ids"] for i in pick]
        if sum(len(x) + 1 for x in ids) >= need or num >= len(docs):
            break
        num *= 4
    blocks = pack_token_lists(ids, seq_len, eos)[:s.samples]
    if len(blocks) == 0:
        raise RaycptError(f"select bi: data.corpus has fewer than {seq_len} tokens; lower select.seq_len")
    return blocks


def selector_inputs(prep: _Prepared, run, progress: bool) -> tuple[SelectorInputs, str]:
    """What the chosen selector needs (its registered ``needs``, :data:`raycpt.registry.SELECTORS`), computed once,
    and a one-line note of what its scores are computed on."""
    cfg, needs = prep.cfg, SELECTORS.info(prep.cfg.select.method, "needs")
    base = dict(num_layers=prep.num_layers, seed=cfg.select.seed, normalize=cfg.select.normalize, batch=BATCH)
    if needs == "trace":
        res = run_trace(prep.trace.cfg, run_dir=run.run_dir / "trace", parent=run, progress=progress)
        return SelectorInputs(tp_norm=res.tp_norm, ls_norm=res.ls_norm, **base), (
            f"LS^ - TP^ of a trace on {res.num_prompts} prompts (recommended split r = {res.recommended_split:g})")
    if needs == "seed":
        return SelectorInputs(**base), f"seeded uniform draw, seed {cfg.select.seed}"
    model, tok = load_model(prep.model_path, dtype="float32", device="cpu")
    layers = LayerStack(model).layers
    if needs == "weights":
        return SelectorInputs(model=model, layers=layers, **base), ("SNR / s_max per matrix" if cfg.select.normalize
                                                                    else "SNR per matrix") + ", mean over the layer"
    blocks = corpus_blocks(cfg, tok)
    return SelectorInputs(model=model, layers=layers, blocks=blocks, **base), (
        f"{len(blocks)} corpus blocks of {blocks.shape[1]} tokens")


def scores_of(prep: _Prepared, run, progress: bool = True) -> tuple[np.ndarray, str]:
    """The selector's ``(N,)`` scores (:func:`raycpt.diagnostics.selectors.select_scores`, the one path) and a
    one-line note of what they were computed on."""
    inputs, note = selector_inputs(prep, run, progress)
    total = len(inputs.blocks) if inputs.blocks is not None else 0
    with progress_bar(f"select {prep.cfg.select.method}", total, progress and total > 0, unit="blocks") as advance:
        return select_scores(prep.cfg.select.method, dataclasses.replace(inputs, advance=advance)), note


def run_spec(prep: _Prepared, options: Options) -> RunSpec:
    cfg = prep.cfg
    return RunSpec(cfg, "select", name=f"select-{cfg.select.method}-{cfg.name}", params={"select.k_used": prep.k})


def execute(prep: _Prepared, run, options: Options) -> SelectResult:
    cfg, s = prep.cfg, prep.cfg.select
    t0 = time.perf_counter()
    scores, note = scores_of(prep, run, options.progress)
    if len(scores) != prep.num_layers:
        raise RuntimeError(f"select {s.method}: {len(scores)} scores for {prep.num_layers} layers")
    wall_s = time.perf_counter() - t0
    best = top_k(scores, prep.k)
    d = run.run_dir
    paths = {"ranking": write_selection(d / "ranking.json", cfg.model.ref, s.method, scores, k=prep.k,
                                        extra={"note": note, "wall_s": wall_s}),
             "scores_csv": scores_csv(d / "scores.csv", scores, best),
             "plot": scores_plot(d / "scores.png", scores, best, f"{SELECTORS.info(s.method, 'metric')} per layer, "
                                 f"{Path(cfg.model.ref).name} (top-{prep.k} marked)")}
    _log(run, s.method, scores, best, paths, wall_s)
    return SelectResult(run_dir=d, run_id=run.run_id, model_ref=cfg.model.ref, method=s.method, k=prep.k,
                        num_layers=prep.num_layers, scores=scores, top_k=best, paths=paths, wall_s=wall_s, note=note)


def _log(run, method: str, scores: np.ndarray, best: list[int], paths: dict, wall_s: float) -> None:
    run.log_points([(f"select/{method}", i, float(v)) for i, v in enumerate(scores) if np.isfinite(v)])
    run.log_params({"select.top_k": ",".join(map(str, best))})
    run.log_metrics({"select_scan_s": wall_s})
    for p in paths.values():
        run.log_artifact(p, "select")


SELECT = Steps(prepare, execute, run_spec)

