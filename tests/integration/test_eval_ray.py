"""``raycpt eval --checkpoints A,B`` end to end on local Ray: two tiny checkpoints as parallel Ray tasks,
files in the run folder, MLflow parent + one child run per checkpoint; Ray results equal in-process ones."""

from __future__ import annotations

import csv
import json

from raycpt.entry import main
from raycpt.config import EvalConfig
from raycpt import evaluate as E


def _questions(path):
    cats = ["STEM", "Social Science", "Humanities", "Other"]
    rows = [{"id": f"q{i}", "question": f"Pick {i}?", "A": "ox", "B": "elk", "C": "yak", "D": "emu",
             "answer": "ABCD"[i % 4], "category": cats[(i // 2) % 4]} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_checkpoints_on_ray(ray_local, tmp_path):
    from tiny import save_tiny

    a = save_tiny(tmp_path / "ckpt-a", seed=1, num_layers=2)
    b = save_tiny(tmp_path / "ckpt-b", seed=2, num_layers=2)
    q = _questions(tmp_path / "mini.jsonl")
    root = tmp_path / "runs"
    code = main(["eval", f"tracking.run_root={root}", "eval.limit=6", "eval.max_gen_toks=4", "eval.cpus_per_task=1",
                 "--checkpoints", f"{a},{b}", "--tasks", str(q), "--modes", "logit,generate"])
    assert code == 0
    (run_dir,) = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("eval-")]
    rows = list(csv.DictReader((run_dir / "eval.csv").open()))
    assert [r["model"] for r in rows] == ["ckpt-a", "ckpt-b"] and all(r["n"] == "6" for r in rows)
    dump = json.loads((run_dir / "eval_questions.json").read_text())
    assert [d["model"] for d in dump] == ["ckpt-a", "ckpt-b"]
    assert all(set(qq) >= {"gold", "logit", "generate"} for qq in dump[0]["questions"]["mini"])
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"

    # the Ray task computed what an in-process run computes
    local = E.evaluate_model(str(a), EvalConfig(tasks=[str(q)], modes=["logit", "generate"], limit=6,
                                                max_gen_toks=4), name="ckpt-a")
    assert dump[0]["scores"]["mini"] == local.scores["mini"]

    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("raycpt")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if r.info.run_name == run_dir.name]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert parent[0].info.status == "FINISHED" and len(children) == 2
    for child in children:
        assert child.info.status == "FINISHED"
        assert {"mini/stem/logit", "mini/average/generate", "mini/overall/logit"} <= set(child.data.metrics)
    by_name = {c.info.run_name: c for c in children}
    assert by_name["ckpt-a"].data.metrics["mini/average/logit"] == local.scores["mini"]["logit"]["average"]
