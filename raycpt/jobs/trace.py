"""``raycpt trace`` on Ray: prompts as a Ray Data dataset, an actor pool computes per-prompt rows,
the driver aggregates, writes the artifacts and records one MLflow run.

Placement only: every number comes from :func:`raycpt.diagnostics.tracer.trace_batch` (per batch)
and :mod:`raycpt.diagnostics.scores` (profiles, S(b), recommended split).

Order of work in :func:`run_trace`:

1. check everything a user can get wrong (k < 0, splits outside (0, 1), splits that leave a side
   empty for this model's depth, the prompt file) - *before* Ray or MLflow start;
2. tokenise on the driver (offsets -> context / query positions), sort by length so batches pad
   little, and ship token ids (not text) to the actors;
3. ``map_batches`` with a class UDF on an actor pool: each actor loads the model once
   (``trace.num_actors`` actors, ``trace.gpus_per_actor`` / ``trace.cpus_per_actor`` each,
   ``trace.batch_size`` prompts per call); rows stream back to the driver behind a progress bar.
   With one actor and no cluster named (:func:`in_process`) that one actor is this process: the same
   class, the same batches of prompts, no Ray start and no actor start;
4. profiles, S(b) table, recommended split; Parquet + PNG + CSV/MD artifacts; MLflow params,
   per-layer metric series and artifacts.

The same code runs on a laptop (local Ray) and on a cluster (``RAY_ADDRESS`` / ``ray job submit``:
set ``trace.gpus_per_actor=1`` and ``trace.num_actors`` to the GPU count).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from raycpt.config import ExperimentConfig, trace_dtype
from raycpt.diagnostics.prompts import (EncodedPrompt, check_prompt_set, collate, encode_prompts, load_prompt_records,
                                        pad_id_of, seam_note)
from raycpt.diagnostics.tracer import trace_batch
from raycpt.errors import RaycptError
from raycpt.jobs.grid import model_layers
from raycpt.jobs.job import Options, RunSpec, Steps, run_job
from raycpt.models.sources import load_model
from raycpt.models.stack import LayerStack
from raycpt.progress import progress_bar
from raycpt.report.trace import aggregate, write_artifacts
from raycpt.runtime import cluster_address, ray_session
from raycpt.splits import check_ratio, check_split


# ------------------------------------------------------------------------------------------ result
@dataclass
class TraceResult:
    """What one trace produced (numbers are also in ``summary.json`` in the run folder)."""

    run_dir: Path
    run_id: Optional[str]
    model_ref: str
    num_layers: int
    num_prompts: int
    top_k: int
    tau: float
    tp: np.ndarray
    """Mean Ratio per decoder layer (the Task Particle profile), shape (N,)."""
    ls: np.ndarray
    """Mean dJS per decoder layer (the Layer-wise Sensitivity profile), shape (N,)."""
    tp_norm: np.ndarray
    ls_norm: np.ndarray
    groups: dict[str, dict]
    """Per group: {"tp": (N,), "ls": (N,), "n": prompts}."""
    split_table: list[dict]
    """Table-9 rows for the requested splits: ratio, split_layer, S, the four means that make it up,
    S_mean (004's score on raw per-layer means) and S_median (on per-layer medians); S follows trace.sb_aggregate."""
    recommended: dict
    """{"ratio", "split_layer", "S"} of the best grid ratio."""
    grid_scores: list[tuple]
    """(ratio, b, S) for every feasible grid ratio."""
    tp_layers: list[int]
    """Layers whose mean Ratio exceeds tau (the overall Task Particle interval)."""
    answer_hit_rate: Optional[float]
    """Share of prompts with an expected answer whose top-1 token is the answer's first token."""
    paths: dict[str, Path] = field(default_factory=dict)
    wall_s: float = 0.0
    median: dict = field(default_factory=dict)
    """Median profiles {"tp", "ls", "tp_norm", "ls_norm", "recommended"} (robustness check)."""
    seam_note: Optional[str] = None
    """How many prompts had s1's trailing whitespace counted with s2 (``prompts.seam_note``), or None."""

    @property
    def recommended_split(self) -> float:
        return float(self.recommended["ratio"])

    @property
    def table(self) -> list[dict]:
        return self.split_table

    @property
    def artifacts(self) -> list[Path]:
        return list(self.paths.values())


# ------------------------------------------------------------------------------------------ actor
class TraceActor:
    """Ray Data class UDF: loads the model once, then turns batches of token ids into metric rows."""

    def __init__(self, model_path: str, dtype: str = "auto", top_k: int = 10, eps: float = 1e-6,
                 use_gpu: bool = False, num_threads: int = 0, schedule: str = "shared_context",
                 pad_id: int = 0):
        import torch

        if num_threads > 0:
            torch.set_num_threads(num_threads)
        device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
        model, _tok = load_model(model_path, dtype=dtype, device=device)
        self.stack = LayerStack(model)
        self.top_k, self.eps, self.schedule, self.pad_id = top_k, eps, schedule, pad_id

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prompts = [EncodedPrompt(index=int(i), group="", input_ids=np.asarray(ids).tolist(),
                                 context=np.asarray(ctx).tolist(), query=[], last=int(last))
                   for i, ids, ctx, last in zip(batch["index"], batch["input_ids"], batch["context"], batch["last"])]
        t0 = time.perf_counter()
        out = trace_batch(self.stack, collate(prompts, self.pad_id), top_k=self.top_k, eps=self.eps,
                          schedule=self.schedule)
        forward_s = np.full(len(prompts), (time.perf_counter() - t0) / max(1, len(prompts)))
        return {"index": np.asarray(batch["index"], dtype=np.int64), **out, "forward_s": forward_s}


# ------------------------------------------------------------------------------------------ driver
@dataclass
class _Prepared:
    cfg: ExperimentConfig
    model_path: str
    num_layers: int
    tokenizer: Any
    records: list
    encoded: list
    splits: list[float]


def prepare_trace(cfg: ExperimentConfig, splits: Optional[list[float]] = None, prompts: Optional[str] = None,
                  top_k: Optional[int] = None) -> _Prepared:
    """Every user-input check of a trace, with no Ray and no MLflow: returns the effective config,
    the resolved model path and depth, and the encoded prompts. Raises RaycptError (one line)."""
    t = cfg.trace
    splits = list(t.splits if splits is None else splits)
    top_k = t.top_k if top_k is None else top_k
    prompts = t.prompts if prompts is None else prompts
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise RaycptError(f"top-k {top_k!r}: expected an integer >= 0 (0 = full vocabulary)")
    if not splits:
        raise RaycptError("splits: no split ratios given (expected e.g. 0.33,0.5,0.66)")
    for r in splits:
        check_ratio(r)
    records = load_prompt_records(prompts)  # the user's file first (one line), before the model is resolved
    model_path, n = model_layers(cfg)
    for r in splits:
        check_split(float(r), n)
    if t.max_prompts:
        records = records[:t.max_prompts]
    check_prompt_set(records, warn=lambda line: print(line, file=sys.stderr, flush=True))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    encoded = encode_prompts(records, tok)
    eff = dataclasses.replace(cfg, trace=dataclasses.replace(t, splits=[float(r) for r in splits], top_k=int(top_k),
                                                             prompts=prompts))
    return _Prepared(cfg=eff, model_path=model_path, num_layers=n, tokenizer=tok, records=records,
                     encoded=encoded, splits=[float(r) for r in splits])


def _dataset_items(encoded) -> list[dict]:
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i].input_ids), i))
    return [dict(index=encoded[i].index, input_ids=np.asarray(encoded[i].input_ids, dtype=np.int64),
                 context=np.asarray(encoded[i].context, dtype=np.int64), last=encoded[i].last) for i in order]


