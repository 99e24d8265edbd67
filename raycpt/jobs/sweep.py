"""The main job: trace, then a grid of layer allocations, each trained and evaluated (on :mod:`raycpt.jobs.grid`).

``run_sweep(cfg, splits, strategies, resume)`` validates the splits against the model's depth (before any
Ray or MLflow work; :func:`plan_grid`), optionally traces once (S(b) for every split), runs the grid -
``full`` once plus every strategy at every split plus named recipes, each a :class:`TrialSpec` whose
:meth:`TrialSpec.run` trains the trial's plan and reads the evaluation its training worker made - and
writes the summary (the paper's Table-1 layout with deltas against ``full`` and their 95% intervals, the
domain benchmark next to the general one, S(b) next to the realised gain, loss curves, held-out loss)
into the run folder and the parent run. With ``sweep.seeds`` every trial runs once per seed
(``<name>-s<seed>``, a child run each with a ``seed`` param and tag) and the summary aggregates them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from raycpt.config import ExperimentConfig, config_with
from raycpt.config.checks import lr_tag
from raycpt.config.sweep import lr_multipliers
from raycpt.data.validation import validation_blocks
from raycpt.decide import extend_rates, rate_rows
from raycpt.diagnostics.selectors import SelectorInputs, ranking_order, select_scores
from raycpt.diagnostics.spectrum import spectrum_pick, spectrum_snr
from raycpt.errors import RaycptError
from raycpt.evaluate_prefetch import prefetch_hub_datasets
from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.jobs.base_row import BASE, BPB_KEYS, base_result, eval_value, general_probe, probe_files
from raycpt.jobs.grid import (SHARDS_CHECKED, Grid, Trial, ahead_of_trials, grid_params, heldout_blocks, model_layers,
                              no_shards, run_grid, train_and_evaluate, warm_imports)
from raycpt.jobs.job import Options, RunSpec, Steps, run_job
from raycpt.jobs.select import BATCH, corpus_blocks
from raycpt.data.run_store import check_corpora
from raycpt.jobs.trace import run_trace
from raycpt.models.adapters import lora_targets, lora_trainable_params
from raycpt.models.sources import load_model
from raycpt.models.stack import LayerStack
from raycpt.report.sweep.summary import report_options, write_summary
from raycpt.jobs.run_inputs import row_model, run_datasets
from raycpt.report.sweep.views.advice import NOTE, recommendation, run_description, trial_description
from raycpt.report.sweep.views.plots import TRADEOFF_PNG
from raycpt.report.sweep.views.terminal import compact_verdict
from raycpt.report.sweep.outcomes import HELDOUT_DOCS_FILE
from raycpt.report.tuning import pick_by_validation, tuning_lines, tuning_markdown
from raycpt.runs.folder import SWEEP_NEUTRAL, SWEEP_SECTIONS, check_resume_config, memo
from raycpt.runtime import ray_session, stop_ray_soon
from raycpt.splits import check_split, split_index
from raycpt.strategies import budget_plans, check_budget, split_plans, takes_split
from raycpt.train.driver.prepare import model_skeleton
from raycpt.train.driver.preflight import preflight, sweep_plans
from raycpt.train.worker.evaluation import EVAL_RESULT_FILE


@dataclass(frozen=True)
class TrialSpec:
    """One cell of the grid: a plan name, and for split plans the ratio and the layer boundary b."""

    name: str
    strategy: str
    split: Optional[float] = None
    b: Optional[int] = None
    recipe: dict = field(default_factory=dict)
    """Extra typed settings at dotted keys for this trial (a recipe), e.g. ``{"plan.pattern": "01100"}``."""
    seed: Optional[int] = None
    """``train.seed`` of this run (``sweep.seeds``); None = the sweep config's ``train.seed``."""
    group: Optional[str] = None
    """The summary cell this run is one seed of (the name without ``-s<seed>``); None = ``name``."""
    lr_mult: Optional[float] = None
    """``sweep.lr_grid``: this run's learning-rate multiplier (its recipe sets ``train.lr``); None = no grid."""
    base_name: Optional[str] = None
    """``sweep.lr_grid``: the name without ``-lr<m>``, which the picked run is reported under."""

    def run(self, trial: Trial) -> dict:
        """Train and evaluate this trial under its child run (in a Tune trial, or called directly); the base row
        evaluates the untrained model instead (:func:`raycpt.jobs.base_row.base_result`)."""
        if self.strategy == BASE:
            return base_result(trial, self)
        run = trial.run
        tcfg = trial_config(trial.cfg, self)
        if run.created or not run.run_id:
            self.log_params(run, tcfg.train.seed, tcfg.train.lr, trial.shared.get("num_layers"))
        train, ev, heldout = train_and_evaluate(trial, tcfg, self.name)
        cells = ev.metrics()
        result = {
            "name": self.name, "strategy": self.strategy, "split": self.split, "b": self.b,
            "seed": tcfg.train.seed, "group": self.group or self.name,
            "eval_file": str(trial.dir / "eval" / EVAL_RESULT_FILE),
            "trainable_params": int(train.trainable_params), "frozen_params": int(train.frozen_params),
            "tokens_per_s": float(train.tokens_per_s), "wall_s": trial.elapsed, "losses": list(map(float, train.losses)),
            "final_loss": float(train.losses[-1]) if train.losses else float("nan"),
            "final_model_dir": str(train.final_model_dir), "scores": cells, "mlflow_run_id": run.run_id,
            "heldout_loss": heldout, "general_loss": eval_value(trial.dir / "eval", "general_loss"),
            **{k: eval_value(trial.dir / "eval", k) for k in BPB_KEYS},
            "peak_memory_mb": train.peak_memory_mb,
            "trainable_per_step": train.trainable_per_step, "pid": train.pid,
            **({"tune": self.group or self.name, "lr_mult": self.lr_mult, "base_name": self.base_name,
                "lr": tcfg.train.lr, "validation_loss": validation_loss(trial)} if self.lr_mult is not None else {}),
        }
        log_trial_result(trial, result)
        return result

    def params(self, seed) -> dict:
        """The child run's own params (besides the config its training run logs)."""
        return {"strategy": self.strategy, "split": self.split, "b": self.b, "seed": seed,
                "recipe": ",".join(f"{k}={v}" for k, v in self.recipe.items())}

    def log_params(self, run, seed, lr=None, num_layers: Optional[int] = None) -> None:
        """The child run's params, its ``seed`` tag and its MLflow description (plan, layers trained, lr, seed)."""
        run.log_params({k: "" if v is None else v for k, v in self.params(seed).items()})
        run.set_tags({"seed": str(seed), NOTE: trial_description(self.strategy, self.split, num_layers, lr, seed)})


