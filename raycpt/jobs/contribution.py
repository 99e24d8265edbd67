"""``raycpt contribution``: single-layer training scan (seed 003) as a Ray Tune grid.

Trials: the untrained ``base`` (evaluated only), ``full`` (every layer trains) and ``single-LNN`` for
every scanned layer (plan ``single``, ``plan.layer = NN``), all with the same data, steps and
hyper-parameters. Each trial trains with :func:`raycpt.train.launch.run_training` (inside the Tune
trial; its TorchTrainer asks for its own workers), evaluates the final model with
:func:`raycpt.evaluate.evaluate_model`, measures the per-layer parameter change against the base
(``||W_l - W_l(base)||_F``) and keeps the per-question answers of the primary benchmark cell.

The driver then computes (pure functions of :mod:`raycpt.diagnostics.contribution`):
``contribution(l) = (score_l - score_base) / (score_full - score_base)``, the ranking (written in the
``elite`` plan's format, :func:`raycpt.strategies.write_ranking`), how many layers exceed 1.0, the
means inside / outside the 40-60% depth band, the L2 change of each layer trained alone vs under
full training, the Jaccard overlap of the questions the top-k single-layer models newly solve, the
majority vote of the top-k models vs the best single model and ``full``, and the Spearman
correlation with another ranking (``contribution.against``).

Settings live in the config's free-form ``contribution`` section (see :data:`DEFAULTS`).
Resume (``--resume``): finished trials (``trials/<name>/result.json``) are never redone; Tune
restores unfinished ones; an interrupted trial's training resumes from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from raycpt.config import ExperimentConfig, config_from_dict, config_to_dict
from raycpt.errors import RaycptError
from raycpt.evaluate import lm_loss  # noqa: F401 - used by trials, re-exported
from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.runs import open_run_dir, read_state, write_state

DEFAULTS: dict[str, Any] = {
    "layers": "all",
    "band": [0.4, 0.6],
    "threshold": 1.0,
    "top_k": 7,
    "against": None,
    "keep_models": True,
    "score": "accuracy",
    "heldout_docs": 64,
}
"""``contribution`` section keys: ``layers`` (``all``, a list, or ``every:K`` = every K-th layer),
``band`` (relative-depth band marked in the plot), ``threshold`` (count layers above it), ``top_k``
(majority vote / Jaccard over the top-k single-layer models), ``against`` (a ranking file for the
Spearman correlation), ``keep_models`` (false = delete each trial's trained weights after it is
measured), ``score`` (``accuracy`` = the benchmark's overall accuracy in the first mode;
``gold_prob`` = the mean probability of the gold letter among A-D in logit mode, a continuous score
that moves with short training runs where accuracy on a few dozen questions does not;
``heldout_loss`` = minus the language-model loss on ``heldout_docs`` documents of ``data.corpus`` that
follow the first ``data.max_documents`` (never trained on): the continued pre-training objective
itself), ``heldout_docs`` (64)."""

SCORES = ("accuracy", "gold_prob", "heldout_loss")


@dataclass
class ScanSettings:
    layers: list[int]
    band: tuple[float, float]
    threshold: float
    top_k: int
    against: Optional[str]
    keep_models: bool
    score: str = "accuracy"
    heldout_docs: int = 64


def scan_settings(cfg: ExperimentConfig, num_layers: int) -> ScanSettings:
    """Validate the ``contribution`` section against the model depth (one line per mistake)."""
    raw = dict(cfg.contribution or {})
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise RaycptError(f"contribution.{unknown[0]}: unknown key; valid keys: {', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **raw}
    layers = s["layers"]
    if layers == "all" or layers is None:
        layers = list(range(num_layers))
    elif isinstance(layers, str) and layers.startswith("every:"):
        try:
            k = int(layers.split(":", 1)[1])
        except ValueError:
            k = 0
        if k < 1:
            raise RaycptError(f"contribution.layers={layers!r}: use every:K with an integer K >= 1")
        layers = list(range(0, num_layers, k))
    elif isinstance(layers, int) and not isinstance(layers, bool):
        layers = [layers]
    if not isinstance(layers, list) or not layers:
        raise RaycptError(f"contribution.layers={s['layers']!r}: use all, every:K or a list of layer indices")
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise RaycptError(f"contribution.layers: {i!r} is not a layer of this {num_layers}-layer model "
                              f"(0..{num_layers - 1})")
    band = s["band"]
    if (not isinstance(band, (list, tuple)) or len(band) != 2 or not all(isinstance(b, (int, float)) for b in band)
            or not 0 <= band[0] < band[1] <= 1):
        raise RaycptError(f"contribution.band={band!r}: two relative depths [lo, hi] with 0 <= lo < hi <= 1")
    top_k = s["top_k"]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise RaycptError(f"contribution.top_k={top_k!r}: an integer >= 1")
    thr = s["threshold"]
    if isinstance(thr, bool) or not isinstance(thr, (int, float)):
        raise RaycptError(f"contribution.threshold={thr!r}: a number (1.0 = as good as full training)")
    if s["score"] not in SCORES:
        raise RaycptError(f"contribution.score={s['score']!r}: one of {', '.join(SCORES)}")
    if s["score"] == "gold_prob" and "logit" not in cfg.eval.modes:
        raise RaycptError("contribution.score=gold_prob needs the logit mode: add logit to eval.modes")
    hd = s["heldout_docs"]
    if isinstance(hd, bool) or not isinstance(hd, int) or hd < 1:
        raise RaycptError(f"contribution.heldout_docs={hd!r}: an integer >= 1")
    if s["score"] == "heldout_loss" and cfg.data.max_documents is None:
        raise RaycptError("contribution.score=heldout_loss needs data.max_documents: the held-out documents are "
                          "the ones after the first data.max_documents, which training never reads")
    against = s["against"]
    if against is not None:
        from raycpt.strategies import read_ranking

        read_ranking(against, num_layers=num_layers)  # a ranking that does not fit the model: one line, now
    return ScanSettings(layers=sorted(set(layers)), band=(float(band[0]), float(band[1])), threshold=float(thr),
                        top_k=top_k, against=against, keep_models=bool(s["keep_models"]),
                        score=s["score"], heldout_docs=hd)


def trial_names(settings: ScanSettings) -> list[dict]:
    """The grid: the untrained base, full, then one single-layer trial per scanned layer."""
    out = [{"name": "base", "kind": "base", "layer": None}, {"name": "full", "kind": "full", "layer": None}]
    out += [{"name": f"single-L{l:02d}", "kind": "single", "layer": l} for l in settings.layers]
    return out


def scan_trial_config(cfg: ExperimentConfig, spec: dict) -> ExperimentConfig:
    """The config of one trial: the scan config with plan ``full`` or ``single`` at the trial's layer."""
    from raycpt.config import apply_overrides

    data = config_to_dict(cfg)
    over = ["plan.name=full"] if spec["kind"] in ("full", "base") else ["plan.name=single", f"plan.layer={spec['layer']}"]
    apply_overrides(data, over)
    return config_from_dict(data)


