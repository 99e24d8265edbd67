"""The small commands of the CLI table that run no experiment (each a :class:`raycpt.jobs.job.NoRun`): ``config
show``, ``config validate``, ``models list``, ``models pull`` and ``ui``. Each takes the config and the options and
returns what its renderer prints. Light on purpose: ``config validate`` loads this module, and no torch, Ray or
MLflow (``data prepare`` / ``data info`` are :mod:`raycpt.jobs.data`, ``plan show`` is :mod:`raycpt.jobs.train`)."""

from __future__ import annotations

import dataclasses

import typer
import yaml

from raycpt.config import ExperimentConfig
from raycpt.jobs.job import NoRun, Options
from raycpt.models.sources import list_models as cached_models
from raycpt.models.sources import resolve_model_info
from raycpt.runs.store import ensure_store, runs_url
from raycpt.ui import check_port_free
from raycpt.ui import serve_ui as serve


def list_models(cfg: ExperimentConfig, options: Options) -> list[dict]:
    """``models list [--cache-dir DIR]``: the models in the cache."""
    return cached_models(options.get("cache_dir") or cfg.model.cache_dir)


def config_yaml(cfg: ExperimentConfig, options: Options) -> str:
    """The resolved config as YAML (``config show``)."""
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False, allow_unicode=True, width=10**6)


def validate(cfg: ExperimentConfig, options: Options) -> str:
    """``config validate``: the config loaded (else one line), so it is valid."""
    return f"ok: {options.config_path or '<built-in default>'} is valid\n"


def pull_model(cfg: ExperimentConfig, options: Options) -> str:
    """``models pull REF``: resolve REF (default ``model.ref``) into the cache; one copyable line."""
    mcfg = dataclasses.replace(cfg.model, cache_dir=options.get("cache_dir") or cfg.model.cache_dir)
    rest = options.rest
    info = resolve_model_info(mcfg, rest[0] if rest else None, force=bool(options.get("force")), progress=True)
    return f"{info.ref} -> {info.path}  ({'cache hit' if info.cached else 'pulled'}, {info.seconds:.1f}s)"


def serve_ui(cfg: ExperimentConfig, options: Options) -> None:
    """``raycpt ui``: the MLflow UI on the run root's store, bound to 127.0.0.1 (until Ctrl-C)."""
    port = options.get("port", 5000)
    check_port_free(port)
    where = options.located(cfg)
    exp_id, uri = ensure_store(where), where.uri
    options.console.print(f"MLflow UI for {uri}: runs of experiment {cfg.tracking.experiment!r} at "
                          f"{runs_url(exp_id, port=port)}  (Ctrl-C to stop)", markup=False, highlight=False,
                          soft_wrap=True)
    raise typer.Exit(serve(uri, port))


CONFIG_SHOW = NoRun(config_yaml)
CONFIG_VALIDATE = NoRun(validate)
MODELS_LIST = NoRun(list_models)
MODELS_PULL = NoRun(pull_model)
UI = NoRun(serve_ui)
