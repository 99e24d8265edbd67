"""``raycpt hybrid run`` end to end on a tiny donor: Ray Train, lm-eval, trace, MLflow parent/children."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from tiny import save_tiny


def test_hybrid_run_end_to_end_and_resume(ray_local, tmp_path, capsys):
    import mlflow
    from mlflow.tracking import MlflowClient
    from safetensors.torch import load_file

    from raycpt.entry import main

    donor = save_tiny(tmp_path / "donor", "llama", 4, 32, seed=1)
    cfg = {
        "name": "ihyb", "model": {"ref": str(donor)},
        "data": {"seq_len": 32, "max_documents": 100},
        "trace": {"max_prompts": 4, "batch_size": 4, "splits": [0.5], "top_k": 5},
        "train": {"max_steps": 2, "micro_batch_size": 2, "lr": 1e-2, "warmup_ratio": 0.0, "checkpoint_every": 2,
                  "keep_checkpoints": 1, "cpus_per_worker": 1},
        "eval": {"limit": 4, "batch_size": 4, "max_gen_toks": 2},
        "tracking": {"run_root": str(tmp_path / "runs")},
        "hybrid": {"depth": 4, "new_kind": "mamba2"},
    }
    path = tmp_path / "hyb.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["hybrid", "run", str(path)]) == 0
    out = capsys.readouterr().out
    run_dir = next((tmp_path / "runs").glob("hybrid-ihyb-*"))
    table = (run_dir / "hybrid_table.txt").read_text()
    for name in ("mamba2-llama (new_shallow)", "llama-mamba2 (new_deep)"):
        assert name in table and name in out
    for col in ("STEM", "Social Science", "Humanities", "Other", "Average", "Generate / Logit"):
        assert col in table
    assert (run_dir / "hybrid_profiles.png").stat().st_size > 1000

    # frozen segments came through Ray Train bitwise unchanged; trainable ones moved
    for build, frozen, trained in (("new_shallow", (2, 3), (0, 1)), ("new_deep", (2, 3), (0, 1))):
        res = json.loads((run_dir / "builds" / build / "result.json").read_text())
        before = load_file(str(run_dir / "builds" / build / "initial" / "model.safetensors"))
        after = load_file(str(Path(res["final_model_dir"]) / "model.safetensors"))
        for k in before:
            layer = int(k.split(".")[2]) if k.startswith("model.layers.") else None
            if layer in frozen or layer is None:
                assert torch.equal(before[k], after[k]), (build, k)
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(f"model.layers.{trained[0]}."))

    # MLflow: one parent, one child per build, each child's trace nested under it; nothing RUNNING
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client = MlflowClient()
    exp = client.get_experiment_by_name("raycpt")
    runs = client.search_runs([exp.experiment_id])
    assert all(r.info.status == "FINISHED" for r in runs)
    parent = [r for r in runs if r.data.tags.get("raycpt.command") == "hybrid" and "mlflow.parentRunId" not in r.data.tags]
    assert len(parent) == 1
    pid = parent[0].info.run_id
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pid]
    assert sorted(r.data.tags["raycpt.build"] for r in children) == ["new_deep", "new_shallow"]
    for c in children:
        assert any(k.endswith("/average/logit") for k in c.data.metrics)
        assert any(r.data.tags.get("mlflow.parentRunId") == c.info.run_id for r in runs)  # its trace
        assert "trace" in [a.path for a in client.list_artifacts(c.info.run_id)]
    assert any(k.startswith("new_shallow/") for k in parent[0].data.metrics)

    # --resume does no finished work again: no new MLflow runs
    assert main(["hybrid", "run", str(path), "--resume"]) == 0
    assert len(client.search_runs([exp.experiment_id])) == len(runs)