def validation_loss(trial: Trial) -> Optional[float]:
    """The validation-slice loss the trial's evaluation wrote (``sweep.lr_grid``), None without one."""
    f = trial.dir / "eval" / EVAL_RESULT_FILE
    return json.loads(f.read_text()).get("validation_loss") if f.is_file() else None


def with_lr_grid(specs: list[TrialSpec], mults: list[float], base_lr: float) -> list[TrialSpec]:
    """Every trial once per learning-rate multiplier ``m`` (``<name>-lr<m>``, ``train.lr`` = its recipe's rate or
    ``base_lr``, times m); one multiplier of 1 = the trials unchanged."""
    if [float(m) for m in mults] == [1.0]:
        return specs
    return [dataclasses.replace(t, name=f"{t.name}-{lr_tag(m)}", lr_mult=float(m), base_name=t.name,
                                group=t.group or t.name,
                                recipe={**t.recipe, "train.lr": float(t.recipe.get("train.lr", base_lr)) * float(m)})
            for t in specs for m in mults]


def trial_metrics(result: dict) -> dict:
    """The metrics a sweep trial's child run gets at its end, from its ``result.json`` (``raycpt runs sync`` logs
    the same)."""
    losses = {k: result.get(k) for k in ("heldout_loss", "general_loss", "validation_loss", *BPB_KEYS)
              if result.get(k) is not None}
    return {**result["scores"], "wall_time_s": result["wall_s"], "tokens_per_s": result["tokens_per_s"],
            "trainable_params": result["trainable_params"], **losses}


def log_trial_result(trial: Trial, result: dict) -> None:
    """:func:`trial_metrics` and the ``trainable_params`` param on the trial's child run (a value the training loop
    logged first stays: LISA's per-interval count, where the train result counts every layer a draw can pick)."""
    trial.run.log_metrics(trial_metrics(result))
    trial.run.log_params({"trainable_params": result["trainable_params"]})


