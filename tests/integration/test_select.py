"""``raycpt select`` on the tiny model through the CLI: each method's ranking.json holds scores recomputed here
independently (BI by hand from ``output_hidden_states`` on the same corpus blocks, SNR by a numpy SVD, random
from the seed, LayerTracer from the trace's own profiles), the elite plan trains its top-k, the MLflow run
ends FINISHED with the per-layer series and artifacts; a bad ``--k`` is one line, exit 2, before any run."""

import json
import math
from pathlib import Path

import numpy as np
import pytest


def _args(tmp_path, tiny_dir, *extra):
    return ["select", f"model.ref={tiny_dir}", f"tracking.run_root={tmp_path / 'runs'}", "data.seq_len=16",
            "select.samples=6", *extra]


def _run(tmp_path, tiny_dir, capsys, *extra):
    from raycpt.entry import main

    rc = main(_args(tmp_path, tiny_dir, *extra))
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(w for w in out.split() if w.endswith("ranking.json"))
    return Path(line), json.loads(Path(line).read_text()), out


def _finished_run(tmp_path, run_dir):
    import mlflow

    state = json.loads((run_dir / "state.json").read_text())
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    return client, client.get_run(state["mlflow_run_id"]), state


def _numpy_snr(w: np.ndarray) -> float:
    s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
    q1, q3 = np.percentile(s, [25, 75])
    edge = (q3 - q1) / 1.349 * (1 + math.sqrt(min(w.shape) / max(w.shape)))
    return s[s > edge].sum() / s[s <= edge].sum()


def test_select_bi_snr_random_through_the_cli(tiny_dir, tmp_path, capsys, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raycpt.config import load_config
    from raycpt.jobs.select import corpus_blocks

    monkeypatch.chdir(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    path, doc, out = _run(tmp_path, tiny_dir, capsys, "--method", "bi", "--k", "2")
    scores = np.array([r["score"] for r in sorted(doc["ranking"], key=lambda r: r["layer"])])
    blocks = corpus_blocks(load_config(None, _args(tmp_path, tiny_dir)[1:]), AutoTokenizer.from_pretrained(tiny_dir))
    assert blocks.shape == (6, 16)
    with torch.no_grad():
        hs = model(input_ids=torch.as_tensor(blocks, dtype=torch.long), output_hidden_states=True).hidden_states
    for layer in range(3):  # hs[-1] is after the final norm
        a, b = hs[layer].double().numpy(), hs[layer + 1].double().numpy()
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert scores[layer] == pytest.approx(1 - cos.mean(), rel=1e-6)
    assert doc["top_k"] == sorted(np.argsort(-scores, kind="stable")[:2].tolist())
    assert doc["num_layers"] == 4 and doc["method"] == "bi" and doc["metric"] == "block_influence"
    client, run, state = _finished_run(tmp_path, path.parent)
    assert run.info.status == "FINISHED" and state["status"] == "finished"
    hist = sorted(client.get_metric_history(run.info.run_id, "select/bi"), key=lambda m: m.step)
    assert [m.step for m in hist] == [0, 1, 2, 3]
    assert [m.value for m in hist] == pytest.approx(scores.tolist())
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "select")}
    assert arts == {"select/ranking.json", "select/scores.csv", "select/scores.png"}
    assert (path.parent / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    path, doc, _ = _run(tmp_path, tiny_dir, capsys, "--method", "snr", "--k", "3")
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    want = [np.mean([_numpy_snr(v) for k, v in sd.items() if k.startswith(f"model.layers.{i}.") and v.ndim == 2])
            for i in range(4)]
    got = {r["layer"]: r["score"] for r in doc["ranking"]}
    assert [got[i] for i in range(4)] == pytest.approx(want, rel=1e-6)

    path, doc, _ = _run(tmp_path, tiny_dir, capsys, "--method", "random", "--k", "1", "select.seed=5")
    draw = np.random.default_rng(5).random(4)
    assert doc["top_k"] == [int(np.argmax(draw))]
    assert {r["layer"]: r["score"] for r in doc["ranking"]} == {i: pytest.approx(v) for i, v in enumerate(draw)}

    from raycpt.entry import main  # the elite plan trains exactly the ranking's top-k

    assert main(["plan", "show", f"model.ref={tiny_dir}", "plan.name=elite", "plan.k=1",
                 f"plan.ranking_file={path}"]) == 0
    layer_map = "".join("T" if i == int(np.argmax(draw)) else "." for i in range(4))
    assert f"T = trains): {layer_map}" in capsys.readouterr().out


@pytest.mark.parametrize("k", ["0", "5"])
def test_select_bad_k_is_one_line(tiny_dir, tmp_path, capsys, k):
    from raycpt.entry import main

    rc = main(_args(tmp_path, tiny_dir, "--method", "snr", "--k", k))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.strip() == f"error: --k {k}: expected an integer from 1 to 4 (this model has 4 layers)"
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("select-*"))


def test_select_bad_method_is_one_line(tiny_dir, tmp_path, capsys):
    from raycpt.entry import main

    rc = main(_args(tmp_path, tiny_dir, "--method", "shortgpt"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "one of bi, snr, layertracer, random" in err


@pytest.mark.slow
def test_select_layertracer_ranks_ls_minus_tp_of_its_trace(ray_local, tiny_dir, tmp_path, capsys, monkeypatch):
    from raycpt.diagnostics.scores import boundary_score

    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"s1": f"Example: a{i}->B{i};", "s2": f" Query: c{i}->", "group": "g"})
                               + "\n" for i in range(4)))
    path, doc, _ = _run(tmp_path, tiny_dir, capsys, "--method", "layertracer", "--k", "2", f"trace.prompts={prompts}",
                        "trace.batch_size=4", "trace.num_actors=1", "trace.cpus_per_actor=1", "trace.splits=[0.5]")
    summary = json.loads((path.parent / "trace" / "summary.json").read_text())
    tp, ls = np.array(summary["tp_norm"]), np.array(summary["ls_norm"])
    got = np.array([{r["layer"]: r["score"] for r in doc["ranking"]}[i] for i in range(4)])
    assert got == pytest.approx(ls - tp)
    for b in (1, 2, 3):  # S(b) regroups into the per-layer scores
        assert boundary_score(tp, ls, b) == pytest.approx(got[:b].mean() - got[b:].mean())
    client, run, _ = _finished_run(tmp_path, path.parent)
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert run.info.status == "FINISHED" and [c.info.status for c in children] == ["FINISHED"]
