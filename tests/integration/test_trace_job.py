"""``raycpt trace`` on a local Ray with a tiny model folder: the actor pool's rows equal the library's,
the aggregates are recomputed from the Parquet table, the MLflow run ends FINISHED with its series
and artifacts; bad inputs exit 2 with one line and leave no run RUNNING."""

import json

import numpy as np
import pandas as pd
import pytest

from raycpt.config import load_config

PROMPTS = [
    ("Example: hot->Cold, big->Small;", " Query: fast->", "antonym"),
    ("Example: up->Down, in->Out;", " Query: day->", "antonym"),
    ("Example: wet->Dry;", " Query: good->", "antonym"),
    ("Example: big->Large, end->Finish;", " Query: begin->", "synonym"),
    ("Example: fast->Quick;", " Query: small->", "synonym"),
    ("Example: say->Tell, speak->Talk;", " Query: look->", "synonym"),
]


def write_prompts(path, rows=PROMPTS):
    path.write_text("".join(json.dumps({"s1": a, "s2": b, "group": g}) + "\n" for a, b, g in rows))
    return str(path)


def cfg_for(tmp_path, tiny_dir, prompts, *extra):
    return load_config(None, [f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}",
                              f"trace.prompts={prompts}", "trace.batch_size=4", "trace.num_actors=1",
                              "trace.cpus_per_actor=1", *extra])


def runs_with_status(tmp_path, status):
    import mlflow

    db = tmp_path / "runs" / "mlflow.db"
    if not db.exists():
        return []
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exps = client.search_experiments()
    if not exps:
        return []
    return client.search_runs([e.experiment_id for e in exps], f"attributes.status = '{status}'")


def test_trace_job_end_to_end(ray_local, tiny_dir, tmp_path, monkeypatch):
    import mlflow
    import torch

    from raycpt.diagnostics.prompts import collate, encode_prompts, load_prompt_records, pad_id_of
    from raycpt.diagnostics.scores import boundary_score, minmax
    from raycpt.diagnostics.tracer import trace_batch
    from raycpt.jobs.trace import run_trace
    from raycpt.models.sources import load_model
    from raycpt.models.stack import LayerStack

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is relative to the working directory
    prompts = write_prompts(tmp_path / "p.jsonl")
    res = run_trace(cfg_for(tmp_path, tiny_dir, prompts), splits=[0.25, 0.5, 0.75], top_k=5, progress=False)
    assert res.num_layers == 4 and res.num_prompts == 6 and res.top_k == 5

    # rows from the actor pool = the library on the same model and prompts, in prompt order
    df = pd.read_parquet(res.paths["per_prompt"])
    assert df["group"].tolist() == [g for _, _, g in PROMPTS]
    model, tok = load_model(str(tiny_dir), dtype="float32", device="cpu")
    enc = encode_prompts(load_prompt_records(prompts), tok)
    with torch.inference_mode():
        ref = trace_batch(LayerStack(model), collate(enc, pad_id_of(tok)), top_k=5)
    # (batches differ - the job sorts by length, 4 per batch - so float32 rounding differs a little;
    # dJS divides by small JS values and amplifies it)
    for key, rtol in (("p_t", 1e-5), ("js", 1e-4), ("ratio", 1e-4), ("djs", 1e-3)):
        np.testing.assert_allclose(np.stack(df[key].to_numpy()), ref[key], rtol=rtol, atol=1e-7, err_msg=key)
    assert df["t_star"].tolist() == ref["t_star"].tolist()

    # aggregates recomputed from the table
    tp, ls = np.stack(df["ratio"].to_numpy()).mean(0), np.stack(df["djs"].to_numpy()).mean(0)
    np.testing.assert_allclose(res.tp, tp)
    np.testing.assert_allclose(res.groups["synonym"]["ls"], np.stack(df["djs"].to_numpy())[3:].mean(0))
    tp_med, ls_med = np.median(np.stack(df["ratio"].to_numpy()), 0), np.median(np.stack(df["djs"].to_numpy()), 0)
    r_all, d_all = np.stack(df["ratio"].to_numpy()), np.stack(df["djs"].to_numpy())
    tp_sc = (r_all / r_all.mean(1, keepdims=True)).mean(0)  # trace.sb_aggregate=scaled: rows over their layer mean
    ls_sc = (d_all / d_all.mean(1, keepdims=True)).mean(0)
    for row, b in zip(res.split_table, [1, 2, 3]):
        assert row["split_layer"] == b
        assert row["S"] == pytest.approx(boundary_score(minmax(tp_sc), minmax(ls_sc), b))
        assert row["S_mean"] == pytest.approx(boundary_score(minmax(tp), minmax(ls), b))  # 004's raw means
        assert row["S_lo"] <= row["S"] <= row["S_hi"]
        assert row["S_median"] == pytest.approx(boundary_score(minmax(tp_med), minmax(ls_med), b))
    assert res.recommended["S"] == pytest.approx(max(r["S"] for r in res.split_table))  # grid covers b = 1..3

    # files and the MLflow run
    for name in ("per_prompt", "heatmap_ratio", "heatmap_djs", "profile", "split_table_csv", "split_table_md",
                 "summary"):
        assert res.paths[name].is_file() and res.paths[name].stat().st_size > 0, name
    assert json.loads((res.run_dir / "state.json").read_text())["status"] == "finished"
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["trace.top_k"] == "5" and run.data.params["trace.num_layers"] == "4"
    assert run.data.metrics["S_b/0.5"] == pytest.approx(res.split_table[1]["S"])
    hist = client.get_metric_history(res.run_id, "tp")
    assert [m.step for m in sorted(hist, key=lambda m: m.step)] == [0, 1, 2, 3]
    assert [m.value for m in sorted(hist, key=lambda m: m.step)] == pytest.approx(tp.tolist())
    arts = {a.path for a in client.list_artifacts(res.run_id, "trace")}
    assert {"trace/per_prompt.parquet", "trace/heatmap_ratio.png", "trace/profile.png",
            "trace/split_table.md"} <= arts