def plan_grid(splits: list[float], strategies: list[str], num_layers: int, include_full: bool = True,
              recipes: Optional[dict[str, dict]] = None, seeds: Optional[list[int]] = None,
              floor_seeds: Optional[list[int]] = None, base_seed: Optional[int] = None) -> list[TrialSpec]:
    """The trials of a sweep, validated against the model depth; duplicates dropped.

    With ``seeds`` every trial runs once per seed, named ``<name>-s<seed>`` (seed-major: the whole grid
    at the first seed, then at the next, so an interrupted sweep has complete tables early). With
    ``floor_seeds`` (``sweep.floor_seeds``, issue 50) ``full`` also runs at each of them and every other row at the
    first (``<name>-s<seed>``, after the grid), one cell with its run at ``base_seed`` (``train.seed``), which they
    must not repeat: every plan has its own run variance (2 runs; full 1 + len(floor_seeds)).

    Raises RaycptError (one line, :func:`raycpt.splits.check_split`) for a split that is not a ratio in
    (0, 1) or leaves a side empty for this model, an unknown strategy, or an empty grid."""
    specs = _plan_cells(splits, strategies, num_layers, include_full, recipes or {})
    if floor_seeds:
        return _with_floor(specs, floor_seeds, base_seed)
    if seeds is None:
        return specs
    return [dataclasses.replace(t, name=f"{t.name}-s{int(sd)}", seed=int(sd), group=t.name)
            for sd in seeds for t in specs]


def _with_floor(specs: list[TrialSpec], floor_seeds: list[int], base_seed: Optional[int]) -> list[TrialSpec]:
    """The grid, then ``full`` at every floor seed and every other row at the first, each row's runs one cell."""
    if base_seed is not None and base_seed in floor_seeds:
        raise RaycptError(f"sweep.floor_seeds: {list(floor_seeds)} repeats train.seed ({base_seed}), whose runs "
                          "the grid has already; give other seeds")
    if not any(t.name == "full" for t in specs):
        raise RaycptError("sweep.floor_seeds: the grid has no full row to run again (sweep.include_full=true)")
    grid = [dataclasses.replace(t, seed=base_seed, group=t.name) for t in specs]
    more = [dataclasses.replace(t, name=f"{t.name}-s{int(sd)}", seed=int(sd), group=t.name)
            for k, sd in enumerate(floor_seeds) for t in grid if k == 0 or t.name == "full"]
    return grid + more


def with_base(specs: list[TrialSpec], include: bool = True) -> list[TrialSpec]:
    """The grid with the untrained model's row first (:data:`raycpt.jobs.base_row.BASE`: evaluated once, never
    per seed) when ``include`` (``sweep.include_base``)."""
    return [TrialSpec(name=BASE, strategy=BASE)] + specs if include else specs


def _plan_cells(splits: list[float], strategies: list[str], num_layers: int, include_full: bool,
                recipes: dict[str, dict]) -> list[TrialSpec]:
    by_b: dict[int, float] = {}  # two ratios that round to the same boundary train the same plan
    for r in splits:
        by_b.setdefault(check_split(r, num_layers, "split"), float(r))
    specs = [TrialSpec(name="full", strategy="full")] if include_full or "full" in strategies else []
    for s in strategies:
        if takes_split(s):
            specs += [TrialSpec(name=f"{s}-r{r:g}", strategy=s, split=r, b=b) for b, r in by_b.items()]
        elif s in recipes:
            specs.append(TrialSpec(name=s, strategy=str(recipes[s].get("plan.name", s)), recipe=dict(recipes[s])))
        elif s != "full":
            allowed = ", ".join(split_plans() + sorted(recipes) + ["full"])
            raise RaycptError(f"unknown sweep strategy {s!r}: use one of {allowed}")
    if not specs:
        raise RaycptError("the sweep has no trials: give --strategies or keep sweep.include_full")
    return specs


def trial_config(cfg: ExperimentConfig, spec: TrialSpec) -> ExperimentConfig:
    """The experiment config of one trial: the sweep config with the trial's plan applied (validated)."""
    split = {} if spec.split is None else {"plan.split": spec.split}
    seed = {} if spec.seed is None else {"train.seed": int(spec.seed)}
    footing = {"plan.full_non_layers": False} if cfg.sweep.equal_footing else {}  # issue 24: equal footing
    # a finished trial keeps what it trained: frozen layers are links to the base model's shards, no optimizer state
    store = {"train.publish": "reference", "train.keep_finished_checkpoints": bool(cfg.sweep.keep_checkpoints)}
    return config_with(cfg, {"plan.name": spec.strategy, **split, **seed, **footing, **store, **spec.recipe})


