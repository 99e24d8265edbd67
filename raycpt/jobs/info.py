"""The small commands of the CLI table that run no experiment: ``plan show``, ``models list``, ``data prepare``
and ``data info``. Each takes the config (and its options) and returns what its renderer prints."""

from __future__ import annotations

from typing import Optional

from raycpt.config import ExperimentConfig


def show_plan(cfg: ExperimentConfig, console=None):
    """``(title, plan table)`` of ``cfg.plan`` on ``cfg.model`` (no training); the memory estimate is printed."""
    from raycpt.strategies import plan_table
    from raycpt.train.prepare import prepare_plan, resolve_model_path
    from raycpt.train.preflight import preflight

    path = resolve_model_path(cfg)
    plan, _counts, skeleton = prepare_plan(cfg, path)
    tab = plan_table(skeleton, plan)
    preflight(cfg, console)
    return f"plan {plan.name} on {cfg.model.ref}", tab


def list_models(cfg: ExperimentConfig, cache_dir: Optional[str] = None) -> list[dict]:
    from raycpt.models.sources import list_models as listed

    return listed(cache_dir or cfg.model.cache_dir)


def prepare_store(cfg: ExperimentConfig, rebuild: bool = False) -> None:
    """Pack ``cfg.data.corpus`` once (any non-empty store is a valid pack: whether it is big enough is a
    training run's check). Ray Data tasks on a cluster; on one machine a local process pool."""
    import contextlib

    from raycpt.data.corpus import check_corpus
    from raycpt.data.pack import find_packed
    from raycpt.runtime import cluster_address, ray_session
    from raycpt.tracking import run_root
    from raycpt.data.run_store import pack_corpus
    from raycpt.train.prepare import resolve_model_path

    model_path = resolve_model_path(cfg)
    hit = not rebuild and find_packed(cfg.data, model_path, run_root(cfg.tracking)) is not None
    if not hit:
        check_corpus(cfg.data)  # bad files are one line before Ray starts
    with contextlib.nullcontext() if hit or not cluster_address(cfg.ray) else ray_session(cfg.ray):
        pack_corpus(cfg, model_path, quiet=False, rebuild=rebuild)  # prints its one line


def store_info(cfg: ExperimentConfig):
    """``(store folder, stores)`` under the config's store folder (data.store_dir or <run_root>/packed)."""
    from raycpt.data.store import list_stores, store_root
    from raycpt.tracking import run_root

    root = store_root(cfg.data, run_root(cfg.tracking))
    return root, list_stores(root)


def config_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (``config show``)."""
    import dataclasses

    import yaml

    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False, allow_unicode=True, width=10**6)


def validate(cfg: ExperimentConfig, config_path: Optional[str] = None) -> str:
    """``config validate``: the config loaded (else one line), so it is valid."""
    return f"ok: {config_path or '<built-in default>'} is valid\n"


def pull_model(cfg: ExperimentConfig, rest=(), cache_dir: Optional[str] = None, force: bool = False) -> str:
    """``models pull REF``: resolve REF (default ``model.ref``) into the cache; one copyable line."""
    import dataclasses

    from raycpt.models.sources import resolve_model_info

    mcfg = dataclasses.replace(cfg.model, cache_dir=cache_dir or cfg.model.cache_dir)
    info = resolve_model_info(mcfg, rest[0] if rest else None, force=force, progress=True)
    return f"{info.ref} -> {info.path}  ({'cache hit' if info.cached else 'pulled'}, {info.seconds:.1f}s)"


def serve_ui(cfg: ExperimentConfig, port: int = 5000, console=None) -> None:
    """``raycpt ui``: the MLflow UI on the run root's store, bound to 127.0.0.1 (until Ctrl-C)."""
    import typer

    from raycpt.tracking import ensure_store, runs_url, tracking_uri
    from raycpt.ui import check_port_free
    from raycpt.ui import serve_ui as serve

    check_port_free(port)
    exp_id = ensure_store(cfg.tracking)
    uri = tracking_uri(cfg.tracking)
    console.print(f"MLflow UI for {uri}: runs of experiment {cfg.tracking.experiment!r} at "
                  f"{runs_url(exp_id, port=port)}  (Ctrl-C to stop)", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(serve(uri, port))
