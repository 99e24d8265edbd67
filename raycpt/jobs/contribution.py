"""``raycpt contribution``: the single-layer training scan (seed 003) as a grid on :mod:`raycpt.jobs.grid`.

Trials (:class:`ScanTrial`): the untrained ``base`` (evaluated only), ``full`` (every layer trains) and
``single-LNN`` for every scanned layer (plan ``single``, ``plan.layer = NN``), all with the same data,
steps and hyper-parameters. A trained trial's training worker evaluates its final weights (on its GPU on a
cluster; :func:`raycpt.jobs.grid.train_and_evaluate`); the trial then measures the per-layer parameter
change against the base (``||W_l - W_l(base)||_F``) and keeps the per-question answers of the primary
benchmark cell.

The driver then computes (pure functions of :mod:`raycpt.diagnostics.contribution`):
``contribution(l) = (score_l - score_base) / (score_full - score_base)``, the ranking (written in the
``elite`` plan's format, :func:`raycpt.strategies.write_ranking`), how many layers exceed the threshold, the
means inside / outside the depth band, the L2 change of each layer trained alone vs under full training,
the Jaccard overlap of the questions the top-k single-layer models newly solve, the majority vote of the
top-k models vs the best single model and ``full``, and the Spearman correlation with another ranking.
Seed 003's two controls: the top-k vote against ``full`` answering k times by seeded sampling and voting
(``contribution.sampled_vote``, paired McNemar), and, with ``contribution.elite_lr_control``, a second grid
(Tune folder ``tune-elite``) of the elite-LR recipe on the scan's ranking and its bottom-k control.
Settings: the config's ``contribution`` section (:class:`raycpt.config.ContributionConfig`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from raycpt.config import ExperimentConfig, config_with
from raycpt.config.checks import lr_tag
from raycpt.diagnostics.contribution import (analyze_scan, answers_of, elite_lr_control, gold_prob_of, primary_score,
                                             spearman)
from raycpt.diagnostics.similarity import weight_change
from raycpt.errors import RaycptError
from raycpt.data.validation import validation_blocks
from raycpt.evaluate_prefetch import prefetch_hub_datasets
from raycpt.io import atomic_write_json
from raycpt.jobs.grid import (SHARDS_CHECKED, Grid, Trial, ahead_of_trials, grid_params, heldout_blocks, model_layers,
                              no_shards, run_grid, train_and_evaluate, warm_imports)
from raycpt.jobs.job import Options, RunSpec, Steps, run_job
from raycpt.jobs.sweep import validation_loss
from raycpt.models.shards import layer_l2_by_reference
from raycpt.models.sources import load_model
from raycpt.report.contribution import write_outputs
from raycpt.report.tuning import pick_by_validation, tuning_lines
from raycpt.runs.folder import read_state
from raycpt.runtime import ray_session, stop_ray_soon
from raycpt.strategies import ranked_pick, read_ranking, write_ranking
from raycpt.train.driver.final_eval import final_evaluation
from raycpt.train.driver.preflight import full_plan, preflight
from raycpt.train.worker.evaluation import EvalRequest


@dataclass(frozen=True)
class ScanTrial:
    """One trial of the scan: ``kind`` base (evaluated only), full, single (``layer`` trains alone), or, in the
    second grid of ``contribution.elite_lr_control``, elite_top / elite_bottom (:data:`ELITE`)."""

    name: str
    kind: str
    layer: Optional[int] = None
    lr_mult: Optional[float] = None
    """``contribution.lr_grid``: the multiplier of a ``full`` run of the tuned-learning-rate baseline's grid."""

    def run(self, trial: Trial) -> dict:
        """Train (unless base), evaluate and measure this trial under its child run."""
        run, base_path = trial.run, trial.shared["model_path"]
        if run.created or not run.run_id:
            run.log_params(scan_params(dataclasses.asdict(self)))
        tcfg, info = scan_trial_config(trial.cfg, self, trial.shared.get("ranking_file")), {}
        if self.kind == "base":
            model_dir = base_path
            req = EvalRequest(str(trial.dir / "eval"), self.name, trial.shared.get("heldout_path"))
            ev, heldout = final_evaluation(base_path, tcfg.eval, req, threads=trial.threads)
        else:
            tr, ev, heldout = train_and_evaluate(trial, tcfg, self.name)
            model_dir = str(tr.final_model_dir)
            info = {"trainable_params": int(tr.trainable_params), "train_wall_s": float(tr.wall_s),
                    "final_loss": float(tr.losses[-1]) if tr.losses else float("nan"),
                    "tokens_per_s": float(tr.tokens_per_s)}
        cells = ev.metrics()
        key, score = primary_score(cells, tcfg.eval)
        l2 = layer_l2(base_path, model_dir) if self.kind in ("full", "single") else None
        questions = ev.questions.get(tcfg.eval.tasks[0], [])
        result = {"name": self.name, "kind": self.kind, "layer": self.layer, "score": score, "score_key": key,
                  "gold_prob": gold_prob_of(questions), "heldout_loss": heldout, "cells": cells,
                  "answers": answers_of(questions, tcfg.eval.modes[0]), "l2": l2, "model_dir": model_dir,
                  "wall_s": trial.elapsed, "mlflow_run_id": run.run_id, **info,
                  **({"lr_mult": self.lr_mult, "lr": tcfg.train.lr, "tune": "full",
                      "validation_loss": validation_loss(trial)} if self.lr_mult is not None else {})}
        self._log(trial, result)
        if self.kind != "base" and not tcfg.contribution.keep_models:
            shutil.rmtree(trial.dir / "train" / "ray", ignore_errors=True)
            shutil.rmtree(model_dir, ignore_errors=True)
            result["model_dir"] = None
        return result

    @staticmethod
    def _log(trial: Trial, r: dict) -> None:
        _log_trial(trial, r)