@dataclass
class SweepResult:
    run_dir: Path
    parent_run_id: str
    trials: list[dict]
    summary: dict = field(default_factory=dict)
    trace: Any = None
    wall_s: float = 0.0


@dataclass
class SweepPlan:
    """What :func:`prepare` checked: the effective config, the model and its depth, the trials, the held-out blocks;
    when the sweep started (its wall time counts the checks) and what waits for the base shards
    (:func:`raycpt.jobs.grid.ahead_of_trials`)."""

    cfg: ExperimentConfig
    model_path: str
    num_layers: int
    specs: list[TrialSpec]
    heldout: Optional[list] = None
    t0: float = field(default_factory=time.time)
    validation: Optional[list] = None
    """The validation slice's blocks (``sweep.lr_grid``: the learning rate is picked on them)."""
    shards_ready: Callable[[], dict] = no_shards
    general: Optional[list] = None
    """The general probe's blocks (:func:`raycpt.jobs.base_row.general_probe`), or None."""


def prepare(cfg: ExperimentConfig, options: Optional[Options] = None) -> SweepPlan:
    """Every check of a sweep, with no Ray and no MLflow: the splits against the model's depth and the trials
    first, then the memory of the plans that will run (printed to the console: the first and the last split).
    ``options.values`` ``splits`` / ``strategies`` set ``sweep.splits`` / ``sweep.strategies`` (library callers)."""
    options, t0 = options if options is not None else Options(), time.time()
    console = options.console
    if options.get("splits") is not None:
        cfg.sweep.splits = list(options.get("splits"))
    if options.get("strategies") is not None:
        cfg.sweep.strategies = list(options.get("strategies"))
    model_path, num_layers = model_layers(cfg)
    # a bad corpus (replay too): one line, no run folder
    check_corpora(cfg, model_path, options.located(cfg, check=False).root, quiet=console is None)
    s = cfg.sweep
    if is_auto(s.budget):  # the recommended train_shallow's count: the rows come after the trace (execute)
        if not s.trace_first:
            raise RaycptError("--budget auto is the recommended train_shallow's count: it needs the trace "
                              "(sweep.trace_first=true), or give a trainable-parameter count")
        s.strategies = []
    elif s.budget is not None:  # the equal-budget trials replace the strategies (as recipes: the config says them)
        use_budget_rows(cfg, budget_rows(cfg, model_path), console)
    specs = with_base(with_lr_grid(plan_grid(s.splits, s.strategies, num_layers, s.include_full, s.recipes, s.seeds,
                                             s.floor_seeds, cfg.train.seed), lr_multipliers(s), cfg.train.lr),
                      s.include_base)
    check_memory(cfg, console, sweep_plans(cfg))
    blocks = heldout_blocks(cfg, model_path, s.heldout_docs, "sweep.heldout_docs", "sweep.heldout_docs") \
        if s.heldout_docs else None
    val = validation_blocks(cfg.data, model_path, s.validation_docs, s.heldout_docs) \
        if lr_multipliers(s) != [1.0] else None
    prefetch_hub_datasets(cfg.eval, console=console)  # hub eval data once, on the driver; the trials read it offline
    return SweepPlan(cfg, model_path, num_layers, specs, blocks, t0=t0, validation=val,
                     general=general_probe(cfg, model_path))


def run_spec(plan: SweepPlan, options: Options) -> RunSpec:
    """The sweep's run: the grid's params; Ray and the base shards start while it opens."""
    names = grid_params(plan.specs)["trials"]  # params by section, as the config's (issue 48)
    return RunSpec(plan.cfg, "sweep", params={"sweep.trials": names, "model.num_layers": plan.num_layers},
                   around=ahead_of_trials(plan, options.located(plan.cfg, check=False)),
                   on_open=resume_check(plan.cfg, options))


