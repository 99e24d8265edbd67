"""``model.revision`` reaches every resolve: a fake hub (``snapshot_download``) serves a model whose depth
depends on the revision asked for, and every command path that resolves a model from a config is run
against it. One resolver (``raycpt.models.sources.resolve_model_path``) is the only caller of
``resolve_model`` in the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raycpt.config import HybridConfig, load_config

HUB_ID = "org-x/tiny-model"
DEPTH = {"v2-deep": 6, None: 2}  # the default revision has 2 layers, the pinned one 6


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    import huggingface_hub

    from tiny import save_tiny

    calls: list[tuple[str, str | None]] = []

    def snapshot_download(repo_id, revision=None, local_dir=None, allow_patterns=None, **_):
        calls.append((repo_id, revision))
        save_tiny(Path(local_dir), num_layers=DEPTH[revision])
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    return calls


def _cfg(tmp_path, *extra):
    return load_config(None, [f"model.ref={HUB_ID}", "model.revision=v2-deep", f"model.cache_dir={tmp_path / 'c'}",
                              f"tracking.run_root={tmp_path / 'runs'}", *extra])


def test_revision_reaches_every_resolve(fake_hub, tmp_path):
    from transformers import AutoConfig

    from raycpt.jobs.compare import resolve_ref
    from raycpt.jobs.grid import model_layers
    from raycpt.jobs.trace import prepare_trace
    from raycpt.models.hybrid.plans import plan_from_config
    from raycpt.train.driver.prepare import resolve_model_path

    cfg = _cfg(tmp_path)
    hybrid = plan_from_config(HybridConfig(), "new_shallow", cfg.model.ref, cfg.model)  # donor = model.ref
    depths = {
        "grid.model_layers (sweep, contribution)": model_layers(cfg)[1],
        "train.launch.resolve_model_path": AutoConfig.from_pretrained(resolve_model_path(cfg)).num_hidden_layers,
        "compare.resolve_ref": AutoConfig.from_pretrained(resolve_ref(HUB_ID, cfg)).num_hidden_layers,
        "trace": prepare_trace(cfg, splits=[0.5], prompts=None).num_layers,
        "hybrid donor": AutoConfig.from_pretrained(hybrid.head_path).num_hidden_layers,
        "hybrid donor's deep half ends at": hybrid.segments[-1].layers[1],
    }
    assert depths == {k: DEPTH["v2-deep"] for k in depths}, depths
    assert fake_hub and all(c == (HUB_ID, "v2-deep") for c in fake_hub), fake_hub


def test_eval_resolves_on_the_driver_with_the_revision(fake_hub, tmp_path, monkeypatch):
    from transformers import AutoConfig

    import raycpt.jobs.eval as E

    seen = []

    class Stop(Exception):
        pass

    def fake_evaluate_checkpoints(cfg, paths, names=None, progress=True):
        seen.extend(paths)
        raise Stop

    monkeypatch.setattr(E, "evaluate_checkpoints", fake_evaluate_checkpoints)
    with pytest.raises(Stop):
        E.run_eval(_cfg(tmp_path), None)
    assert len(seen) == 1 and AutoConfig.from_pretrained(seen[0]).num_hidden_layers == DEPTH["v2-deep"]
    assert fake_hub == [(HUB_ID, "v2-deep")]


def test_cli_paths_pass_the_revision(fake_hub, tmp_path, capsys):
    from raycpt.entry import main

    assert main(["models", "pull", HUB_ID, "model.revision=v2-deep", f"model.cache_dir={tmp_path / 'c'}"]) == 0
    assert main(["plan", "show", f"model.ref={HUB_ID}", "model.revision=v2-deep", f"model.cache_dir={tmp_path / 'c'}",
                 "plan.name=full"]) == 0
    out = capsys.readouterr().out
    assert "layer map (layer 0 first, T = trains): " + "T" * DEPTH["v2-deep"] in out.replace("\n", "")
    # without the revision: the default one, a different cache folder
    assert main(["models", "pull", HUB_ID, f"model.cache_dir={tmp_path / 'c'}"]) == 0
    assert fake_hub == [(HUB_ID, "v2-deep"), (HUB_ID, None)]


def test_only_the_one_resolver_calls_resolve_model():
    pkg = Path(__file__).resolve().parents[2] / "raycpt"
    offenders = []
    for f in pkg.rglob("*.py"):
        if f.name == "sources.py" and f.parent.name == "models":
            continue
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bresolve_model\(", line) and not line.lstrip().startswith("#"):
                offenders.append(f"{f.relative_to(pkg)}:{n}")
    assert offenders == [], offenders
