"""FSDP2 that trains exactly the plan, on CPU: 2 gloo processes run raycpt's own loop and wrapping.

The processes are started with ``torch.multiprocessing`` (:mod:`raycpt.train.worker.gloo`); each runs
:func:`raycpt.train.worker.loop.run_loop` with :func:`raycpt.train.worker.parallel.wrap_model`, the same code a Ray
Train worker runs (Ray only starts processes and the process group). Every expected value comes from
somewhere else than the code under test: the base weights on disk, a DDP run of the same plan, an
uninterrupted run, the float32 masters' own bits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from raycpt.config import config_to_dict, load_config
from raycpt.strategies import apply_plan, build_plan
from raycpt.train.worker.gloo import run_jobs, spawn
from worker_specs import worker_spec


PLANS = {
    "full": dict(name="full"),
    "train_shallow": dict(name="train_shallow", split=0.5),
    "train_deep": dict(name="train_deep", split=0.5),
    "blocks": dict(name="blocks", pattern="0110"),
    "single": dict(name="single", layer=2),
}
ARCHS = ("qwen3", "llama")
STEPS = 4


def _save_tied(path: Path, arch: str) -> Path:
    import transformers as T

    from tiny import tiny_config, tiny_tokenizer

    conf = tiny_config(arch, num_layers=4)
    conf.tie_word_embeddings = True
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(conf)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


EVAL = ["eval.tasks=[wordnet_mc]", "eval.modes=[logit]", "eval.limit=6", "eval.batch_size=4"]


def _job(root: Path, name: str, model: Path, plan: dict, *, distributed="fsdp", precision="fp32", every=1,
         resume_from=None, faults=None, steps=STEPS, evaluate=None, loss="auto") -> dict:
    cfg = load_config(None, [f"model.ref={model}", "data.seq_len=16", f"train.distributed={distributed}",
                             "train.num_workers=2", f"train.max_steps={steps}", f"train.checkpoint_every={every}",
                             "train.lr=0.01", "train.micro_batch_size=2", "train.grad_accum=2", "train.warmup_ratio=0",
                             f"train.precision={precision}", f"train.loss={loss}", "train.loss_chunk_tokens=7"]
                      + [f"plan.{k}={v}" for k, v in plan.items()] + EVAL)
    p = build_plan(cfg.plan, 4, tied_embeddings=True)
    config = {"cfg": config_to_dict(cfg), "model_path": str(model), "plan": p.to_dict(), "run_dir": str(root / name),
              "torch_threads": 1, "resume_from": resume_from, "faults": faults, "evaluate": evaluate}
    return {"spec": worker_spec(config), "blocks": str(root / "blocks.npy"), "checkpoint_root": str(root / name / "ckpts"),
            "out": str(root / f"{name}.json")}


def _weights(root: Path, name: str, step: int) -> dict:
    return load_file(str(root / name / "ckpts" / f"checkpoint_{step:06d}" / "model" / "model.safetensors"))


def _result(root: Path, name: str) -> dict:
    return json.loads((root / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One spawn of 2 gloo processes runs every plan of both architectures under FSDP and DDP, bf16 runs
    with a checkpoint round trip, and a DDP checkpoint resumed under FSDP."""
    root = tmp_path_factory.mktemp("fsdp")
    np.save(root / "blocks.npy", np.random.default_rng(0).integers(4, 128, size=(64, 16)).astype(np.int32))
    models = {a: _save_tied(root / f"model-{a}", a) for a in ARCHS}
    jobs = []
    for arch in ARCHS:
        for key, plan in PLANS.items():
            jobs.append(_job(root, f"fsdp-{arch}-{key}", models[arch], plan))
            jobs.append(_job(root, f"ddp-{arch}-{key}", models[arch], plan, distributed="ddp", every=2))
    for key in ("full", "train_deep"):  # the tiny vocabulary picks the plain loss under auto: force the chunked one
        for dist in ("fsdp", "ddp"):
            jobs.append(_job(root, f"{dist}-chunked-{key}", models["qwen3"], PLANS[key], distributed=dist, every=4,
                             loss="chunked"))
    deep = PLANS["train_deep"]
    jobs.append(_job(root, "bf16", models["qwen3"], deep, precision="bf16", every=2))
    jobs.append(_job(root, "bf16-resumed", models["qwen3"], deep, precision="bf16", every=2,
                     resume_from=str(root / "bf16" / "ckpts" / "checkpoint_000002")))
    jobs.append(_job(root, "ddp-to-fsdp", models["qwen3"], deep,
                     resume_from=str(root / "ddp-qwen3-train_deep" / "ckpts" / "checkpoint_000002")))
    from raycpt.train.worker.evaluation import EvalRequest

    jobs.append(_job(root, "bf16-eval", models["llama"], PLANS["train_shallow"], precision="bf16", steps=2, every=2,
                     evaluate=EvalRequest(out_dir=str(root / "bf16-eval" / "eval"), name="trial")))
    spawn(run_jobs, 2, jobs)
    return root, models


