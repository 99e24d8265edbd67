"""``raycpt compare``: layer-wise base-vs-tuned analysis (seed 002), with the heavy parts as Ray tasks.

``run_compare(cfg, base, tuned)`` (settings: the config's ``compare`` section, which the CLI options set):

1. resolves BASE and TUNED (model references, model folders, or run folders of ``raycpt train`` /
   sweep trials) and checks, before any Ray or MLflow work, that both have one architecture and one
   layer count (one line, exit 2 otherwise);
2. tokenises the prompt set once (base tokenizer);
3. Ray tasks: per model, the residual stream after every block + the layer-wise probe
   (:func:`~raycpt.diagnostics.similarity.collect_states`) and the per-model metrics (entropy,
   effective rank); then the pairwise metrics (CKA, cosine, mean shift) from both models' states;
   the weight change; and the layer swap: for each of ``swap_blocks`` contiguous blocks, the base
   with that block taken from the tuned model and the reverse, each evaluated on the eval benchmark
   (``raycpt.evaluate.evaluate_model``) next to the plain base and tuned models;
4. writes ``layers.csv`` / ``layers.md`` / ``swaps.csv`` / plots (PNG) / ``summary.json`` into the run
   folder and logs them to one MLflow run (metric series with step = layer).

``--sweep RUN`` compares every finished trial of a sweep run folder with that sweep's base model (one
nested MLflow run and one sub-folder per trial).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig, load_config
from raycpt.diagnostics.contribution import primary_score  # noqa: F401 - re-exported
from raycpt.diagnostics.similarity import (collect_states, layer_blocks, model_metrics, pair_metrics, swap_layers,
                                           weight_change)
from raycpt.diagnostics.texts import load_prompt_texts, tokenize  # noqa: F401 - load_prompt_texts re-exported
from raycpt.errors import RaycptError
from raycpt.evaluate import evaluate_model
from raycpt.jobs.job import Options, RunSpec, Steps, run_job
from raycpt.models.folders import check_pair, find_model_in_run, is_model_folder  # noqa: F401 - re-exported
from raycpt.models.sources import load_model, resolve_model_path
from raycpt.report.compare import build_rows, write_outputs
from raycpt.progress import progress_bar
from raycpt.runtime import ray_session
from raycpt.train.driver.final_eval import reserved_device


# ------------------------------------------------------------------------------------- references
def _refuse_same(base: str, tuned: str, a: str, b: str) -> None:
    if os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b)):
        raise RaycptError(f"BASE and TUNED are the same model ({base!r} and {tuned!r}): every metric would be "
                          "trivially identical; give the base model and a trained one")


def resolve_ref(ref: str, cfg: ExperimentConfig) -> str:
    """A model folder for ``ref``: a model folder as is, a run folder's final model, or a resolved reference."""
    p = Path(ref).expanduser()
    if p.is_dir():
        if is_model_folder(p):
            return str(p.resolve())
        found = find_model_in_run(p)
        if found is not None:
            return str(found.resolve())
        if not any(p.glob("*.gguf")) and not any(p.glob("*.gguf.part*")):
            raise RaycptError(f"{ref}: folder holds no model (no config.json with weights, no trained checkpoint)")
    return resolve_model_path(cfg.model, ref, progress=True)


# ------------------------------------------------------------------------------------- Ray tasks
def _torch_threads(n: Optional[int] = None) -> None:
    import torch

    torch.set_num_threads(max(1, int(n or os.environ.get("OMP_NUM_THREADS", 1) or 1)))


def states_task(path: str, seqs: list[list[int]], batch_size: int, alpha: float, outlier_factor: float = 10.0,
                dtype: str = "float32"):
    """Load one model, record per-layer states and the probe; return (states, per-model metrics)."""
    _torch_threads()
    model, _ = load_model(path, dtype=dtype, device="cpu")
    st = collect_states(model, seqs, batch_size=batch_size, drop_first=True)
    return st, model_metrics(st, alpha, outlier_factor)


def pair_task(a, b, outlier_factor: float = 10.0):
    _torch_threads()
    return pair_metrics(a, b, outlier_factor)


def weights_task(base_path: str, tuned_path: str):
    _torch_threads()
    a, _ = load_model(base_path, dtype="float32", device="cpu")
    b, _ = load_model(tuned_path, dtype="float32", device="cpu")
    return weight_change(a, b)