def in_process(cfg: ExperimentConfig) -> bool:
    """Whether the trace runs in this process: one actor (``trace.num_actors=1``) and no cluster named (a local
    Ray or none). A pool of one actor on this machine computes the same rows, after a Ray start, an actor start
    and a model load in that actor; on a cluster the pool places the actors (and their GPUs)."""
    return int(cfg.trace.num_actors) == 1 and cluster_address(cfg.ray) is None


def _actor_kwargs(prep: _Prepared) -> dict:
    t = prep.cfg.trace
    return dict(model_path=prep.model_path, dtype=trace_dtype(prep.cfg), top_k=t.top_k, eps=t.eps,
                use_gpu=t.gpus_per_actor > 0, num_threads=max(1, int(round(t.cpus_per_actor))),
                pad_id=pad_id_of(prep.tokenizer), schedule=t.schedule)


def _in_prompt_order(parts: list[dict[str, np.ndarray]], n: int) -> dict[str, np.ndarray]:
    """The rows of every batch (any order) as per-prompt arrays in prompt order; all ``n`` prompts or an error."""
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(rows["index"], kind="stable")
    rows = {k: (np.stack(list(v[order])) if v.dtype == object else v[order]) for k, v in rows.items()}
    if len(rows["index"]) != n or not np.array_equal(rows["index"], np.arange(n)):
        raise RuntimeError(f"trace returned {len(rows['index'])} rows for {n} prompts")
    return rows