def _trainable_names(model_dir: Path, plan_spec: dict) -> tuple[set, set]:
    from raycpt.models.sources import load_model
    from raycpt.config import PlanConfig

    model, _ = load_model(str(model_dir), dtype="float32", device="cpu")
    plan = build_plan(PlanConfig(**plan_spec), 4, tied_embeddings=True)
    apply_plan(model, plan)
    names = dict(model.named_parameters())
    return {n for n, p in names.items() if p.requires_grad}, {n for n, p in names.items() if not p.requires_grad}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("key", list(PLANS))
def test_one_fsdp_step_moves_exactly_the_trainable_parameters(runs, arch, key):
    root, models = runs
    base = load_file(str(models[arch] / "model.safetensors"))
    after = _weights(root, f"fsdp-{arch}-{key}", 1)
    trainable, frozen = _trainable_names(models[arch], PLANS[key])
    assert trainable and (key == "full" or frozen)
    for n in trainable & after.keys():
        assert not torch.equal(after[n], base[n]), f"{n} trains under the plan but did not change"
    for n in frozen & after.keys():
        assert torch.equal(after[n], base[n]), f"{n} is frozen but changed"
    assert trainable | frozen >= after.keys() - {"lm_head.weight"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("key", list(PLANS))
def test_fsdp_losses_and_weights_equal_ddp(runs, arch, key):
    root, _ = runs
    f, d = _result(root, f"fsdp-{arch}-{key}"), _result(root, f"ddp-{arch}-{key}")
    assert f["status"]["status"] == "finished" and len(f["losses"]) == STEPS
    np.testing.assert_allclose(f["losses"], d["losses"], rtol=1e-5, atol=0)
    assert f["counts"] == d["counts"]
    wf, wd = _weights(root, f"fsdp-{arch}-{key}", STEPS), _weights(root, f"ddp-{arch}-{key}", STEPS)
    assert wf.keys() == wd.keys()
    for k in wf:
        torch.testing.assert_close(wf[k], wd[k], rtol=1e-4, atol=1e-5)


def test_bf16_masters_survive_the_checkpoint_round_trip(runs):
    root, models = runs
    ckpt = root / "bf16" / "ckpts" / "checkpoint_000002"
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    trainable, _ = _trainable_names(models["qwen3"], PLANS["train_deep"])
    master = state["master"]
    assert set(master) == trainable  # every float32 master tensor of what trains is kept
    assert all(v.dtype == torch.float32 for v in master.values())
    # real masters: not bf16 values widened to float32
    assert any(not torch.equal(v, v.to(torch.bfloat16).float()) for v in master.values())
    saved = load_file(str(ckpt / "model" / "model.safetensors"))
    for n, v in master.items():
        assert torch.equal(saved[n], v.to(torch.bfloat16)), n  # model/ is the bf16 rounding of the masters
    a, b = _result(root, "bf16"), _result(root, "bf16-resumed")
    assert b["losses"] == a["losses"]  # steps 3..4 after the reload, bitwise
    ma = torch.load(root / "bf16" / "ckpts" / "checkpoint_000004" / "train_state.pt", weights_only=True)["master"]
    mb = torch.load(root / "bf16-resumed" / "ckpts" / "checkpoint_000004" / "train_state.pt",
                    weights_only=True)["master"]
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


def test_a_ddp_checkpoint_resumes_under_fsdp(runs):
    root, _ = runs
    d, r = _result(root, "ddp-qwen3-train_deep"), _result(root, "ddp-to-fsdp")
    assert r["status"]["status"] == "finished"
    np.testing.assert_allclose(r["losses"], d["losses"], rtol=1e-5, atol=0)


def test_a_killed_worker_resumes_to_the_uninterrupted_losses_and_weights(runs):
    from torch.multiprocessing import ProcessExitedException

    root, models = runs
    job = _job(root, "killed", models["qwen3"], PLANS["train_deep"], faults={"sigkill_step": 3, "sigkill_rank": 1})
    (root / "killed").mkdir()
    with pytest.raises(ProcessExitedException):
        spawn(run_jobs, 2, [job])
    assert (root / "killed" / ".fault_sigkill_3").is_file()
    assert not (root / "killed" / "ckpts" / "checkpoint_000003").exists()
    spawn(run_jobs, 2, [job])  # the restart: the marker stops a second kill, rank 0 picks checkpoint 2
    assert _result(root, "killed")["losses"] == _result(root, "fsdp-qwen3-train_deep")["losses"]
    a, b = _weights(root, "killed", STEPS), _weights(root, "fsdp-qwen3-train_deep", STEPS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    events = [json.loads(x) for x in (root / "killed" / "train_metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "resume"] == [2]


def test_a_layer_that_gets_no_gradient_stops_the_run_naming_it(runs):
    from torch.multiprocessing import ProcessRaisedException

    root, models = runs
    job = _job(root, "dropped", models["llama"], PLANS["train_deep"], faults={"drop_grad_layer": 2})
    with pytest.raises(ProcessRaisedException, match=r"freeze check after the first step: layers\.2: the plan trains "
                                                     r"\d+ of its \d+ tensors but 0 received a gradient"):
        spawn(run_jobs, 2, [job])
    assert not (root / "dropped" / "ckpts").exists()  # stopped before its first checkpoint


def test_raycpt_train_on_ray_runs_fsdp_on_cpu_logs_the_freeze_check_and_stops_an_untrained_plan(
        ray_local, tmp_path, tiny_dir, capsys, monkeypatch):
    """The real launcher: Ray Train starts 2 CPU workers (gloo), raycpt shards them with FSDP2."""
    from mlflow.tracking import MlflowClient

    from raycpt.entry import main
    from test_train import _base

    base = _base(tmp_path, tiny_dir, distributed="fsdp", max_steps=2, checkpoint_every=2, max_failures=0)
    assert main(["train"] + base + ["name=ok"]) == 0
    capsys.readouterr()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    logged = {a.path for r in runs for a in client.list_artifacts(r.info.run_id, "freeze_check")}
    assert logged == {"freeze_check/after_wrapping.txt", "freeze_check/after_first_step.txt"}
    monkeypatch.setenv("RAYCPT_FAULTS", json.dumps({"drop_grad_layer": 3}))
    rc = main(["train"] + base + ["name=dropped"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "freeze check after the first step: layers.3: the plan trains" in err and "0 received a gradient" in err


def test_the_sdpa_probe_outlives_the_gloo_work_started_inside_it(monkeypatch):
    """bench_fsdp's SIGSEGV with its window held open: a gloo collective ends its profiler record on pt_gloo_runloop
    after completing the future DDP waits on, so the probe must not stop the profiler (freeing that record) before.
    Without the drain in sdpa_probe 9 of 12 runs of this test lost a rank to SIGSEGV (onFunctionExit, from
    Work::finish); not all, since the freed block may be mapped again before the late write lands."""
    from gloo_probe import late_gloo_record_under_sdpa_probe

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # a freed block of 64 KiB or more is unmapped: writes fault
    spawn(late_gloo_record_under_sdpa_probe, 2, 20)


def test_bench_fsdp_smoke_prints_its_three_results():
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_fsdp.py"), "--smoke"], capture_output=True,
                       text=True, timeout=600, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = dict(re.findall(r"^RESULT (\w+) (\S+) target", r.stdout, re.M))
    assert set(got) == {"fsdp_loss_agreement", "fsdp_memory_ratio", "fsdp_memory_estimate_error"}
    assert float(got["fsdp_loss_agreement"]) <= 1e-4  # same plan, same data, fp32: FSDP trains as DDP does


def test_fsdp_evaluates_in_the_worker_and_scores_what_evaluating_the_saved_model_scores(runs):
    """One dtype for both paths: the in-worker evaluation of an FSDP bf16 run (rank 0, the gathered weights in the
    checkpoint's dtype) gives the same per-question log-probabilities as evaluating the published folder, by
    final_evaluation and by `raycpt eval`."""
    from raycpt.train.driver.publish import publish_model
    from raycpt.train.driver.final_eval import final_evaluation, saved_dtype
    from raycpt.train.worker.evaluation import EVAL_RESULT_FILE, EvalRequest

    root, _ = runs
    got = json.loads((root / "bf16-eval" / "eval" / EVAL_RESULT_FILE).read_text())
    final = root / "bf16-eval" / "final_model"
    publish_model(root / "bf16-eval" / "ckpts" / "checkpoint_000002", final)
    assert saved_dtype(final) == "bfloat16"
    job_cfg = _job(root, "x", final, PLANS["train_shallow"])["spec"].cfg
    ev, _ = final_evaluation(final, job_cfg.eval, EvalRequest(str(root / "reeval"), "trial"))
    a, b = got["questions"]["wordnet_mc"], ev.questions["wordnet_mc"]
    assert len(a) == len(b) == 6 and [q["id"] for q in a] == [q["id"] for q in b]
    assert [q["logit"]["logprobs"] for q in a] == [q["logit"]["logprobs"] for q in b]
    assert got["scores"] == ev.scores
    # and `raycpt eval` of the same folder (its in-process loader; each Ray task runs the same call)
    from raycpt.jobs.eval import evaluate_checkpoints

    cli = evaluate_checkpoints(job_cfg, [str(final)], use_ray=False, progress=False)[0]
    assert [q["logit"]["logprobs"] for q in cli.questions["wordnet_mc"]] == [q["logit"]["logprobs"] for q in a]


def test_on_a_restart_only_rank_0_reads_the_checkpoints(monkeypatch, tmp_path):
    import ray.train

    from raycpt.train.worker import session as loop
    calls = []
    monkeypatch.setattr(loop, "verify_checkpoint", lambda d: calls.append(d))
    monkeypatch.setattr(loop, "find_checkpoints", lambda root: calls.append(root) or [])
    monkeypatch.setattr(ray.train, "get_checkpoint", lambda: None)
    session = object.__new__(loop.RaySession)
    session.rank, session.world_size = 1, 2
    session.all_gather_object = lambda obj: ["/rank0/choice", obj]
    with session.checkpoint_dir(str(tmp_path / "resume"), str(tmp_path)) as chosen:
        assert chosen == "/rank0/choice"
    assert calls == []  # rank 1 hashed nothing
    session.rank = 0
    with session.checkpoint_dir(None, str(tmp_path)):
        pass
    assert calls == [str(tmp_path)]


@pytest.mark.parametrize("key", ["full", "train_deep"])
def test_the_chunked_loss_under_fsdp_trains_as_ddp_and_as_the_plain_loss(runs, key):
    root, _ = runs
    f, d = _result(root, f"fsdp-chunked-{key}"), _result(root, f"ddp-chunked-{key}")
    plain = _result(root, f"fsdp-qwen3-{key}")
    np.testing.assert_allclose(f["losses"], d["losses"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(f["losses"], plain["losses"], rtol=1e-5, atol=0)
    # weights against DDP's chunked run (the same arithmetic); against the plain loss only the losses compare:
    # AdamW turns last-bit gradient differences of near-zero entries into lr-sized steps
    wf, wd = _weights(root, f"fsdp-chunked-{key}", STEPS), _weights(root, f"ddp-chunked-{key}", STEPS)
    assert wf.keys() == wd.keys()
    for k in wf:
        torch.testing.assert_close(wf[k], wd[k], rtol=1e-4, atol=1e-5)