def resume_check(cfg: ExperimentConfig, options: Options):
    """``--resume``: one line naming each setting that defines the work (:data:`raycpt.runs.folder.SWEEP_SECTIONS`) and
    differs from the run folder's ``config.yaml``; ``--accept-changes`` continues with the new ones."""
    if not options.resume:
        return None
    return lambda run_dir: check_resume_config(run_dir, cfg, SWEEP_SECTIONS, SWEEP_NEUTRAL,
                                               accept=bool(options.get("accept_changes")),
                                               why="Its finished trials and tables were made with the saved ones.")


def budget_numbers(skeleton, targets=()) -> dict:
    """What :func:`raycpt.strategies.budget_plans` needs, from a weightless copy of the model: parameters per
    layer, outside the layers (a tied matrix once), LoRA parameters per unit of rank on every layer, the largest
    rank (the smallest targeted width), the model's total."""
    stack = LayerStack.of(skeleton)
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in stack.layers]
    total = sum(p.numel() for p in skeleton.parameters())
    mods = lora_targets(skeleton, range(stack.num_layers), targets)
    return {"layer_params": sizes, "non_layer_params": total - sum(sizes), "total": total,
            "embed_head_params": total - sum(sizes) - sum(p.numel() for p in stack.final_norm.parameters()),
            "lora_per_rank": lora_trainable_params(skeleton, 1, range(stack.num_layers), targets),
            "max_rank": min(min(m.in_features, m.out_features) for _, m in mods)}


def is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def auto_budget(recommended_ratio: float, layer_params) -> int:
    """``--budget auto``: the trainable count of train_shallow at the trace's recommended split (layers [0, b))."""
    sizes = [int(x) for x in layer_params]
    return sum(sizes[:split_index(recommended_ratio, len(sizes))])


def use_budget_rows(cfg: ExperimentConfig, rows: list[dict], console=None) -> None:
    """The budget rows become the sweep's recipes and strategies (the run folder's config names each one)."""
    s = cfg.sweep
    s.recipes = {**s.recipes, **{r["name"]: r["settings"] for r in rows}}
    s.strategies = [r["name"] for r in rows]
    if console is not None:
        console.print(f"budget {int(s.budget):,}: " + ", ".join(f"{r['name']} ({r['trainable']:,})" for r in rows),
                      markup=False)


def parse_budget(value) -> int:
    """``--budget``: a whole trainable-parameter count (``auto`` is resolved after the trace, :func:`auto_budget`)."""
    try:
        return int(str(value).replace("_", "").replace(",", ""))
    except ValueError:
        raise RaycptError(f"--budget {value!r}: expected a trainable-parameter count (a whole number)") from None


def budget_rows(cfg: ExperimentConfig, model_path: str, selectors: Optional[list[str]] = None) -> list[dict]:
    """The equal-budget trials: the budget checked against the model first (one line), then the rankings of
    :data:`BUDGET_SELECTORS` and Spectrum's per-type SNR computed on the driver by the registered selectors (:func:`raycpt.diagnostics.selectors.select_scores`,
    the path ``raycpt select`` takes), best first, then :func:`raycpt.strategies.budget_plans`; ``selectors``: only
    these rankings (``raycpt decide``'s budget arms), None = all."""
    nums = budget_numbers(model_skeleton(model_path), cfg.plan.lora_targets)
    budget = check_budget(parse_budget(cfg.sweep.budget), nums["layer_params"], nums["total"])
    model, tok = load_model(model_path, dtype="float32", device="cpu")
    layers = LayerStack(model).layers
    inputs = SelectorInputs(num_layers=len(layers), model=model, layers=layers, blocks=corpus_blocks(cfg, tok),
                            batch=BATCH)
    order = {name: ranking_order(select_scores(m, inputs)) for name, m in BUDGET_SELECTORS.items()
             if selectors is None or name in selectors}
    return budget_plans(budget, nums["layer_params"], nums["non_layer_params"], nums["lora_per_rank"],
                        nums["max_rank"], rankings=order, lora_lr=cfg.train.lr * cfg.sweep.lora_lr_scale,
                        spectrum=spectrum_inputs(layers, nums["embed_head_params"]))


BUDGET_SELECTORS = {"bi": "bi", "snr_layer": "snr", "gradnorm": "gradnorm", "elo": "elo"}
"""Budget row prefix -> registered selector whose top-k it trains (``snr_layer``: the layer-level mean SNR, not
Spectrum, whose per-type row is :func:`spectrum_inputs`')."""