def scan_params(spec: dict) -> dict:
    """A scan trial's own child-run parameters, from its spec (a :class:`ScanTrial` as a dict)."""
    return {"kind": spec["kind"], "layer": "" if spec.get("layer") is None else spec["layer"]}


def scan_trial_records(result: dict) -> tuple[dict, list[tuple[str, int, float]]]:
    """What a scan trial's child run gets at its end, from its ``result.json`` (``raycpt runs sync`` logs the same):
    ``(metrics, series)``: the benchmark cells, score, wall time, gold probability and held-out loss (NaN, so not
    logged, when absent); the series ``("l2_change", layer, value)`` of the per-layer parameter change."""
    nan = float("nan")
    metrics = {**result["cells"], "score": result["score"], "wall_time_s": result["wall_s"],
               "gold_prob": result["gold_prob"] or nan,
               "heldout_loss": nan if result["heldout_loss"] is None else result["heldout_loss"]}
    return metrics, [("l2_change", i, float(v)) for i, v in enumerate(result["l2"] or [])]


def _log_trial(trial: Trial, r: dict) -> None:
    metrics, series = scan_trial_records(r)
    trial.run.log_metrics(metrics)
    trial.run.log_points(series)


def scan_trials(layers: list[int]) -> list[ScanTrial]:
    """The grid: the untrained base, full, then one single-layer trial per scanned layer."""
    return [ScanTrial("base", "base"), ScanTrial("full", "full")] + [
        ScanTrial(f"single-L{i:02d}", "single", i) for i in layers]


ELITE = {"elite_top": "top", "elite_bottom": "bottom"}  # elite trial kind -> plan.elite_pick


def elite_trials() -> list[ScanTrial]:
    """The second grid of ``contribution.elite_lr_control``: the elite-LR recipe and its bottom-k control."""
    return [ScanTrial("elite-top", "elite_top"), ScanTrial("elite-bottom", "elite_bottom")]


def scan_plan(cfg: ExperimentConfig, num_layers: int) -> tuple[list[int], Optional[dict[int, float]]]:
    """The scanned layers and the ``against`` ranking's scores, checked against the model (one line each)."""
    c = cfg.contribution
    layers = c.layer_list(num_layers)
    if c.elite_lr_control and 2 * c.elite_k > len(layers):
        raise RaycptError(f"contribution.elite_k={c.elite_k}: the elite-LR control takes the top and the bottom "
                          f"{c.elite_k} layers, which needs 2 x {c.elite_k} = {2 * c.elite_k} scanned layers; "
                          f"the scan has {len(layers)} (lower elite_k or scan more layers)")
    if c.score == "gold_prob" and "logit" not in cfg.eval.modes:
        raise RaycptError("contribution.score=gold_prob needs the logit mode: add logit to eval.modes")
    if c.against is None:
        return layers, None
    doc = read_ranking(c.against, num_layers=num_layers)  # a ranking that does not fit the model: one line, now
    return layers, {r["layer"]: r["score"] for r in doc["ranking"] if r["score"] is not None}


