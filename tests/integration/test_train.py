"""raycpt train on Ray with a tiny model: a SIGKILLed worker resumes exactly, a killed driver resumes
with --resume, bad inputs end with one line and no MLflow run left RUNNING."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from raycpt.config import load_config
from raycpt.report.train import read_events


def _corpus(path: Path, n: int = 200) -> Path:
    from raycpt.data.corpus import iter_documents

    with open(path, "w") as f:
        for d in iter_documents(["builtin:wordnet-glosses"], max_documents=n):
            f.write(json.dumps({"text": d}) + "\n")
    return path


def _base(tmp_path, tiny_dir, **train):
    corpus = _corpus(tmp_path / "corpus.jsonl")
    t = dict(max_steps=6, checkpoint_every=2, num_workers=2, cpus_per_worker=0.5, lr=1e-3, micro_batch_size=2)
    t.update(train)
    return [f"model.ref={tiny_dir}", f"data.corpus=[{corpus}]", "data.seq_len=32", "plan.name=train_deep",
            f"tracking.run_root={tmp_path / 'runs'}"] + [f"train.{k}={v}" for k, v in t.items()]


def _statuses(run_root: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    db = run_root / "mlflow.db"
    if not db.exists():
        return []
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return [r.info.status for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_worker_sigkill_resumes_with_identical_losses(ray_local, tmp_path, tiny_dir):
    from train_runs import train_command

    base = _base(tmp_path, tiny_dir)
    clean = train_command(load_config(None, base + ["name=clean"]))
    killed = train_command(load_config(None, base + ["name=killed"]), faults={"sigkill_rank": 1, "sigkill_step": 5})
    assert clean.steps == killed.steps == [1, 2, 3, 4, 5, 6]
    a, b = np.array(clean.losses), np.array(killed.losses)
    assert np.max(np.abs(a - b) / np.abs(a)) <= 1e-5
    events = read_events(killed.run_dir / "train_metrics.jsonl")
    # the worker died at the start of step 5; the group restarted from the step-4 checkpoint
    assert [(e["event"], e["step"]) for e in events] == [("start", 0), ("resume", 4), ("finished", 6)]
    assert (killed.run_dir / ".fault_sigkill_5").is_file()
    assert events[0]["pid"] != events[1]["pid"]
    assert (killed.final_model_dir / "config.json").is_file()
    kept = sorted(p.name for p in (killed.run_dir / "ray").glob("*/checkpoint_*") if p.is_dir())
    assert kept == ["checkpoint_000004", "checkpoint_000006"]  # keep_checkpoints=2
    assert set(_statuses(tmp_path / "runs")) == {"FINISHED"}


@pytest.mark.slow  # 74 s; the sweep's driver SIGKILL + resume (test_sweep_resume.py) stays in the default suite
def test_cli_resume_after_driver_sigkill(ray_local, tmp_path, tiny_dir):
    import ray

    address = ray.get_runtime_context().gcs_address
    args = [sys.executable, "-m", "raycpt.cli", "train"] + _base(tmp_path, tiny_dir, max_steps=8) + \
        [f"ray.address={address}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAYCPT_FAULTS": json.dumps({"step_sleep": 0.6})}
    log = open(tmp_path / "first.log", "w")
    p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    runs = tmp_path / "runs"
    try:
        deadline = time.time() + 900  # a contended 2-core machine can take minutes to start the run
        from raycpt.train.ckpt.manifest import find_checkpoints

        while time.time() < deadline and p.poll() is None:
            if any(len(find_checkpoints(d / "ray")) >= 2 for d in runs.glob("train-default-*")):
                break
            time.sleep(0.5)
        assert p.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        os.killpg(p.pid, signal.SIGKILL)  # the driver (and nothing else: Ray runs on the test's cluster)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        log.close()
    (run_dir,) = list(runs.glob("train-default-*"))
    assert not (run_dir / "final_model").exists()
    first_run_id = json.loads((run_dir / "state.json").read_text())["mlflow_run_id"]
    from raycpt.train.ckpt.manifest import find_checkpoints

    (older_step, _), (_, newest) = find_checkpoints(run_dir / "ray")[-2:]
    weights = newest / "model" / "model.safetensors"
    with open(weights, "r+b") as f:  # half of the newest checkpoint's weights cut off
        f.truncate(weights.stat().st_size // 2)
    done = subprocess.run(args + ["--resume"], env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    skipped = [ln for ln in done.stderr.splitlines() if "skipping checkpoint" in ln]
    assert len(skipped) == 1 and str(newest) in skipped[0] and "model/model.safetensors has" in skipped[0]
    res = json.loads((run_dir / "train_result.json").read_text())
    assert res["steps"] == list(range(1, 9)) and res["resumed_from_step"] == older_step
    assert res["mlflow_run_id"] == first_run_id
    events = [(e["event"], e["step"]) for e in read_events(run_dir / "train_metrics.jsonl")]
    assert events[0] == ("start", 0) and ("resume", res["resumed_from_step"]) in events and events[-1] == ("finished", 8)
    assert (run_dir / "final_model" / "model.safetensors").is_file() and (run_dir / "loss_curve.png").is_file()
    assert "RUNNING" not in _statuses(runs)


def test_bad_inputs_are_one_line_and_leave_no_running_run(ray_local, tmp_path, tiny_dir, capsys, monkeypatch):
    from raycpt.entry import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    base = _base(tmp_path, tiny_dir, num_workers=1, max_steps=3, checkpoint_every=1)
    cases = {
        "empty corpus": ([f"data.corpus=[{empty}]"], "gives no full 32-token blocks"),
        "seq_len": (["data.seq_len=4096"], "beyond this model's limit of 256"),
        "layers out of range": (["plan.name=layers", "plan.layers=[1,9]"], "plan.layers=9 is out of range"),
        "nothing trains": (["plan.name=blocks", "plan.pattern=00"], "trains nothing"),
        "empty side": (["plan.split=0.9"], "leaves the deep side empty"),
    }
    for name, (over, msg) in cases.items():
        rc = main(["train"] + base + over)
        err = capsys.readouterr().err.strip()
        assert rc == 2, name
        assert msg in err and len(err.splitlines()) == 1, (name, err)
    assert "RUNNING" not in _statuses(tmp_path / "runs")
    # a NaN loss at step 2: one line naming the step and the last good checkpoint; the run ends FAILED
    monkeypatch.setenv("RAYCPT_FAULTS", json.dumps({"nan_step": 2}))
    rc = main(["train"] + base)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "training stopped at step 2: the loss is nan; the last good checkpoint is step 1" in err
    assert _statuses(tmp_path / "runs") == ["FAILED"]


def _cli(args, **kw):
    exe = Path(sys.executable).with_name("raycpt")  # the real console script
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, **kw)


def _loss_history(run_root: Path, run_id: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_root / 'mlflow.db'}")
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))


@pytest.mark.slow  # 93 s; test_worker_sigkill_resumes_with_identical_losses stays in the default suite
def test_worker_kill9_from_outside_resumes_exactly_with_one_mlflow_point_per_step(ray_local, tmp_path, tiny_dir):
    """A RayTrainWorker found by its process title among this session's Ray processes, killed with
    kill -9 from outside while it trains: the run finishes with the per-step losses of an
    uninterrupted run, and MLflow holds exactly one loss point per step."""
    import psutil
    import ray

    from train_runs import train_command

    base = _base(tmp_path, tiny_dir, max_steps=10, checkpoint_every=2)
    clean = train_command(load_config(None, base + ["name=clean"]))
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAYCPT_FAULTS": json.dumps({"step_sleep": 0.5})}  # pacing only
    exe = Path(sys.executable).with_name("raycpt")
    log = open(tmp_path / "killed.log", "w")
    p = subprocess.Popen([str(exe), "train", *base, "name=killed", f"ray.address={address}"], env=env, stdout=log,
                         stderr=subprocess.STDOUT)
    victim = None
    try:
        deadline = time.time() + 900
        while time.time() < deadline and p.poll() is None and victim is None:
            metrics = next((tmp_path / "runs").glob("train-killed-*/train_metrics.jsonl"), None)
            if metrics is not None and any('"step": 5,' in ln for ln in metrics.read_text().splitlines()):
                workers = [c for c in psutil.Process().children(recursive=True)  # this session's Ray only
                           if "RayTrainWorker" in " ".join(c.cmdline())]
                assert len(workers) == 2, [c.cmdline() for c in workers]
                victim = workers[-1]
                os.kill(victim.pid, signal.SIGKILL)
            time.sleep(0.1)
        assert victim is not None, (tmp_path / "killed.log").read_text()[-2000:]
        assert p.wait(timeout=900) == 0, (tmp_path / "killed.log").read_text()[-2000:]
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
    (run_dir,) = list((tmp_path / "runs").glob("train-killed-*"))
    res = json.loads((run_dir / "train_result.json").read_text())
    events = [(e["event"], e["step"]) for e in read_events(run_dir / "train_metrics.jsonl")]
    assert ("resume", 4) in events or ("resume", 6) in events, events  # the group restarted from a checkpoint
    assert res["steps"] == clean.steps == list(range(1, 11))
    assert res["losses"] == clean.losses  # bitwise: the resume replays the same data and RNG
    hist = _loss_history(tmp_path / "runs", res["mlflow_run_id"])
    assert [s for s, _ in hist] == list(range(1, 11))  # one point per step, none twice
    assert [v for _, v in hist] == pytest.approx(clean.losses, rel=1e-6)
    assert set(_statuses(tmp_path / "runs")) == {"FINISHED"}


def test_resume_of_a_finished_run_with_a_corrupted_checkpoint(ray_local, tmp_path, tiny_dir):
    """The tryout: a finished 6-step run, half of its newest checkpoint's weights cut off, then
    --resume with max_steps=8: refused in one line; config.yaml and final_model/ untouched (a copy,
    not a link); --resume with the same settings says nothing was re-run."""
    import ray
    from transformers import AutoModelForCausalLM

    address = ray.get_runtime_context().gcs_address
    base = _base(tmp_path, tiny_dir, num_workers=1) + [f"ray.address={address}"]
    first = _cli(["train", *base])
    assert first.returncode == 0, first.stderr[-2000:]
    (run_dir,) = list((tmp_path / "runs").glob("train-default-*"))
    saved_cfg = (run_dir / "config.yaml").read_text()
    newest = sorted((run_dir / "ray").glob("*/checkpoint_000006"))[0]
    weights = newest / "model" / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    before = (run_dir / "final_model" / "model.safetensors").read_bytes()
    again = _cli(["train", *base, "train.max_steps=8", "--resume"])
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stderr
    assert "train.max_steps: 6 -> 8" in again.stderr and "start a new run without --resume" in again.stderr
    assert (run_dir / "config.yaml").read_text() == saved_cfg
    assert (run_dir / "final_model" / "model.safetensors").read_bytes() == before
    AutoModelForCausalLM.from_pretrained(str(run_dir / "final_model"))  # loads
    same = _cli(["train", *base, "--resume"])
    assert same.returncode == 0, same.stderr[-2000:]
    assert "run already finished: nothing re-run" in same.stdout
    assert (run_dir / "config.yaml").read_text() == saved_cfg


def test_lr_inf_and_escaping_name_are_refused_before_anything_runs(tmp_path, tiny_dir):
    base = _base(tmp_path, tiny_dir, num_workers=1)
    for over, msg in [("train.lr=inf", "train.lr='inf': a finite number"),
                      ("train.lr=1e309", "train.lr=inf: a finite number"),
                      ("name=x/../../../escaped", "name='x/../../../escaped': 1-100 letters, digits")]:
        r = _cli(["train", *base, over])
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], r.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escaped").exists()


@pytest.mark.slow  # ~5 min each; the loop-level resume tests in tests/unit/test_lora.py, test_lisa.py run in CI
def test_lora_on_ray_train_two_workers_resumes_exactly_and_publishes_merged_weights(ray_local, tmp_path, tiny_dir):
    """issue 25: a LoRA Mid-Block plan (0110) under DDP on Ray Train; a SIGKILLed worker resumes from base +
    adapters to the same losses; final_model/ is plain HF weights, base everywhere but the adapted linears."""
    import torch
    from safetensors.torch import load_file

    from train_runs import train_command

    base = _base(tmp_path, tiny_dir) + ["plan.name=blocks", "plan.pattern=0110", "plan.adapter=lora",
                                        "plan.lora_rank=4", "train.lr=1e-2"]
    clean = train_command(load_config(None, base + ["name=lora-clean"]))
    killed = train_command(load_config(None, base + ["name=lora-killed"]), faults={"sigkill_rank": 1,
                                                                                   "sigkill_step": 5})
    assert clean.steps == killed.steps == [1, 2, 3, 4, 5, 6]
    a, b = np.array(clean.losses), np.array(killed.losses)
    assert np.max(np.abs(a - b) / np.abs(a)) <= 1e-5
    assert clean.trainable_params == 2 * 4 * 512  # two layers, r * (in + out) over 7 linears (by hand: 512)
    merged, orig = load_file(str(clean.final_model_dir / "model.safetensors")), load_file(str(tiny_dir /
                                                                                          "model.safetensors"))
    assert merged.keys() == orig.keys()
    for k in orig:
        adapted = (".layers.1." in k or ".layers.2." in k) and k.endswith("proj.weight")
        assert torch.equal(merged[k], orig[k]) != adapted, k


@pytest.mark.slow  # ~5 min each; the loop-level resume tests in tests/unit/test_lora.py, test_lisa.py run in CI
def test_lisa_on_ray_train_resumes_a_killed_worker_to_the_same_losses(ray_local, tmp_path, tiny_dir):
    from train_runs import train_command

    base = _base(tmp_path, tiny_dir, num_workers=1, cpus_per_worker=1) + [
        "plan.name=lisa", "plan.lisa_layers=2", "plan.lisa_interval=3", "train.lr=1e-2"]
    clean = train_command(load_config(None, base + ["name=lisa-clean"]))
    killed = train_command(load_config(None, base + ["name=lisa-killed"]), faults={"sigkill_step": 5})
    assert clean.steps == killed.steps == [1, 2, 3, 4, 5, 6]
    assert clean.losses == killed.losses  # one worker, the same draws: bitwise
    events = read_events(killed.run_dir / "train_metrics.jsonl")
    assert [(e["event"], e["step"]) for e in events if e.get("event") in ("start", "resume")] == [("start", 0),
                                                                                                  ("resume", 4)]