def spectrum_inputs(layers, embed_head: int) -> dict:
    """What :func:`raycpt.strategies.budget.spectrum_row` needs: Spectrum's pick at a percent, each matrix's
    parameters (weight and bias), the embeddings + head count it always trains."""
    snr = spectrum_snr(layers)
    sizes = {(i, t): sum(p.numel() for p in layers[i].get_submodule(t).parameters(recurse=False)) for i, t in snr}
    return {"pick": lambda q: spectrum_pick(snr, q), "sizes": sizes, "base": embed_head}


def check_memory(cfg: ExperimentConfig, console, plans: list) -> None:
    """The memory estimate of every plan the sweep will train (each printed), then one line naming every plan
    (with its split) that does not fit."""
    failed = []
    for pc in plans:
        try:
            preflight(cfg, console, [pc])
        except RaycptError as e:
            failed.append((pc.name + (f" r={pc.split:g}" if takes_split(pc.name) else ""), str(e)))
    if failed:
        names = ", ".join(n for n, _ in failed)
        raise RaycptError(f"{len(failed)} of {len(plans)} sweep plans do not fit ({names}); {failed[0][1]}")


def execute(plan: SweepPlan, run, options: Options) -> SweepResult:
    """Trace once, run the grid, write the summary (inside the sweep's :func:`raycpt.runs.run.command_run`).
    ``plan.shards_ready()`` is called before the first trial (waits for the base shards written ahead of the trials;
    returns the ones it verified: ``Grid.shared[SHARDS_CHECKED]``)."""
    cfg, run_dir, s = plan.cfg, run.run_dir, plan.cfg.sweep
    resume, console = options.resume, options.console
    shared = {"heldout_path": str(atomic_write_json(run_dir / "heldout_blocks.json", plan.heldout))
              if plan.heldout else None}
    if plan.heldout and getattr(plan.heldout, "documents", None):  # the document of each block: the summary's clusters
        atomic_write_json(run_dir / HELDOUT_DOCS_FILE, list(plan.heldout.documents))
    if plan.validation:
        shared["validation_path"] = str(atomic_write_json(run_dir / "validation_blocks.json", plan.validation))
    shared.update(probe_files(run_dir, plan.general), model_path=plan.model_path, num_layers=plan.num_layers)
    # the benchmarks and the model at the end
    run.log_inputs(run_datasets(run.location.root, cfg, plan.model_path, shared, []))
    with ray_session(cfg.ray, meanwhile=warm_imports):
        trace = None
        if s.trace_first:
            splits = sorted({t.split for t in plan.specs if t.split is not None}) or list(s.splits)
            trace = _trace_once(cfg, run_dir, splits, run)
        if is_auto(s.budget):
            plan.specs = _auto_specs(plan, trace, console)
        grid = Grid("sweep", plan.specs, shared=shared, cpus=s.cpus_per_trial, data_cpus=s.data_cpus_per_trial,
                    resources=s.trial_resources, max_concurrent=s.max_concurrent_trials,
                    max_steps=cfg.train.max_steps, model_path=plan.model_path)
        grid.shared[SHARDS_CHECKED] = plan.shards_ready() or {}
        trials = list(run_grid(run, grid, resume=resume, console=console).values())
        trials += extend_lr_grid(run, grid, trials, cfg, resume, console)
        stop_ray_soon()  # Ray shuts down while the summary is written
        trials, tuning = pick_by_validation(trials)
        if console is not None:
            console.print(f"summary: {len(trials)} trials -> {run_dir / 'summary'} (tables, figures, verdict)",
                          markup=False, highlight=False)
        summary = write_summary(run_dir, trials, trace=trace, num_layers=plan.num_layers, domain=cfg.eval.domain,
                                general=cfg.eval.general, report=report_options(cfg, run.location.decisions))
        if tuning:
            summary["tuning"] = record_tuning(run, run_dir, tuning, plan, console)
        log_summary(run, summary["files"], trace, summary)
        run.log_inputs(sweep_inputs(run.location.root, plan, shared, trials, summary))
        run.state(done=True)
    return SweepResult(run_dir=run_dir, parent_run_id=run.run_id, trials=trials, summary=summary, trace=trace,
                       wall_s=time.time() - plan.t0)