def scan_trial_config(cfg: ExperimentConfig, spec: ScanTrial, ranking_file: Optional[str] = None) -> ExperimentConfig:
    """The config of one trial: the scan config with plan ``full``, ``single`` at the trial's layer, or (elite
    trials) plan ``elite`` on the scan's ``ranking_file``: every layer trains, the top / bottom
    ``contribution.elite_k`` at lr x ``contribution.elite_lr_scale``."""
    store = {"train.publish": "reference", "train.keep_finished_checkpoints": False}  # what it trained, no optimizer
    if spec.kind in ELITE:
        c = cfg.contribution
        plan = {"plan.name": "elite", "plan.ranking_file": ranking_file, "plan.k": c.elite_k,
                "plan.elite_pick": ELITE[spec.kind], "plan.elite_train_rest": True,
                "plan.elite_lr_scale": c.elite_lr_scale}
    else:
        plan = {"plan.name": "single", "plan.layer": spec.layer} if spec.kind == "single" else {"plan.name": "full"}
    if spec.lr_mult is not None:
        plan["train.lr"] = cfg.train.lr * spec.lr_mult
    return config_with(cfg, {**store, **plan})


def trial_score(trial: dict, metric: str, run_dir: Path, task: str) -> float:
    """The number a trial is judged by: its benchmark accuracy, minus its held-out loss, or its gold
    probability (read back from the trial's saved questions when the result predates the field)."""
    if metric == "accuracy":
        return float(trial["score"])
    if metric == "heldout_loss":
        if trial.get("heldout_loss") is None:
            raise RaycptError(f"trial {trial['name']}: no held-out loss (the scan ran with another contribution.score)")
        return -float(trial["heldout_loss"])
    if trial.get("gold_prob") is not None:
        return float(trial["gold_prob"])
    path = run_dir / "trials" / trial["name"] / "eval" / f"eval-{trial['name']}_questions.json"
    for res in json.loads(path.read_text()) if path.is_file() else []:
        g = gold_prob_of(res.get("questions", {}).get(task, []))
        if g is not None:
            return g
    raise RaycptError(f"trial {trial['name']}: no logit-mode records to compute contribution.score=gold_prob")


_BASE: dict = {}  # (base folder, config mtime) -> the base model layer_l2 compares against (read-only)


def layer_l2(base_path: str, model_path: str) -> list[float]:
    """``||W_l - W_l(base)||_F`` over all parameters of every decoder layer. A trial's published model that
    references the base shards is read by its files (only its trained tensors compared:
    :func:`raycpt.models.shards.layer_l2_by_reference`); any other folder loads both models."""
    from transformers import AutoConfig

    n = getattr(AutoConfig.from_pretrained(base_path), "num_hidden_layers", None)
    fast = layer_l2_by_reference(model_path, base_path, int(n)) if n else None
    if fast is not None:
        return fast

    key = (str(Path(base_path).resolve()), Path(base_path, "config.json").stat().st_mtime_ns)
    if key not in _BASE:  # once per trial process: a reused Tune actor scores every later trial against it
        _BASE.clear()
        _BASE[key] = load_model(base_path, dtype="float32", device="cpu")[0]
    a = _BASE[key]
    b, _ = load_model(model_path, dtype="float32", device="cpu")
    return [row["total"] for row in weight_change(a, b)]


def spearman_files(a: str, b: str) -> dict:
    """Spearman correlation between two ranking files (e.g. scans on two corpora)."""
    ra, rb = read_ranking(a), read_ranking(b)
    if ra.get("num_layers") and rb.get("num_layers") and ra["num_layers"] != rb["num_layers"]:
        raise RaycptError(f"ranking files are for different depths: {a} has {ra['num_layers']} layers, {b} has "
                          f"{rb['num_layers']}")
    sa = {r["layer"]: r["score"] for r in ra["ranking"] if r["score"] is not None}
    sb = {r["layer"]: r["score"] for r in rb["ranking"] if r["score"] is not None}
    rho, p = spearman(sa, sb)
    return {"rho": rho, "p_value": p, "layers": len(set(sa) & set(sb))}