# ------------------------------------------------------------------------------------- one trial
def answers_of(ev, eval_cfg) -> dict[str, dict]:
    """Per-question ``{pred, gold, correct}`` of the first task in the first mode of an EvalResult."""
    task, mode = eval_cfg.tasks[0], eval_cfg.modes[0]
    out = {}
    for q in ev.questions.get(task, []):
        rec = q.get(mode)
        if not rec:
            continue
        pred = rec.get("prediction") if mode == "logit" else rec.get("extracted")
        out[str(q["id"])] = {"pred": pred, "gold": q.get("gold"), "correct": bool(rec.get("correct"))}
    return out


def gold_prob_of(questions: list[dict]) -> Optional[float]:
    """Mean probability (percent) of the gold letter among A-D in logit mode; None without logit records."""
    from raycpt.diagnostics.contribution import gold_probability

    letters = "ABCD"
    vals = [gold_probability(q["logit"]["logprobs"], letters.index(q["gold"])) for q in questions
            if q.get("logit") and q["logit"].get("logprobs") and q.get("gold") in letters]
    return 100.0 * sum(vals) / len(vals) if vals else None


def trial_score(trial: dict, metric: str, run_dir: Path, task: str) -> float:
    """The number a trial is judged by: its benchmark accuracy, or its gold probability (read back from
    the trial's saved questions when the result predates the field)."""
    if metric == "accuracy":
        return float(trial["score"])
    if metric == "heldout_loss":
        if trial.get("heldout_loss") is None:
            raise RaycptError(f"trial {trial['name']}: no held-out loss (the scan ran with another contribution.score)")
        return -float(trial["heldout_loss"])
    if trial.get("gold_prob") is not None:
        return float(trial["gold_prob"])
    path = run_dir / "trials" / trial["name"] / "eval" / f"eval-{trial['name']}_questions.json"
    if path.is_file():
        for res in json.loads(path.read_text()):
            g = gold_prob_of(res.get("questions", {}).get(task, []))
            if g is not None:
                return g
    raise RaycptError(f"trial {trial['name']}: no logit-mode records to compute contribution.score=gold_prob")