def sweep_inputs(root: Path, plan: SweepPlan, shared: dict, trials: list[dict], summary: dict) -> list[dict]:
    """The sweep run's dataset inputs and the recommended (or leading) row's model, linked to its folder (issue 48:
    :mod:`raycpt.jobs.run_inputs`); a trial without a recorded lr is read at its spec's."""
    specs = {s.name: s for s in plan.specs}
    datasets = run_datasets(root, plan.cfg, plan.model_path, shared, trials)
    model = row_model(recommendation(summary), trials, plan.num_layers, lambda t: trial_config(
        plan.cfg, specs[t["name"]]).train.lr if t.get("name") in specs else plan.cfg.train.lr, datasets)
    return datasets + ([model] if model else [])


def extend_lr_grid(run, grid: Grid, trials: list[dict], cfg: ExperimentConfig, resume: bool = False,
                   console=None) -> list[dict]:
    """Each method at its own optimum (issue 47, :mod:`raycpt.decide.search`): while a method's pick is its grid's
    largest or smallest rate and it has added fewer than ``sweep.lr_max_extensions`` rates, its runs (every seed) go
    on at pick x ``sweep.lr_step`` (or / step), one Tune grid per round (``tune-lr<k>``); the added trials' results."""
    s = cfg.sweep
    if lr_multipliers(s) == [1.0] or not s.lr_max_extensions:
        return []
    specs = {t.name: t for t in grid.specs}
    added: list[dict] = []
    for k in range(1, s.lr_max_extensions + 1):
        _, table = pick_by_validation(trials + added)
        rows = rate_rows({r["method"]: {g["lr_mult"]: g["validation_loss"] for g in r["grid"]} for r in table},
                         lr_multipliers(s))
        nxt = extend_rates(rows, s.lr_step, s.lr_max_extensions)
        if not nxt:
            break
        new = [dataclasses.replace(t, name=f"{t.base_name}-{lr_tag(nxt[t.group])}", lr_mult=float(nxt[t.group]),
                                   recipe={**t.recipe, "train.lr": float(t.recipe["train.lr"]) / t.lr_mult
                                           * float(nxt[t.group])})
               for t in _one_per_run(specs.values()) if t.group in nxt]
        if console is not None:
            console.print("learning rate at the grid's edge, extending: " + ", ".join(
                f"{m} -> x{v:.3g}" for m, v in nxt.items()), markup=False)
        more = dataclasses.replace(grid, specs=new, tune_name=f"tune-lr{k}")
        added += list(run_grid(run, more, resume=resume, console=console).values())
        specs.update({t.name: t for t in new})
    return added


def _one_per_run(specs) -> list[TrialSpec]:
    """One grid point of each run of a tuned method (its first multiplier): the template of the added rates."""
    seen, out = set(), []
    for t in specs:
        if t.lr_mult is not None and t.base_name not in seen:
            seen.add(t.base_name)
            out.append(t)
    return out


def record_tuning(run, run_dir: Path, tuning: list[dict], plan: SweepPlan, console=None) -> list[dict]:
    """The learning-rate grid and each method's pick: printed, ``summary/tuning.md`` (and appended to
    ``summary.md``), ``summary/tuning.json``, and on the sweep's run a table, a ``tuned_lr/<method>`` param each
    and the validation loss of every grid point as a metric."""
    blocks = plan.validation or []
    note = (f"{len(blocks)} blocks of {len(set(getattr(blocks, 'documents', [])))} documents, none trained on, none a "
            "held-out test document")
    if console is not None:
        console.print("\n".join(tuning_lines(tuning, note)), markup=False, highlight=False)
    text = tuning_markdown(tuning, note)
    md = run_dir / "summary" / "tuning.md"
    atomic_write_text(md, text)
    whole = run_dir / "summary" / "summary.md"
    if whole.is_file():
        atomic_write_text(whole, whole.read_text(encoding="utf-8") + "\n" + text)
    run.log_artifact(atomic_write_json(run_dir / "summary" / "tuning.json", tuning), "summary")
    run.log_artifact(md, "summary")
    run.log_params({f"tuned_lr/{r['method']}": r["picked_lr"] for r in tuning if r["picked_lr"] is not None})
    run.log_metrics({f"validation_loss/{r['method']}/lr{g['lr']:.3g}": g["validation_loss"] for r in tuning
                     for g in r["grid"] if g["validation_loss"] == g["validation_loss"]})
    return tuning


