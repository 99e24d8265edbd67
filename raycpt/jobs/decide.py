"""``raycpt decide``: the same arms at a short and a long token budget, each arm at its own learning-rate optimum at
each horizon, k paired seeds each, and whether the short ranking is the long one (issue 47).

The work, on the sweep's machinery (:class:`raycpt.jobs.sweep.TrialSpec`, :func:`raycpt.jobs.grid.run_grid`): per
horizon, the arms run at every rate of ``decide.lr_grid`` at the search seeds; each arm's pick is read on the
validation slice (:mod:`raycpt.decide.search`: a pick at an edge adds the next rate that way, one Tune grid per
round, until every arm is interior or out of extensions); then every arm runs its pick at the other seeds. The
measures (:mod:`raycpt.decide.accuracy`) and the report (:mod:`raycpt.report.decide`) follow; every trial is a child
run of the one ``decide`` MLflow run.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from raycpt.config import ExperimentConfig, config_with
from raycpt.config.checks import lr_tag
from raycpt.data.run_store import check_corpora
from raycpt.data.validation import validation_blocks
from raycpt.decide import RateRow, extend_rates, finite_mean, rate_rows, record_path
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.jobs.base_row import general_probe, probe_files
from raycpt.jobs.grid import (SHARDS_CHECKED, Grid, ahead_of_trials, grid_params, heldout_blocks, model_layers,
                              no_shards, run_grid, warm_imports)
from raycpt.jobs.job import Options, RunSpec, Steps
from raycpt.jobs.run_inputs import run_datasets
from raycpt.jobs.sweep import BUDGET_SELECTORS, TrialSpec, budget_numbers, budget_rows, check_memory, trial_config
from raycpt.report.decide import DecideOutcome, decision_outcome, write_decision
from raycpt.runtime import ray_session, stop_ray_soon
from raycpt.splits import split_index
from raycpt.train.driver.prepare import model_skeleton


@dataclass(frozen=True)
class ArmSpec:
    """One arm: its recipe (dotted settings) and the rate its grid is centred on."""

    name: str
    recipe: dict
    lr: float


@dataclass
class DecidePlan:
    """What :func:`prepare` checked: the config, the model, the arms and the probes' blocks."""

    cfg: ExperimentConfig
    model_path: str
    num_layers: int
    arms: list[ArmSpec]
    steps: dict[float, int]
    """Each horizon's training steps."""
    heldout: Optional[list] = None
    validation: Optional[list] = None
    general: Optional[list] = None
    t0: float = field(default_factory=time.time)
    shards_ready: Callable[[], dict] = no_shards


def horizon_steps(base_steps: int, horizons) -> dict[float, int]:
    """``{h: round(base_steps x h)}``, each at least one step; two horizons with the same steps are one line."""
    steps = {float(h): max(1, int(round(base_steps * float(h)))) for h in horizons}
    if len(set(steps.values())) != len(steps):
        raise RaycptError(f"decide.horizons {list(horizons)}: two horizons train the same number of steps at "
                          f"train.max_steps={base_steps} ({steps}); give horizons further apart")
    return steps


def prepare(cfg: ExperimentConfig, options: Optional[Options] = None) -> DecidePlan:
    """Every check before any work: the model and its depth, the corpus, the arms (budget arms from the equal-budget
    rows), the memory of every arm's plan, the held-out, validation and general blocks."""
    options = options if options is not None else Options()
    t0, d, console = time.time(), cfg.decide, options.console
    model_path, num_layers = model_layers(cfg)
    check_corpora(cfg, model_path, options.located(cfg, check=False).root, quiet=console is None)
    steps = horizon_steps(cfg.train.max_steps, d.horizons)
    s = cfg.sweep
    if not s.heldout_docs:
        raise RaycptError("decide needs sweep.heldout_docs > 0: the long horizon's held-out loss is the truth the "
                          "short ranking is scored against")
    # the cheap checks first: the blocks, then the arms (the budget arms rank the layers: minutes on a CPU)
    heldout = heldout_blocks(cfg, model_path, s.heldout_docs, "sweep.heldout_docs", "sweep.heldout_docs")
    val = validation_blocks(cfg.data, model_path, s.validation_docs, s.heldout_docs)
    general = general_probe(cfg, model_path)
    arms = [ArmSpec(n, dict(r), float(r.get("train.lr", cfg.train.lr))) for n, r in d.arms.items()]
    check_memory(cfg, console, [arm_plan(cfg, a) for a in arms])
    if d.budget_arms:
        extra = budget_arms(cfg, model_path, num_layers, console)
        check_memory(cfg, console, [arm_plan(cfg, a) for a in extra])
        arms += extra
    return DecidePlan(cfg, model_path, num_layers, arms, steps, heldout, val, general, t0=t0)