# ------------------------------------------------------------------------------------- the driver
@dataclass
class ContributionResult:
    run_dir: Path
    analysis: dict
    trials: dict[str, dict]
    ranking_file: Path
    files: list[Path] = field(default_factory=list)
    wall_s: float = 0.0
    parent_run_id: Optional[str] = None
    num_layers: int = 0


@dataclass
class ContributionPlan:
    """What :func:`prepare` checked: the effective config, the model, the scanned layers, the held-out blocks; what
    waits for the base shards (:func:`raycpt.jobs.grid.ahead_of_trials`)."""

    cfg: ExperimentConfig
    model_path: str
    num_layers: int
    layers: list[int]
    against: Any
    heldout: Optional[list] = None
    shards_ready: Callable[[], dict] = no_shards


@dataclass(frozen=True)
class RankingPair:
    """``--spearman A.json,B.json``: only the Spearman correlation of two ranking files (no run, no training)."""

    a: str
    b: str


def prepare(cfg: ExperimentConfig, options: Options):
    """``--spearman``: the two ranking files (a :class:`RankingPair`); else the scan's :func:`prepare_scan`."""
    spearman_arg = options.get("spearman")
    if spearman_arg is None:
        return prepare_scan(cfg, options.console)
    files = [f.strip() for f in spearman_arg.split(",") if f.strip()]
    if len(files) != 2:
        raise RaycptError(f"--spearman {spearman_arg!r}: give exactly two ranking files, A.json,B.json")
    return RankingPair(*files)


def prepare_scan(cfg: ExperimentConfig, console=None) -> ContributionPlan:
    """Every check of a scan, with no Ray and no MLflow (before any run folder); the memory of ``full``."""
    c = cfg.contribution
    if c.against is not None:
        read_ranking(c.against)  # the user's file first (one line), before the model is resolved; its fit after
    model_path, n = model_layers(cfg)
    layers, against = scan_plan(cfg, n)
    preflight(cfg, console, [full_plan(cfg)])
    blocks = heldout_blocks(cfg, model_path, c.heldout_docs, "contribution.score=heldout_loss",
                            "contribution.heldout_docs") if c.score == "heldout_loss" else None
    prefetch_hub_datasets(cfg.eval, console=console)  # hub eval data once, on the driver; the trials read it offline
    return ContributionPlan(cfg, model_path, n, layers, against, blocks)


def run_spec(plan, options: Options) -> Optional[RunSpec]:
    """The scan's run (the grid's params; Ray and the base shards start while it opens); none for ``--spearman``."""
    if isinstance(plan, RankingPair):
        return None
    params = {"num_layers": plan.num_layers, "scan_layers": ",".join(map(str, plan.layers))[:500]}
    return RunSpec(plan.cfg, "contribution", params=grid_params(scan_trials(plan.layers), params),
                   around=ahead_of_trials(plan, options.located(plan.cfg, check=False)))


def execute(plan, run, options: Options):
    """``--spearman``: the correlation (a dict); else :func:`execute_scan`."""
    if isinstance(plan, RankingPair):
        return spearman_files(plan.a, plan.b)
    return execute_scan(plan, run, resume=options.resume, console=options.console, shards_checked=plan.shards_ready())