def _auto_specs(plan: SweepPlan, trace: dict, console=None) -> list[TrialSpec]:
    """``--budget auto`` after the trace: the budget = the recommended train_shallow's count, then its rows."""
    cfg, s = plan.cfg, plan.cfg.sweep
    sizes = budget_numbers(model_skeleton(plan.model_path), cfg.plan.lora_targets)["layer_params"]
    s.budget = auto_budget(trace["recommended_split"], sizes)
    use_budget_rows(cfg, budget_rows(cfg, plan.model_path), console)
    return with_base(with_lr_grid(plan_grid(s.splits, s.strategies, plan.num_layers, s.include_full, s.recipes,
                                            s.seeds, s.floor_seeds, cfg.train.seed), lr_multipliers(s), cfg.train.lr),
                     s.include_base)


SWEEP = Steps(prepare, execute, run_spec)


def run_sweep(cfg: ExperimentConfig, splits: Optional[list[float]] = None, strategies: Optional[list[str]] = None,
              resume: bool = False, console=None) -> SweepResult:
    """The ``raycpt sweep`` command (see the module docstring): :func:`prepare`, then :func:`execute` in the
    command's run. ``splits`` / ``strategies`` set ``sweep.splits`` / ``sweep.strategies`` (library callers)."""
    return run_job(SWEEP, cfg, Options(console=console, resume=resume,
                                       values={"splits": splits, "strategies": strategies}))


def _trace_once(cfg: ExperimentConfig, run_dir: Path, splits: list[float], parent) -> dict:
    """Run the trace once per sweep (skipped on resume when it already finished: the memo)."""
    if cfg.sweep.trace_max_prompts is not None:
        cfg = dataclasses.replace(cfg, trace=dataclasses.replace(cfg.trace, max_prompts=cfg.sweep.trace_max_prompts))
    return memo(run_dir / "trace" / "trace_result.json", lambda: _trace(cfg, run_dir, splits, parent))


def _trace(cfg: ExperimentConfig, run_dir: Path, splits: list[float], parent) -> dict:
    res = run_trace(cfg, run_dir=run_dir / "trace", splits=splits, parent=parent)
    return {"recommended_split": res.recommended_split,
            "split_scores": {f"{float(row['ratio']):g}": float(row["S"]) for row in res.split_table},
            "split_intervals": {f"{float(row['ratio']):g}": [row.get("S_lo"), row.get("S_hi")]
                                for row in res.split_table},
            "split_like_best": {f"{float(row['ratio']):g}": row.get("like_best") for row in res.split_table},
            "artifacts": [str(p) for p in res.artifacts]}


def log_summary(run, files: list, trace: Optional[dict], summary: dict) -> None:
    """The summary on the sweep's :class:`raycpt.runs.run.Run`: its description (the ``mlflow.note.content`` tag MLflow
    shows on the run's page: the recommendation and the verdict's lines, :func:`raycpt.report.sweep.views.advice.
    run_description`), its files, the flat per-cell table as the MLflow table ``summary/deltas.json``, S(b) and the
    headline deltas as metrics."""
    again = f"raycpt sweep {Path(run.run_dir) / 'config.yaml'}"  # the folder's resolved config reruns it
    figure = f"summary/{TRADEOFF_PNG}" if any(Path(f).name == TRADEOFF_PNG for f in files) else None
    run.set_tags({NOTE: run_description(summary, compact_verdict(summary), again, figure)})
    for f in files:
        run.log_artifact(f, "summary")
    for a in (trace or {}).get("artifacts", []):
        if Path(a).is_file():
            run.log_artifact(a, "trace")
    if summary["records"]:
        cols = list(summary["records"][0])
        run.log_table({c: [r[c] for r in summary["records"]] for c in cols}, "summary/deltas.json")
    metrics = {f"S_b/{g['split']:g}": g["S_b"] for gains in summary["split_gains"].values() for g in gains
               if g["S_b"] is not None}
    for e in summary["domain_general"]:  # the headline numbers as metrics too (compare parents in the UI)
        for role in ("domain", "general"):
            metrics.update({f"{role}_delta/{e['name']}/{i['task']}/{i['mode']}": i["delta"] for i in e[role]
                            if i.get("delta") is not None})
    run.log_metrics(metrics)