def evaluate_cells(model_or_path, tokenizer, eval_cfg, out_dir: Path, name: str) -> dict[str, float]:
    """``evaluate_model`` -> flat ``{task/category/mode: accuracy %}`` (``EvalResult.metrics()``)."""
    ev = evaluate_model(model_or_path, eval_cfg, tokenizer=tokenizer, out_dir=out_dir, name=name)
    return ev.metrics()


def swap_task(base_path: str, tuned_path: str, direction: str, layers: list[int], eval_cfg, out_dir: str,
              name: str) -> dict:
    """Evaluate one model: ``base``, ``tuned``, ``base<-tuned`` (base with ``layers`` from tuned) or the reverse."""
    _torch_threads()
    t0 = time.time()
    if direction == "base":
        model, tok = load_model(base_path, dtype="float32", device="cpu")
    elif direction == "tuned":
        model, tok = load_model(tuned_path, dtype="float32", device="cpu")
    else:
        target, donor = (base_path, tuned_path) if direction == "base<-tuned" else (tuned_path, base_path)
        model, tok = load_model(target, dtype="float32", device="cpu")
        other, _ = load_model(donor, dtype="float32", device="cpu")
        swap_layers(model, other, layers)
        del other
    model.to(reserved_device())  # the GPU this task reserved (eval.gpus_per_task), else the CPU
    cells = evaluate_cells(model, tok, eval_cfg, Path(out_dir), name)
    key, score = primary_score(cells, eval_cfg)
    return dict(direction=direction, layers=list(layers), score=score, score_key=key, cells=cells,
                wall_s=time.time() - t0)


# ------------------------------------------------------------------------------------- the driver
@dataclass
class CompareResult:
    run_dir: Path
    rows: list[dict]
    swaps: list[dict] = field(default_factory=list)
    base_score: Optional[float] = None
    tuned_score: Optional[float] = None
    plots: list[Path] = field(default_factory=list)
    wall_s: float = 0.0
    mlflow_run_id: Optional[str] = None
    children: list["CompareResult"] = field(default_factory=list)


def compare_pair(cfg: ExperimentConfig, base_path: str, tuned_path: str, seqs: list[list[int]], out_dir: Path,
                 swap_blocks: int, alpha: float, batch_size: int, progress=None, outlier_factor: float = 10.0) -> dict:
    """Place the Ray tasks for one base/tuned pair and gather their results (Ray must be up)."""
    import ray

    _, n = check_pair(base_path, tuned_path)
    cpu = max(cfg.eval.cpus_per_task, 0.5)
    st = ray.remote(num_cpus=cpu, num_returns=2)(states_task)
    seqs_ref = ray.put(seqs)
    a, am = st.remote(base_path, seqs_ref, batch_size, alpha, outlier_factor)
    b, bm = st.remote(tuned_path, seqs_ref, batch_size, alpha, outlier_factor)
    pr = ray.remote(num_cpus=0.5)(pair_task).remote(a, b, outlier_factor)
    wr = ray.remote(num_cpus=cpu)(weights_task).remote(base_path, tuned_path)
    swap_refs = []
    if swap_blocks > 0:
        blocks = layer_blocks(n, swap_blocks)
        sw = ray.remote(num_cpus=cpu, num_gpus=cfg.eval.gpus_per_task)(swap_task)
        ev_dir = out_dir / "eval"
        swap_refs.append(("base", -1, sw.remote(base_path, tuned_path, "base", [], cfg.eval, str(ev_dir), "base")))
        swap_refs.append(("tuned", -1, sw.remote(base_path, tuned_path, "tuned", [], cfg.eval, str(ev_dir),
                                                  "tuned")))
        for j, lay in enumerate(blocks):
            for d in ("base<-tuned", "tuned<-base"):
                nm = f"{d.replace('<-', '_from_')}_block{j}"
                swap_refs.append((d, j, sw.remote(base_path, tuned_path, d, lay, cfg.eval, str(ev_dir), nm)))
    refs = [am, bm, pr, wr] + [r for _, _, r in swap_refs]
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        if progress is not None:
            progress(1)
    base_m, tuned_m = ray.get(am), ray.get(bm)
    pair, wc = ray.get(pr), ray.get(wr)
    rows = build_rows(pair, base_m, tuned_m, wc)
    swaps, base_score, tuned_score = [], None, None
    for d, j, r in swap_refs:
        res = ray.get(r)
        if d == "base":
            base_score = res["score"]
        elif d == "tuned":
            tuned_score = res["score"]
        else:
            swaps.append(dict(block=j, direction=d, layers=res["layers"], score=res["score"],
                              score_key=res["score_key"], wall_s=round(res["wall_s"], 2)))
    return dict(rows=rows, swaps=swaps, base_score=base_score, tuned_score=tuned_score, num_tasks=len(refs))