def execute_scan(plan: ContributionPlan, run, resume: bool = False, console=None,
                 shards_checked: Optional[dict] = None) -> ContributionResult:
    """The scan's grid, the analysis and its files (inside the command's :func:`raycpt.runs.run.command_run`).
    ``shards_checked``: the base shards the driver verified (:func:`raycpt.train.driver.publish.base_shards_ahead`)."""
    t0, cfg, run_dir = time.time(), plan.cfg, run.run_dir
    c, state = cfg.contribution, read_state(run_dir)
    shared = {"model_path": plan.model_path, "heldout_path": str(atomic_write_json(
        run_dir / "heldout_blocks.json", plan.heldout)) if plan.heldout else None,
              SHARDS_CHECKED: shards_checked or {}}
    grid = Grid("contribution", scan_trials(plan.layers), shared=shared, cpus=c.cpus_per_trial,
                data_cpus=c.data_cpus_per_trial, max_concurrent=c.max_concurrent_trials, max_steps=cfg.train.max_steps,
                model_path=plan.model_path)
    with ray_session(cfg.ray, meanwhile=warm_imports):
        # the tuned baseline first: the scan's trials (full, single layers, elite) then run at its rate
        tuning = _tune_lr(plan, run, shared, resume, console) if c.lr_grid else None
        trials = run_grid(run, grid, resume=resume, console=console)
        if not c.elite_lr_control:
            stop_ray_soon()  # the last grid ran: Ray shuts down while the analysis and the report are written
        analysis, trials, ranking_file = _analyze(cfg, run_dir, trials, plan.num_layers, plan.against)
        if tuning:
            analysis["lr_tuning"] = tuning
        if c.elite_lr_control:
            elite = Grid("contribution", elite_trials(), shared={**shared, "ranking_file": str(ranking_file)},
                         cpus=c.cpus_per_trial, data_cpus=c.data_cpus_per_trial, max_concurrent=c.max_concurrent_trials,
                         max_steps=cfg.train.max_steps, model_path=plan.model_path, tune_name="tune-elite")
            elite_results = run_grid(run, elite, resume=resume, console=console)
            stop_ray_soon()
            trials.update(_elite_control(cfg, run_dir, elite_results, trials, analysis, ranking_file))
    analysis["against_name"] = c.against
    files = [ranking_file] + write_outputs(run_dir, analysis, trials, plan.num_layers, c)
    wall = time.time() - t0 + float(state.get("wall_s", 0.0) if resume else 0.0)
    run.state(wall_s=wall)
    _log_scan(run, analysis, files, wall)
    run.state(done=True, wall_s=wall)
    return ContributionResult(run_dir=run_dir, analysis=analysis, trials=trials, ranking_file=ranking_file,
                              files=files, wall_s=wall, parent_run_id=run.run_id, num_layers=plan.num_layers)


def _tune_lr(plan: ContributionPlan, run, shared: dict, resume: bool, console) -> dict:
    """Seed 003's tuned-learning-rate baseline: ``full`` at ``train.lr`` x every ``contribution.lr_grid`` multiplier
    (Tune folder ``tune-lr``), the lowest validation loss picked (:func:`raycpt.report.tuning.pick_by_validation`);
    ``plan.cfg.train.lr`` becomes the picked rate. Returns the grid's table row."""
    cfg, c = plan.cfg, plan.cfg.contribution
    val = validation_blocks(cfg.data, plan.model_path, c.validation_docs,
                            c.heldout_docs if c.score == "heldout_loss" else 0)
    shared = {**shared, "validation_path": str(atomic_write_json(run.run_dir / "validation_blocks.json", val))}
    specs = [ScanTrial(f"full-{lr_tag(m)}", "full", lr_mult=float(m)) for m in c.lr_grid]
    grid = Grid("contribution", specs, shared=shared, cpus=c.cpus_per_trial, data_cpus=c.data_cpus_per_trial,
                max_concurrent=c.max_concurrent_trials, max_steps=cfg.train.max_steps, model_path=plan.model_path,
                tune_name="tune-lr")
    _, table = pick_by_validation(list(run_grid(run, grid, resume=resume, console=console).values()))
    row = table[0]
    if row["picked_lr"] is None:
        raise RaycptError("contribution.lr_grid: no full run of the grid has a finite validation loss")
    cfg.train.lr = float(row["picked_lr"])
    run.log_params({"tuned_lr/full": cfg.train.lr})
    if console is not None:
        console.print("\n".join(tuning_lines(table, f"{len(val)} validation blocks")), markup=False)
    return row


CONTRIBUTION = Steps(prepare, execute, run_spec)
"""``raycpt contribution``: the scan in its run, or with ``--spearman`` only the correlation (no run)."""