def test_trace_cli_prints_table(ray_local, tiny_dir, tmp_path, monkeypatch, capsys):
    from raycpt.entry import main

    monkeypatch.chdir(tmp_path)
    prompts = write_prompts(tmp_path / "p.jsonl", PROMPTS[:3])
    rc = main(["trace", f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", "trace.batch_size=2",
               "--prompts", prompts, "--splits", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "S(b)" in out and "recommended split: r =" in out
    assert not runs_with_status(tmp_path, "RUNNING")


@pytest.mark.parametrize("args,msg", [
    (["--prompts", "BAD"], "line 2 is not JSON"),
    (["--prompts", "EMPTY"], "is empty"),
    (["--splits", "1.5"], "strictly between 0 and 1"),
    (["--splits", "0.5,0"], "strictly between 0 and 1"),
    (["--splits", "0.1"], "shallow side empty"),
    (["--splits", "0.9"], "deep side empty"),
    (["--top-k", "-1"], "top-k -1"),
])
def test_trace_cli_bad_inputs_exit_2(tiny_dir, tmp_path, monkeypatch, capsys, args, msg):
    from raycpt.entry import main

    monkeypatch.chdir(tmp_path)
    files = {"BAD": ["{\"s1\": \"a;\", \"s2\": \" b->\", \"group\": \"g\"}", "{oops"], "EMPTY": []}
    args = list(args)
    if args[0] == "--prompts":
        p = tmp_path / "bad.jsonl"
        p.write_text("".join(line + "\n" for line in files[args[1]]))
        args[1] = str(p)
    rc = main(["trace", f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and msg in err, err
    assert not runs_with_status(tmp_path, "RUNNING")
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # rejected before MLflow was touched


def test_one_local_actor_runs_in_process_with_the_pool_rows(ray_local, tiny_dir, tmp_path, monkeypatch):
    """One actor and no cluster: the trace is computed in this process (no Ray start, no actor) - the rows are
    those of a one-actor pool on the same prompts (batches of 2 of 6 prompts: the pool's batches are the same)."""
    from raycpt.jobs.trace import _compute_rows, _rows_in_process, in_process, prepare_trace

    prompts = write_prompts(tmp_path / "p.jsonl")
    cfg = cfg_for(tmp_path, tiny_dir, prompts, "trace.batch_size=2")
    assert in_process(cfg)
    assert not in_process(cfg_for(tmp_path, tiny_dir, prompts, "trace.num_actors=2"))
    assert not in_process(cfg_for(tmp_path, tiny_dir, prompts, "ray.address=ray://head:10001"))
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert not in_process(cfg)
    monkeypatch.delenv("RAY_ADDRESS")
    prep = prepare_trace(cfg, splits=[0.5], top_k=5)
    local, pool = _rows_in_process(prep, False), _compute_rows(prep, False)
    assert set(local) == set(pool) and local["index"].tolist() == list(range(len(PROMPTS)))
    for key in sorted(set(local) - {"forward_s"}):
        np.testing.assert_allclose(local[key], pool[key], rtol=1e-6, atol=1e-9, err_msg=key)