def heldout_blocks(cfg: ExperimentConfig, model_path: str, num_docs: int) -> list[list[int]]:
    """The held-out documents (after the first ``data.max_documents``), packed like the training data."""
    from raycpt.data.corpus import heldout_blocks as _heldout

    return _heldout(cfg.data, model_path, num_docs, setting="contribution.score=heldout_loss",
                    raise_key="contribution.heldout_docs")


def layer_l2(base_path: str, model_path: str) -> list[float]:
    """``||W_l - W_l(base)||_F`` over all parameters of every decoder layer."""
    from raycpt.diagnostics.similarity import weight_change
    from raycpt.models.sources import load_model

    a, _ = load_model(base_path, dtype="float32", device="cpu")
    b, _ = load_model(model_path, dtype="float32", device="cpu")
    return [row["total"] for row in weight_change(a, b)]


def run_scan_trial(config: dict) -> dict:
    """Train (unless base), evaluate and measure one trial; runs inside a Tune trial, callable directly."""
    from mlflow.tracking import MlflowClient

    from raycpt.tracking import ChildRun, ensure_store

    cfg = config_from_dict(config["cfg"])
    spec = config["spec"]
    run_dir = Path(config["run_dir"])
    tdir = run_dir / "trials" / spec["name"]
    tdir.mkdir(parents=True, exist_ok=True)
    result_path = tdir / "result.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    exp_id = ensure_store(cfg.tracking)
    with ChildRun(MlflowClient(), tdir / "trial.json", exp_id, config["parent_run_id"], spec["name"],
                  tags={"raycpt.command": "contribution", "raycpt.trial": spec["name"]}, meta={"spec": spec}) as run:
        if run.created:
            run.client.log_param(run.run_id, "kind", spec["kind"])
            run.client.log_param(run.run_id, "layer", "" if spec["layer"] is None else spec["layer"])
        return _scan_trial_body(config, cfg, spec, tdir, run)