def _log_pair(run, res: dict, files: list[Path], out_dir: Path) -> None:
    """One pair's per-layer rows, swap scores and files into ``run`` (the command's, or a sweep trial's child)."""
    for r in res["rows"]:
        run.log_metrics({k: v for k, v in r.items() if k not in ("layer", "depth")}, step=r["layer"])
    if res["base_score"] is not None:
        run.log_metrics({"swap/base": res["base_score"], "swap/tuned": res["tuned_score"]})
        for s in res["swaps"]:
            key = "swap/" + s["direction"].replace("<-", "_from_")
            run.log_metrics({key: s["score"]}, step=s["block"])
    for f in files:
        rel = Path(f).parent.relative_to(out_dir) if Path(f).is_relative_to(out_dir) else Path(".")
        run.log_artifact(f, None if str(rel) == "." else str(rel))


def _sweep_pairs(sweep_dir: Path, cfg: ExperimentConfig) -> tuple[str, list[tuple[str, str]]]:
    """(base reference, [(trial name, model folder)]) of a finished sweep run folder."""
    sweep_dir = Path(sweep_dir).expanduser()
    if not (sweep_dir / "trials").is_dir():
        raise RaycptError(f"--sweep {sweep_dir}: not a sweep run folder (no trials/ inside)")
    base_ref = cfg.model.ref
    if (sweep_dir / "config.yaml").is_file():
        base_ref = load_config(sweep_dir / "config.yaml").model.ref
    pairs = []
    for tdir in sorted((sweep_dir / "trials").iterdir()):
        if not tdir.is_dir():
            continue
        m = find_model_in_run(tdir)
        if m is not None:
            pairs.append((tdir.name, str(m)))
    if not pairs:
        raise RaycptError(f"--sweep {sweep_dir}: no finished trial with a trained model yet")
    return base_ref, pairs


def _pairs(cfg: ExperimentConfig, base: Optional[str], tuned: Optional[str], sweep: Optional[str]):
    """``(base label, [(name, base path, tuned path, tuned label)])``: BASE TUNED, or every trial of a sweep."""
    if sweep:
        if base or tuned:
            raise RaycptError("give either BASE TUNED or --sweep RUN, not both")
        base_ref, trial_pairs = _sweep_pairs(Path(sweep), cfg)
        base_path = resolve_ref(base_ref, cfg)
        return base_ref, [(name, base_path, path, path) for name, path in
                          ((name, resolve_ref(p, cfg)) for name, p in trial_pairs)]
    if not base or not tuned:
        raise RaycptError("compare needs BASE and TUNED (model references, model folders or run folders), "
                          "or --sweep RUN")
    _refuse_same(base, tuned, base, tuned)  # before resolving anything
    base_path, tuned_path = resolve_ref(base, cfg), resolve_ref(tuned, cfg)
    _refuse_same(base, tuned, base_path, tuned_path)
    return base, [("tuned", base_path, tuned_path, tuned)]


@dataclass
class ComparePlan:
    """What :func:`prepare` checked: the pairs, the swap blocks, the tokenised prompts."""

    cfg: ExperimentConfig
    base_label: str
    pairs: list
    swap_blocks: int
    seqs: list
    sweep: bool = False


def prepare(cfg: ExperimentConfig, options: Options) -> ComparePlan:
    """Resolve and check every pair (BASE TUNED: the options' two positional words; or ``--sweep``: one architecture,
    one depth), the swap blocks, the prompts: no Ray, no MLflow."""
    c = cfg.compare
    base, tuned = (list(options.rest) + [None, None])[:2]
    sweep = options.get("sweep")
    base_label, pairs = _pairs(cfg, base, tuned, sweep)
    n = max(check_pair(bp, tp)[1] for _, bp, tp, _ in pairs)  # validate every pair before starting anything
    swap_blocks = min(5, n) if c.swap_blocks is None else c.swap_blocks
    if swap_blocks > n:
        raise RaycptError(f"--swap-blocks={swap_blocks}: more blocks than the model's {n} layers")
    _, tok = load_model(pairs[0][1], dtype="float32", device="cpu")
    seqs = tokenize(tok, load_prompt_texts(c.prompts, c.max_prompts), c.max_len)
    return ComparePlan(cfg, base_label, pairs, swap_blocks, seqs, sweep=bool(sweep))