def _rows_in_process(prep: _Prepared, progress: bool) -> dict[str, np.ndarray]:
    """The trace's one actor in this process (:func:`in_process`): the same :class:`TraceActor`, called on
    ``trace.batch_size`` prompts at a time in length order; torch's thread count is restored afterwards."""
    import torch

    items = _dataset_items(prep.encoded)
    size = max(1, int(prep.cfg.trace.batch_size))
    threads = torch.get_num_threads()
    parts: list[dict[str, np.ndarray]] = []
    try:
        actor = TraceActor(**_actor_kwargs(prep))
        with progress_bar("trace", len(items), progress, unit="prompts") as advance:
            for s in range(0, len(items), size):
                chunk = items[s:s + size]
                batch = {k: [it[k] for it in chunk] for k in ("index", "input_ids", "context", "last")}
                parts.append(actor(batch))
                advance(len(chunk))
    finally:
        actor = None  # the model goes before the trials start
        gc.collect()
        torch.set_num_threads(threads)
    return _in_prompt_order(parts, len(items))


def _compute_rows(prep: _Prepared, progress: bool) -> dict[str, np.ndarray]:
    """Run the actor pool over the prompts; return per-prompt arrays in prompt order."""
    import ray

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the progress bar below says what runs
    t = prep.cfg.trace
    items = _dataset_items(prep.encoded)
    n_blocks = max(1, min(len(items), -(-len(items) // t.batch_size)))
    ds = ray.data.from_items(items, override_num_blocks=n_blocks)
    ds = ds.map_batches(
        TraceActor,
        fn_constructor_kwargs=_actor_kwargs(prep),
        compute=ray.data.ActorPoolStrategy(size=t.num_actors),
        batch_size=t.batch_size,
        batch_format="numpy",
        num_cpus=t.cpus_per_actor,
        num_gpus=t.gpus_per_actor,
    )
    parts: list[dict[str, np.ndarray]] = []
    with progress_bar("trace", len(items), progress, unit="prompts") as advance:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            parts.append({k: np.asarray(v) for k, v in batch.items()})
            advance(len(batch["index"]))
    return _in_prompt_order(parts, len(items))


def trace_params(summary: dict) -> dict:
    """The trace run's own parameters, from its ``summary.json`` (``raycpt runs sync`` logs the same)."""
    return {"trace.model_path": summary["model_path"], "trace.num_layers": summary["num_layers"],
            "trace.num_prompts": summary["num_prompts"], "trace.seam_space_prompts": summary.get("seam_space_prompts")}


def trace_records(summary: dict) -> tuple[list[tuple[str, int, float]], dict[str, float]]:
    """What the trace run records, from its summary (``summary.json``): ``(series, metrics)``, the series
    ``(key, layer, value)`` of the finite profile values (TP / LS, normalised, medians, per prompt group), the
    metrics S(b) per split with its interval and aggregates, the recommended split, speed and hit rate."""
    series = []
    for name, values in (("tp", summary["tp"]), ("ls", summary["ls"]), ("tp_norm", summary["tp_norm"]),
                         ("ls_norm", summary["ls_norm"]), ("tp_median", summary["median"]["tp"]),
                         ("ls_median", summary["median"]["ls"])):
        series += _finite_series(name, values)
    for g, gp in summary["groups"].items():
        key = "".join(c if c.isalnum() or c in "_-." else "_" for c in g)
        series += _finite_series(f"tp/{key}", gp["tp"]) + _finite_series(f"ls/{key}", gp["ls"])
    table, rec, wall_s = summary["split_table"], summary["recommended"], float(summary["wall_s"])
    metrics = {f"S_b/{row['ratio']:g}": row["S"] for row in table}
    metrics.update({f"S_b_median/{row['ratio']:g}": row["S_median"] for row in table})
    metrics.update({f"S_b_mean/{row['ratio']:g}": row["S_mean"] for row in table})
    for row in table:  # the over-prompts interval of S(b)
        metrics.update({f"S_b_lo/{row['ratio']:g}": row["S_lo"], f"S_b_hi/{row['ratio']:g}": row["S_hi"]})
    metrics["recommended_split_median"] = summary["median"]["recommended"]["ratio"]
    metrics.update({f"S_b_grid/{r:g}": s for r, _b, s in summary["grid_scores"]})
    metrics.update(recommended_split=rec["ratio"], recommended_split_layer=rec["split_layer"], recommended_S=rec["S"],
                   wall_s=wall_s, prompts_per_s=summary["num_prompts"] / max(wall_s, 1e-9))
    if summary.get("answer_hit_rate") is not None:
        metrics["answer_hit_rate"] = summary["answer_hit_rate"]
    return series, metrics


def _finite_series(name: str, values) -> list[tuple[str, int, float]]:
    return [(name, i, float(v)) for i, v in enumerate(values) if v is not None and np.isfinite(float(v))]


def log_trace(run, summary: dict, paths: dict[str, Path]) -> None:
    """:func:`trace_params` and :func:`trace_records` into the trace's :class:`raycpt.runs.run.Run`, its files under
    ``trace/``."""
    series, metrics = trace_records(summary)
    run.log_params(trace_params(summary))
    run.log_points(series)
    run.log_metrics(metrics)
    for p in paths.values():
        run.log_artifact(p, "trace")


def run_trace(cfg: ExperimentConfig, run_dir: Optional[Path] = None, splits: Optional[list[float]] = None,
              prompts: Optional[str] = None, top_k: Optional[int] = None, parent=None,
              progress: bool = True) -> TraceResult:
    """Trace ``cfg.model`` over a prompt set and recommend a train-shallow / freeze-deep split.

    ``splits``, ``prompts`` and ``top_k`` override ``cfg.trace``; ``run_dir`` defaults to a new
    ``<run_root>/trace-<name>-<id>/``; with ``parent`` (a :class:`raycpt.runs.run.Run`) the MLflow run is nested
    under its run.
    Bad input raises :class:`RaycptError` before Ray or MLflow is touched (:func:`prepare_trace`);
    the work is :func:`execute`, inside the command's :func:`raycpt.runs.run.command_run`.
    """
    return run_job(TRACE, cfg, Options(run_dir=run_dir, parent=parent, progress=progress,
                                       location=parent.location if parent is not None else None,
                                       values={"splits": splits, "prompts": prompts, "top_k": top_k}))


def prepare(cfg: ExperimentConfig, options: Options) -> _Prepared:
    """:func:`prepare_trace` with the options' ``splits`` / ``prompts`` / ``top_k`` (library callers; the CLI's
    options set ``trace.*``)."""
    return prepare_trace(cfg, splits=options.get("splits"), prompts=options.get("prompts"),
                         top_k=options.get("top_k"))


def run_spec(prep: _Prepared, options: Options) -> RunSpec:
    """The trace's run, of the effective config (``options.run_dir`` / ``parent``: nested in a sweep, a build)."""
    return RunSpec(prep.cfg, "trace", name=f"trace-{prep.cfg.name}")


def execute(prep: _Prepared, run, options: Options) -> TraceResult:
    """The actor pool over the prompts (Ray), then the profiles, S(b), artifacts and MLflow records."""
    cfg, run_dir, progress = prep.cfg, run.run_dir, options.progress
    t0 = time.perf_counter()
    if in_process(cfg):  # one actor on this machine: no Ray start, no actor start (the same rows)
        rows = _rows_in_process(prep, progress)
    else:
        with ray_session(cfg.ray):
            rows = _compute_rows(prep, progress)
    agg = aggregate(prep, rows)
    wall_s = time.perf_counter() - t0
    summary = dict(model_ref=cfg.model.ref, model_path=prep.model_path, num_layers=prep.num_layers,
                   num_prompts=len(prep.records), top_k=cfg.trace.top_k, tau=cfg.trace.tau, eps=cfg.trace.eps,
                   prompts=cfg.trace.prompts, wall_s=wall_s, mlflow_run_id=run.run_id,
                   seam_space_prompts=sum(p.seam_space for p in prep.encoded),
                   forward_s=float(np.sum(rows["forward_s"])) if "forward_s" in rows else None,
                   recommended=dict((k, agg["recommended"][k]) for k in ("ratio", "split_layer", "S")),
                   split_table=agg["table"], grid_scores=agg["recommended"]["scores"],
                   tp_layers=agg["tp_layers"], answer_hit_rate=agg["hit_rate"],
                   tp=agg["profiles"]["tp"].tolist(), ls=agg["profiles"]["ls"].tolist(),
                   tp_norm=agg["profiles"]["tp_norm"].tolist(), ls_norm=agg["profiles"]["ls_norm"].tolist(),
                   groups={g: dict(tp=v["tp"].tolist(), ls=v["ls"].tolist(), n=v["n"])
                           for g, v in agg["profiles"]["groups"].items()},
                   median=agg["profiles"]["median"])
    paths = write_artifacts(run_dir, agg["df"], agg["profiles"], agg["table"], agg["recommended"], summary,
                            requested=prep.splits, title=f"{Path(cfg.model.ref).name}")
    log_trace(run, summary, paths)
    prof = agg["profiles"]
    return TraceResult(run_dir=run_dir, run_id=run.run_id, model_ref=cfg.model.ref, num_layers=prep.num_layers,
                       num_prompts=len(prep.records), top_k=cfg.trace.top_k, tau=cfg.trace.tau, tp=prof["tp"],
                       ls=prof["ls"], tp_norm=prof["tp_norm"], ls_norm=prof["ls_norm"], groups=prof["groups"],
                       median=prof["median"],
                       split_table=agg["table"],
                       recommended=dict((k, agg["recommended"][k]) for k in ("ratio", "split_layer", "S")),
                       grid_scores=agg["recommended"]["scores"], tp_layers=agg["tp_layers"],
                       answer_hit_rate=agg["hit_rate"], paths=paths, wall_s=wall_s,
                       seam_note=seam_note(prep.encoded))


TRACE = Steps(prepare, execute, run_spec)