def _scan_trial_body(config: dict, cfg: ExperimentConfig, spec: dict, tdir: Path, run) -> dict:
    """One scan trial inside its :class:`~raycpt.tracking.ChildRun`: train, evaluate, measure, record."""
    import mlflow

    from raycpt.evaluate import evaluate_model
    from raycpt.jobs.compare import primary_score
    from raycpt.tracking import log_metrics

    run_id = run.run_id
    result_path = tdir / "result.json"
    tcfg = scan_trial_config(cfg, spec)
    base_path = config["model_path"]
    train_info: dict[str, Any] = {}
    ev, heldout = None, None
    heldout_path = None
    if config.get("heldout_blocks"):
        heldout_path = str(atomic_write_json(tdir / "heldout_blocks.json", config["heldout_blocks"]))
    if spec["kind"] == "base":
        model_dir = base_path
    else:
        from raycpt.train.launch import final_evaluation, run_training

        train_dir = tdir / "train"
        # the training worker evaluates its final weights (on its GPU on a cluster), held-out loss included
        tr = run_training(tcfg, run_dir=train_dir, resume=(train_dir / "state.json").exists(),
                          parent_run_id=config["parent_run_id"], mlflow_run_id=run_id, name=spec["name"],
                          evaluate={"eval": dataclasses.asdict(tcfg.eval), "out_dir": str(tdir / "eval"),
                                    "name": spec["name"], "heldout_path": heldout_path})
        model_dir = str(tr.final_model_dir)
        train_info = {"trainable_params": int(tr.trainable_params), "final_loss":
                      float(tr.losses[-1]) if tr.losses else float("nan"), "train_wall_s": float(tr.wall_s),
                      "tokens_per_s": float(tr.tokens_per_s)}
        ev, heldout = final_evaluation(model_dir, tcfg.eval, tdir / "eval", spec["name"],
                                       heldout_blocks=config.get("heldout_blocks"))
    if ev is None:  # the base model: evaluated here
        ev = evaluate_model(model_dir, tcfg.eval, out_dir=tdir / "eval", name=spec["name"])
        if config.get("heldout_blocks"):
            from raycpt.models.sources import load_model

            m, _ = load_model(model_dir, dtype="float32", device="cpu")
            heldout = lm_loss(m, config["heldout_blocks"])
            del m
    cells = ev.metrics()
    key, score = primary_score(cells, tcfg.eval)
    l2 = layer_l2(base_path, model_dir) if spec["kind"] != "base" else None
    gp = gold_prob_of(ev.questions.get(tcfg.eval.tasks[0], []))
    result = {**spec, "score": score, "score_key": key, "gold_prob": gp, "heldout_loss": heldout, "cells": cells,
              "answers": answers_of(ev, tcfg.eval),
              "l2": l2, "model_dir": model_dir, "wall_s": run.elapsed,
              "mlflow_run_id": run_id, **train_info}
    mlflow.set_tracking_uri(cfg.tracking.uri)
    with mlflow.start_run(run_id=run_id):
        log_metrics({**cells, "score": score, "wall_time_s": result["wall_s"], "gold_prob": gp or float("nan"),
                     "heldout_loss": heldout if heldout is not None else float("nan")})
        if l2:
            for i, v in enumerate(l2):
                log_metrics({"l2_change": v}, step=i)
    if spec["kind"] != "base" and not config.get("keep_models", True):
        shutil.rmtree(tdir / "train" / "ray", ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)
        result["model_dir"] = None
    atomic_write_json(result_path, result)
    return result


def _tune_trainable(config: dict) -> None:
    import tempfile

    from ray import tune

    r = run_scan_trial(config)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "done.json").write_text(json.dumps({"name": r["name"], "score": r["score"]}))
        tune.report({"score": r["score"], "done": 1}, checkpoint=tune.Checkpoint.from_directory(d))


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


def model_info(cfg: ExperimentConfig) -> tuple[str, int]:
    """(resolved model folder, number of decoder layers) from the config (no weights loaded)."""
    from transformers import AutoConfig

    from raycpt.train.launch import resolve_model_path

    path = resolve_model_path(cfg)
    conf = AutoConfig.from_pretrained(path)
    n = int(getattr(conf, "num_hidden_layers", 0) or 0)
    if n < 1:
        raise RaycptError(f"model {cfg.model.ref}: cannot read its number of decoder layers")
    return path, n


def spearman_files(a: str, b: str) -> dict:
    """Spearman correlation between two ranking files (e.g. scans on two corpora)."""
    from raycpt.diagnostics.contribution import spearman
    from raycpt.strategies import read_ranking

    ra, rb = read_ranking(a), read_ranking(b)
    if ra.get("num_layers") and rb.get("num_layers") and ra["num_layers"] != rb["num_layers"]:
        raise RaycptError(f"ranking files are for different depths: {a} has {ra['num_layers']} layers, {b} has "
                          f"{rb['num_layers']}")
    sa = {r["layer"]: r["score"] for r in ra["ranking"] if r["score"] is not None}
    sb = {r["layer"]: r["score"] for r in rb["ranking"] if r["score"] is not None}
    rho, p = spearman(sa, sb)
    return {"rho": rho, "p_value": p, "layers": len(set(sa) & set(sb))}