def arm_plan(cfg: ExperimentConfig, arm: ArmSpec):
    """The plan an arm's trials train (as :func:`raycpt.jobs.sweep.trial_config` builds it)."""
    return trial_config(cfg, TrialSpec(arm.name, arm.recipe.get("plan.name", "full"), recipe=arm.recipe)).plan


def budget_arms(cfg: ExperimentConfig, model_path: str, num_layers: int, console=None) -> list[ArmSpec]:
    """The equal-budget rows named in ``decide.budget_arms`` (by prefix) at train_shallow's count at
    ``decide.budget_split`` (its first b layers)."""
    d = cfg.decide
    sizes = budget_numbers(model_skeleton(model_path), cfg.plan.lora_targets)["layer_params"]
    bcfg = config_with(cfg, {"sweep.budget": int(sum(sizes[:split_index(d.budget_split, num_layers)]))})
    if console is not None:
        console.print(f"decide: equal-budget arms {', '.join(d.budget_arms)} at train_shallow r={d.budget_split:g}'s "
                      f"count ({bcfg.sweep.budget:,} trainable): ranking the layers", markup=False)
    rows = budget_rows(bcfg, model_path, selectors=[p for p in d.budget_arms if p in BUDGET_SELECTORS])
    out = []
    for prefix in d.budget_arms:
        row = next((r for r in rows if r["name"] == prefix or r["name"].startswith(prefix + "-")), None)
        if row is None:
            raise RaycptError(f"decide.budget_arms: no equal-budget row named {prefix!r}; rows: "
                              + ", ".join(r["name"] for r in rows))
        out.append(ArmSpec(row["name"], dict(row["settings"]), float(row["settings"].get("train.lr", cfg.train.lr))))
        if console is not None:
            console.print(f"decide arm {row['name']}: {row['trainable']:,} trainable", markup=False)
    return out


def run_spec(plan: DecidePlan, options: Options) -> RunSpec:
    return RunSpec(plan.cfg, "decide", params=grid_params(
        [], {"arms": ",".join(a.name for a in plan.arms), "horizon_steps": ",".join(map(str, plan.steps.values())),
             "seeds": ",".join(map(str, plan.cfg.decide.seeds))}),
                   around=ahead_of_trials(plan, options.located(plan.cfg, check=False)))


def trial_spec(arm: ArmSpec, h: float, steps: int, mult: float, seed: int) -> TrialSpec:
    """One run: ``<arm>-h<h>-lr<m>-s<seed>``, its group ``<arm>-h<h>`` (the cell whose rate is searched)."""
    group = f"{arm.name}-h{h:g}"
    recipe = {**arm.recipe, "train.lr": arm.lr * float(mult), "train.max_steps": int(steps),
              "train.checkpoint_every": int(steps)}
    return TrialSpec(name=f"{group}-{lr_tag(mult)}-s{int(seed)}", strategy=str(arm.recipe.get("plan.name", "full")),
                     recipe=recipe, seed=int(seed), group=group, lr_mult=float(mult), base_name=f"{group}-s{int(seed)}")


def start_grid(lr_grid, previous_pick: Optional[float]) -> list[float]:
    """An arm's starting multipliers at a horizon: ``decide.lr_grid``, centred on its pick at the previous (shorter)
    horizon when there is one (the search then still goes on until its pick is interior: the start saves rounds, it
    does not decide the pick)."""
    centre = 1.0 if previous_pick is None else float(previous_pick)
    return sorted(float(f"{centre * float(m):.6g}") for m in lr_grid)