def run_contribution(cfg: ExperimentConfig, resume: bool = False, console=None) -> ContributionResult:
    """The ``raycpt contribution`` command (see the module docstring): :func:`prepare`, then :func:`execute`."""
    return run_job(CONTRIBUTION, cfg, Options(console=console, resume=resume))


def _analyze(cfg: ExperimentConfig, run_dir: Path, trials: dict[str, dict], n: int, against):
    """Scores -> contributions (with the sampled-vote control unless ``contribution.sampled_vote`` is off), the
    scored trials and the ranking file."""
    c, task = cfg.contribution, cfg.eval.tasks[0]
    scored = {k: {**t, "score": trial_score(t, c.score, run_dir, task)} for k, t in trials.items()}
    singles = {t["layer"]: t for t in scored.values() if t["kind"] == "single"}
    sample = {"temperature": c.sample_temperature, "seed": c.sample_seed} if c.sampled_vote else None
    a = analyze_scan(scored["base"], scored["full"], singles, n, tuple(c.band), c.threshold, c.top_k, against, sample)
    a["score_key"] = {"accuracy": trials["full"]["score_key"], "gold_prob": f"{task}/gold_prob/logit",
                      "heldout_loss": "-heldout_loss"}[c.score]
    ranking_file = write_ranking(run_dir / "ranking.json", model=cfg.model.ref, num_layers=n, scores=a["contribution"],
                                 metric="contribution",
                                 extra={"score_key": a["score_key"], "base_score": a["base_score"],
                                        "full_score": a["full_score"], "run_dir": str(run_dir),
                                        "scores": {str(k): v for k, v in a["scores"].items()}})
    return a, scored, ranking_file


def _elite_control(cfg: ExperimentConfig, run_dir: Path, results: dict[str, dict], scored: dict[str, dict],
                   a: dict, ranking_file: Path) -> dict[str, dict]:
    """The elite trials scored like the scan's, each with the layers it raised; ``a["elite_lr_control"]`` =
    :func:`raycpt.diagnostics.contribution.elite_lr_control` against ``full``."""
    c, rows = cfg.contribution, read_ranking(ranking_file)["ranking"]
    out = {k: {**t, "score": trial_score(t, c.score, run_dir, cfg.eval.tasks[0]),
               "elite_layers": ranked_pick(rows, c.elite_k, ELITE[t["kind"]], where=str(ranking_file))}
           for k, t in results.items()}
    a["elite_lr_control"] = {**elite_lr_control(scored["full"], out["elite-top"], out["elite-bottom"]),
                             "k": c.elite_k, "lr_scale": c.elite_lr_scale}
    return out


def scan_summary_records(a: dict, wall: float) -> tuple[dict, list[tuple[str, int, float]]]:
    """What the scan's parent run gets, from the analysis ``a`` (or its ``summary.json``, layers as strings) and
    the wall time: ``(metrics, series)``, the headline numbers and the controls as metrics, the series
    ``("contribution", layer, value)``."""
    summary = {k: a[k] for k in ("num_above", "band_mean", "outside_mean", "base_score", "full_score")}
    summary["wall_time_s"] = wall
    summary.update({f"vote.{k}": v for k, v in a.get("vote", {}).items() if isinstance(v, (int, float))})
    if "jaccard" in a:
        summary["jaccard.mean"] = a["jaccard"]["mean"]
    if "spearman" in a:
        summary.update({"spearman.rho": a["spearman"]["rho"], "spearman.p": a["spearman"]["p_value"]})
    for key in ("sampled_vote", "elite_lr_control"):
        summary.update(flat_metrics(a.get(key) or {}, key))
    return summary, [("contribution", int(layer), v) for layer, v in a["contribution"].items()]


def _log_scan(parent, a: dict, files: list[Path], wall: float) -> None:
    summary, series = scan_summary_records(a, wall)
    parent.log_points(series)
    parent.log_metrics(summary)
    for f in files:
        parent.log_artifact(f)


def flat_metrics(d: dict, prefix: str) -> dict[str, float]:
    """The numbers of a nested dict as MLflow metric names: ``prefix.key.sub`` (``-`` becomes ``_``; booleans,
    strings, lists and None left out)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        name = f"{prefix}.{k}".replace("-", "_")
        if isinstance(v, dict):
            out.update(flat_metrics(v, name))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out