def run_contribution(cfg: ExperimentConfig, resume: bool = False, console=None) -> ContributionResult:
    """The ``raycpt contribution`` command (see the module docstring)."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from ray import tune

    from raycpt.cluster import preflight, version_tags
    from raycpt.diagnostics.contribution import analyze_scan
    from raycpt.runtime import ray_session
    from raycpt.strategies import read_ranking, write_ranking
    from raycpt.tracking import ensure_store, log_config

    t0 = time.time()
    parent_status = None
    model_path, n = model_info(cfg)
    settings = scan_settings(cfg, n)  # all checks before any run folder / Ray / MLflow
    against = None
    if settings.against:
        doc = read_ranking(settings.against, num_layers=n)
        against = {r["layer"]: r["score"] for r in doc["ranking"] if r["score"] is not None}
    specs = trial_names(settings)
    blocks = heldout_blocks(cfg, model_path, settings.heldout_docs) if settings.score == "heldout_loss" else None
    run_dir = open_run_dir(cfg, "contribution", resume=resume)
    state = read_state(run_dir)
    exp_id = ensure_store(cfg.tracking)
    client = MlflowClient()
    if state.get("parent_run_id"):
        parent_id = state["parent_run_id"]
        client.update_run(parent_id, status="RUNNING")
    else:
        parent_id = client.create_run(exp_id, run_name=run_dir.name, tags={
            "raycpt.command": "contribution", "raycpt.run_dir": str(run_dir), **version_tags()}).info.run_id
        write_state(run_dir, parent_run_id=parent_id, trials=[s["name"] for s in specs])
        mlflow.set_tracking_uri(cfg.tracking.uri)
        with mlflow.start_run(run_id=parent_id):
            log_config(cfg)
            mlflow.log_params({"num_layers": n, "scan_layers": ",".join(map(str, settings.layers))[:500]})
        client.update_run(parent_id, status="RUNNING")
    try:
        with ray_session(cfg.ray):
            preflight(cfg, cfg.sweep.max_concurrent_trials)  # shared storage on every node; SQLite warning
            # like the sweep: one bundle for the trial driver, one for the Ray Data tasks it launches
            bundles = [{"CPU": cfg.sweep.cpus_per_trial, **cfg.sweep.trial_resources}]
            data_cpus = float(getattr(cfg.sweep, "data_cpus_per_trial", 0.0) or 0.0)
            if data_cpus > 0:  # Ray Data tasks also ask for a little memory: the bundle must hold some
                bundles.append({"CPU": data_cpus, "memory": 1 << 30})
            trainable = tune.with_resources(_tune_trainable, tune.PlacementGroupFactory(bundles))
            tune_path = run_dir / "tune"
            if resume and tune_path.exists() and tune.Tuner.can_restore(str(tune_path)):
                tuner = tune.Tuner.restore(str(tune_path), trainable=trainable, resume_unfinished=True,
                                           resume_errored=True)
            else:
                space = {"spec": tune.grid_search(specs), "cfg": config_to_dict(cfg), "run_dir": str(run_dir),
                         "parent_run_id": parent_id, "model_path": model_path,
                         "keep_models": settings.keep_models, "heldout_blocks": blocks}
                tuner = tune.Tuner(
                    trainable, param_space=space,
                    tune_config=tune.TuneConfig(max_concurrent_trials=cfg.sweep.max_concurrent_trials,
                                                trial_dirname_creator=lambda t: t.config["spec"]["name"],
                                                trial_name_creator=lambda t: t.config["spec"]["name"]),
                    run_config=tune.RunConfig(name="tune", storage_path=str(run_dir), verbose=0,
                                              failure_config=tune.FailureConfig(max_failures=1)))
            if console is not None:
                console.print(f"contribution: {len(specs)} trials (base, full, {len(settings.layers)} single layers "
                              f"of {n}) -> {run_dir}")
            _fit_with_progress(tuner, run_dir, [s["name"] for s in specs], console)
        trials, missing = {}, []
        for s in specs:
            p = run_dir / "trials" / s["name"] / "result.json"
            if p.is_file():
                trials[s["name"]] = json.loads(p.read_text())
            else:
                missing.append(s["name"])
        if missing:
            from raycpt.jobs.sweep import _trial_errors

            errs = _trial_errors(run_dir)
            _end_unfinished(client, run_dir, missing)
            parent_status = "FAILED" if errs else "KILLED"  # no trial error: Tune was interrupted
            raise RaycptError(f"contribution scan incomplete: {', '.join(missing)} did not finish"
                              + (f" ({errs})" if errs else "") + f"; continue with --resume ({run_dir})")
        task = cfg.eval.tasks[0]
        scored = {k: {**t, "score": trial_score(t, settings.score, run_dir, task)} for k, t in trials.items()}
        singles = {t["layer"]: t for t in scored.values() if t["kind"] == "single"}
        analysis = analyze_scan(scored["base"], scored["full"], singles, n, settings.band, settings.threshold,
                                settings.top_k, against)
        score_key = {"accuracy": trials["full"]["score_key"], "gold_prob": f"{task}/gold_prob/logit",
                     "heldout_loss": "-heldout_loss"}[settings.score]
        analysis["score_key"] = score_key
        trials = scored
        ranking_file = write_ranking(run_dir / "ranking.json", model=cfg.model.ref, num_layers=n,
                                     scores=analysis["contribution"], metric="contribution",
                                     extra={"score_key": score_key,
                                            "base_score": analysis["base_score"],
                                            "full_score": analysis["full_score"],
                                            "scores": {str(k): v for k, v in analysis["scores"].items()},
                                            "run_dir": str(run_dir)})
        files = [ranking_file] + write_outputs(run_dir, analysis, trials, n, settings)
        wall = time.time() - t0 + float(state.get("wall_s", 0.0) if resume else 0.0)
        mlflow.set_tracking_uri(cfg.tracking.uri)
        with mlflow.start_run(run_id=parent_id):
            from raycpt.tracking import log_metrics

            for l, c in analysis["contribution"].items():
                log_metrics({"contribution": c}, step=l)
            summary = {"num_above": analysis["num_above"], "band_mean": analysis["band_mean"],
                       "outside_mean": analysis["outside_mean"], "base_score": analysis["base_score"],
                       "full_score": analysis["full_score"], "wall_time_s": wall}
            if "vote" in analysis:
                summary.update({f"vote.{k}": v for k, v in analysis["vote"].items() if isinstance(v, (int, float))})
            if "jaccard" in analysis:
                summary["jaccard.mean"] = analysis["jaccard"]["mean"]
            if "spearman" in analysis:
                summary.update({"spearman.rho": analysis["spearman"]["rho"],
                                "spearman.p": analysis["spearman"]["p_value"]})
            log_metrics(summary)
            for f in files:
                mlflow.log_artifact(str(f))
        write_state(run_dir, done=True, wall_s=wall)
        client.set_terminated(parent_id, status="FINISHED")
        return ContributionResult(run_dir=run_dir, analysis=analysis, trials=trials, ranking_file=ranking_file,
                                  files=files, wall_s=wall, parent_run_id=parent_id, num_layers=n)
    except KeyboardInterrupt:
        _end_unfinished(client, run_dir, [s["name"] for s in specs])
        client.set_terminated(parent_id, status="KILLED")
        raise
    except BaseException:
        client.set_terminated(parent_id, status=parent_status or "FAILED")
        raise


def _end_unfinished(client, run_dir: Path, names: list[str]) -> None:
    """Trials whose actor was stopped (Ctrl-C, Tune shutdown) cannot end their own MLflow run: end it KILLED."""
    for name in names:
        tdir = run_dir / "trials" / name
        if (tdir / "result.json").is_file() or not (tdir / "trial.json").is_file():
            continue
        try:
            run_id = json.loads((tdir / "trial.json").read_text()).get("mlflow_run_id")
            if run_id and client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status="KILLED")
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _fit_with_progress(tuner, run_dir: Path, names: list[str], console) -> None:
    """``tuner.fit()`` with a progress bar that counts finished trials (their result.json files)."""
    import threading

    from rich.progress import Progress

    stop = threading.Event()
    with Progress(console=console, transient=True, disable=console is None) as bar:
        task = bar.add_task("contribution trials", total=len(names))

        def poll():
            while not stop.wait(2.0):
                done = sum((run_dir / "trials" / n / "result.json").is_file() for n in names)
                bar.update(task, completed=done)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        try:
            tuner.fit()
        finally:
            stop.set()
            th.join()


def write_outputs(run_dir: Path, a: dict, trials: dict[str, dict], n: int, s: ScanSettings) -> list[Path]:
    """contribution.csv / .md, plots (contribution vs depth with the band, L2 change), summary.json."""
    from raycpt.diagnostics.contribution import in_band, relative_depth
    from raycpt.report.compare import markdown_table, plot_contribution, plot_l2_change, write_csv

    rows = []
    rank_of = {l: i + 1 for i, l in enumerate(a["ranking"])}
    for l in sorted(a["contribution"]):
        t = trials[f"single-L{l:02d}"]
        rows.append({"layer": l, "depth": round(relative_depth(l, n), 4), "in_band": in_band(l, n, s.band),
                     "score": t["score"], "contribution": a["contribution"][l], "rank": rank_of[l],
                     "l2_single": a["l2_single"].get(l, float("nan")), "l2_full": a["l2_full"].get(l, float("nan")),
                     "final_loss": t.get("final_loss", float("nan")), "wall_s": round(t.get("wall_s", 0.0), 1)})
    files = [write_csv(rows, run_dir / "contribution.csv")]
    key = a.get("score_key", trials["full"]["score_key"])
    lines = [f"# Layer contribution ({key})", "",
             f"base {a['base_score']:.2f}, full {a['full_score']:.2f}; {a['num_above']} of {len(rows)} scanned "
             f"layers above {s.threshold:g}; mean contribution in the {s.band[0]:.0%}-{s.band[1]:.0%} band "
             f"{a['band_mean']:.3f}, outside {a['outside_mean']:.3f}; ranking (best first): "
             f"{', '.join(map(str, a['ranking']))}", ""]
    lines.append(markdown_table(rows))
    if "vote" in a:
        v = a["vote"]
        lines += ["", f"## Majority vote of the top-{v['k']} single-layer models (layers {v['models']})", "",
                  f"vote {v['vote_acc']:.2f} vs best single (layer {v['best_single_layer']}) "
                  f"{v['best_single_acc']:.2f} vs full {v['full_acc']:.2f} vs base {v['base_acc']:.2f} "
                  f"on {v['num_questions']} questions"]
    if "jaccard" in a:
        j = a["jaccard"]
        lines += ["", "## Newly solved questions (vs base) of the top-k models", "",
                  f"mean pairwise Jaccard {j['mean']:.3f}; newly solved per layer {j['newly_solved']}"]
        if j["pairs"]:
            files.append(write_csv(j["pairs"], run_dir / "jaccard.csv"))
    if "spearman" in a:
        sp = a["spearman"]
        lines += ["", f"## Spearman vs {s.against}", "",
                  f"rho {sp['rho']:.3f}, p {sp['p_value']:.3g} over {sp['layers']} layers"]
    files.append(atomic_write_text(run_dir / "contribution.md", "\n".join(lines) + "\n"))
    files.append(plot_contribution(a["contribution"], n, run_dir / "plots" / "contribution.png", s.band,
                                   title=f"contribution ({key}); {a['num_above']} layer(s) > {s.threshold:g}"))
    if a["l2_single"]:
        files.append(plot_l2_change(a["l2_single"], a["l2_full"], n, run_dir / "plots" / "l2_change.png"))
    summary = {k: v for k, v in a.items()}
    summary["contribution"] = {str(k): v for k, v in a["contribution"].items()}
    summary["scores"] = {str(k): v for k, v in a["scores"].items()}
    summary["l2_single"] = {str(k): v for k, v in a["l2_single"].items()}
    summary["l2_full"] = {str(k): v for k, v in a["l2_full"].items()}
    if "jaccard" in summary:
        summary["jaccard"] = {**a["jaccard"], "newly_solved": {str(k): v for k, v in a["jaccard"]["newly_solved"].items()}}
    summary["trials"] = {k: {kk: vv for kk, vv in t.items() if kk not in ("answers", "cells")}
                         for k, t in trials.items()}
    files.append(atomic_write_json(run_dir / "summary.json", summary))
    return files