def search_rows(results: dict[str, dict], arms: list[ArmSpec], h: float, search_seeds: list[int],
                initial: dict) -> list[RateRow]:
    """Each arm's rates at horizon ``h`` so far: the mean validation loss over the search seeds per multiplier
    (``initial``: each arm's starting grid, the rates beyond it count as extensions)."""
    by: dict[str, dict[float, list]] = {f"{a.name}-h{h:g}": {} for a in arms}
    for r in results.values():
        if r.get("tune") in by and r.get("seed") in search_seeds:
            by[r["tune"]].setdefault(float(r["lr_mult"]), []).append(r.get("validation_loss"))
    return [rate_rows({f"{a.name}-h{h:g}": {m: finite_mean(v) for m, v in by[f"{a.name}-h{h:g}"].items()}},
                      initial[a.name])[0] for a in arms]


def execute(plan: DecidePlan, run, options: Options) -> DecideOutcome:
    """Per horizon: the search rounds, then the picks at the other seeds; then the measures and the report."""
    cfg, d, run_dir = plan.cfg, plan.cfg.decide, run.run_dir
    console, resume = options.console, options.resume
    shared = {"heldout_path": str(atomic_write_json(run_dir / "heldout_blocks.json", plan.heldout)),
              "validation_path": str(atomic_write_json(run_dir / "validation_blocks.json", plan.validation)),
              **probe_files(run_dir, plan.general), "model_path": plan.model_path}
    # the benchmarks once the trials evaluated them
    run.log_inputs(run_datasets(run.location.root, cfg, plan.model_path, shared, []))
    search, rest = list(d.seeds[:d.search_seeds]), list(d.seeds[d.search_seeds:])
    results: dict[str, dict] = {}
    rows: dict[float, list[RateRow]] = {}
    with ray_session(cfg.ray, meanwhile=warm_imports):
        checked = plan.shards_ready() or {}

        def grid(name: str, specs: list[TrialSpec]) -> None:
            if not specs:
                return
            g = Grid("decide", specs, shared={**shared, SHARDS_CHECKED: checked}, cpus=cfg.sweep.cpus_per_trial,
                     data_cpus=cfg.sweep.data_cpus_per_trial, resources=cfg.sweep.trial_resources,
                     max_concurrent=cfg.sweep.max_concurrent_trials, max_steps=max(s.recipe["train.max_steps"]
                                                                                   for s in specs),
                     model_path=plan.model_path, tune_name=name)
            results.update(run_grid(run, g, resume=resume, console=console))

        previous: dict[str, float] = {}
        for h, steps in plan.steps.items():
            start = {a.name: start_grid(d.lr_grid, previous.get(a.name)) for a in plan.arms}
            grid(f"tune-h{h:g}-r0", [trial_spec(a, h, steps, m, sd) for sd in search for a in plan.arms
                                     for m in start[a.name]])
            for k in range(1, d.max_extensions + 1):
                nxt = extend_rates(search_rows(results, plan.arms, h, search, start), d.lr_step, d.max_extensions)
                grid(f"tune-h{h:g}-r{k}", [trial_spec(a, h, steps, nxt[f"{a.name}-h{h:g}"], sd) for sd in search
                                           for a in plan.arms if f"{a.name}-h{h:g}" in nxt])
                if not nxt:
                    break
            rows[h] = search_rows(results, plan.arms, h, search, start)
            picks = {r.method: r.picked for r in rows[h]}
            previous = {a.name: picks[f"{a.name}-h{h:g}"] for a in plan.arms}
            missing = [g for g, p in picks.items() if p is None]
            if missing:
                raise RaycptError(f"decide: no finite validation loss at any rate for {', '.join(missing)}; "
                                  "nothing to pick (lower train.lr)")
            grid(f"tune-h{h:g}-seeds", [trial_spec(a, h, steps, picks[f"{a.name}-h{h:g}"], sd) for sd in rest
                                        for a in plan.arms])
        stop_ray_soon()
    run.log_inputs(run_datasets(run.location.root, cfg, plan.model_path, shared, list(results.values())))
    outcome = decision_outcome(results, rows, plan.arms and [a.name for a in plan.arms], plan.steps, cfg)
    short_steps = plan.steps[min(plan.steps)]
    write_decision(run, outcome, console, record_to=record_path(
        run.location.decisions, config_with(cfg, {"train.max_steps": short_steps}), short_steps))
    run.state(done=True)
    return dataclasses.replace(outcome, run_dir=run_dir, parent_run_id=run.run_id, wall_s=time.time() - plan.t0)


DECIDE = Steps(prepare, execute, run_spec)