def run_spec(plan: ComparePlan, options: Options) -> RunSpec:
    """The compare run: its pairs, prompts and swap blocks as params."""
    params = {"compare.base": plan.base_label[:250], "compare.num_prompts": len(plan.seqs),
              "compare.swap_blocks_used": plan.swap_blocks, "compare.pairs": ",".join(p[0] for p in plan.pairs)[:250]}
    return RunSpec(plan.cfg, "compare", params=params)


def execute(plan: ComparePlan, run, options: Options) -> CompareResult:
    """The Ray tasks of every pair, its files and MLflow records (one child run per trial with ``--sweep``)."""
    t0, cfg, run_dir, c = time.time(), plan.cfg, run.run_dir, plan.cfg.compare
    resume, console = options.resume, options.console
    result = CompareResult(run_dir=run_dir, rows=[], mlflow_run_id=run.run_id)
    seqs, swap_blocks = plan.seqs, plan.swap_blocks
    per_pair = 4 + (2 + 2 * swap_blocks if swap_blocks else 0)
    with ray_session(cfg.ray), progress_bar("compare", per_pair * len(plan.pairs), unit="Ray tasks",
                                                            console=console, transient=True) as advance:
        for name, bp, tp, label in plan.pairs:
            out_dir = run_dir if not plan.sweep else run_dir / "trials" / name
            res = _compare_or_reuse(cfg, bp, tp, seqs, out_dir, swap_blocks, resume, advance, per_pair)
            meta = dict(base=plan.base_label, base_path=bp, tuned=label, tuned_path=tp, trial=name,
                        num_prompts=len(seqs), num_tokens=sum(len(s) - 1 for s in seqs), alpha=c.alpha,
                        swap_blocks=swap_blocks, outlier_factor=c.outlier_factor, eval_tasks=cfg.eval.tasks,
                        eval_modes=cfg.eval.modes, eval_limit=cfg.eval.limit)
            files = write_outputs(out_dir, res, plan.base_label, label, meta)
            if plan.sweep:
                with run.child(name, out_dir, tags={"raycpt.command": "compare", "raycpt.trial": name}) as child:
                    _log_pair(child, res, files, out_dir)
            else:
                _log_pair(run, res, files, out_dir)
            result.children.append(CompareResult(
                run_dir=out_dir, rows=res["rows"], swaps=res["swaps"], base_score=res["base_score"],
                tuned_score=res["tuned_score"], plots=[f for f in files if str(f).endswith(".png")]))
        result.wall_s = time.time() - t0
        run.log_metrics({"wall_time_s": result.wall_s})
    first = result.children[0]
    result.rows, result.swaps = first.rows, first.swaps
    result.base_score, result.tuned_score, result.plots = first.base_score, first.tuned_score, first.plots
    return result


COMPARE = Steps(prepare, execute, run_spec)


def run_compare(cfg: ExperimentConfig, base: Optional[str], tuned: Optional[str], sweep: Optional[str] = None,
                resume: bool = False, console=None) -> CompareResult:
    """The ``raycpt compare`` command (see the module docstring); settings in ``cfg.compare``."""
    return run_job(COMPARE, cfg, Options(console=console, resume=resume, rest=(base, tuned), values={"sweep": sweep}))


def _compare_or_reuse(cfg, bp: str, tp: str, seqs, out_dir: Path, swap_blocks: int, resume: bool, advance,
                      per_pair: int) -> dict:
    """One pair's results: read back from its ``summary.json`` on resume, else computed on Ray."""
    done_json = out_dir / "summary.json"
    if resume and done_json.is_file():
        data = json.loads(done_json.read_text())
        advance(per_pair)
        return dict(rows=data["layers"], swaps=data["swaps"], base_score=data["base_score"],
                    tuned_score=data["tuned_score"])
    c = cfg.compare
    return compare_pair(cfg, bp, tp, seqs, out_dir, swap_blocks, c.alpha, c.batch_size, progress=advance,
                        outlier_factor=c.outlier_factor)
