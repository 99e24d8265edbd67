"""Three Ray nodes on this machine, for real: a head and two worker nodes started with ``ray start`` on
127.0.0.1 (tests/integration/local_cluster.py), each worker carrying one ``gpu_slot`` (a stand-in for a GPU:
trials ask for it, the head has none). ``raycpt sweep`` goes in with ``ray job submit``, twice:

1. uninterrupted: Ray's own records (``ray list actors/tasks --detail``) show the two trials' actors on the two
   worker nodes, their ``train`` calls overlapping in time;
2. the same sweep again, with one worker node's raylet SIGKILLed while both trials are past a checkpoint: the
   trial that ran there is retried by Tune on the other node, resumes from its checkpoint, and the sweep
   finishes with one FINISHED MLflow run per trial and the per-step losses of the uninterrupted sweep.

Every listener of the cluster is loopback, and nothing of it is left afterwards (the cluster's teardown runs on
every exit path; its reaper kills the cluster if this process dies or overruns)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from local_cluster import LocalCluster, loopback
from raycpt.config import save_config
from raycpt.runs.location import locate
from test_sweep import tiny_sweep_config

ROOT = Path(__file__).resolve().parents[2]
TRIALS = ["train_shallow-r0.5", "train_deep-r0.5"]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _submit(c: LocalCluster, work: Path, name: str, faults: dict, timeout: float = 600, during=None) -> str:
    """``ray job submit`` one sweep; ``during(elapsed)`` is called while it runs; the job's logs at the end."""
    runtime_env = json.dumps({"env_vars": {"RAYCPT_FAULTS": json.dumps(faults)}})
    entry = ["python", "-m", "raycpt", "sweep", "sweep.yaml", f"name={name}", "--splits", "0.5",
             "--strategies", "train_shallow,train_deep"]
    deadline = time.time() + 120
    while True:  # the dashboard's job agent comes up some seconds after `ray start`: a bounded wait
        sub = c.ray("job", "submit", "--address", c.dashboard, "--working-dir", str(work), "--runtime-env-json",
                    runtime_env, "--no-wait", "--", *entry, timeout=120, check=False)
        if sub.returncode == 0 or "No available agent" not in sub.stdout + sub.stderr or time.time() > deadline:
            break
        time.sleep(3)
    assert sub.returncode == 0, sub.stdout[-2000:] + sub.stderr[-2000:]
    job = re.search(r"raysubmit_\w+", sub.stdout).group(0)
    t0, status = time.time(), ""
    while time.time() - t0 < timeout:
        st = c.ray("job", "status", "--address", c.dashboard, job, timeout=60, check=False)
        status = re.sub(r"\x1b\[[0-9;]*m", "", st.stdout + st.stderr).upper()
        if any(s in status for s in ("SUCCEEDED", "FAILED", "STOPPED")):
            break
        if during is not None:
            during(time.time() - t0)
        time.sleep(1)
    logs = c.ray("job", "logs", "--address", c.dashboard, job, timeout=60, check=False).stdout
    assert "SUCCEEDED" in status, status[-500:] + logs[-5000:]
    return logs


def _trial_actors(c: LocalCluster, seen: set) -> list[dict]:
    """Tune's trial actors (function trainables) that ``seen`` does not hold yet, with their ``train`` tasks."""
    actors = [a for a in c.state("actors", "class_name=ImplicitFunc") if a["actor_id"] not in seen]
    tasks = c.state("tasks")
    for a in actors:
        a["train"] = [t for t in tasks if t.get("actor_id") == a["actor_id"] and t["name"].endswith(".train")]
    seen.update(a["actor_id"] for a in actors)
    return actors


def _ms(value) -> float:
    """A time of Ray's state CLI: ``str(datetime.fromtimestamp(ms / 1000))`` (``Humanify.timestamp``), in ms."""
    import datetime

    return datetime.datetime.fromisoformat(str(value)).timestamp() * 1000


def _interval(actor: dict) -> tuple[float, float]:
    """When the actor's ``train`` calls ran: (first start, last end), ms since the epoch."""
    starts = [_ms(t["start_time_ms"]) for t in actor["train"] if t.get("start_time_ms")]
    ends = [_ms(t["end_time_ms"]) if t.get("end_time_ms") else time.time() * 1000 for t in actor["train"]]
    return min(starts), max(ends)


def _children(uri: str, run_root: Path, name: str) -> tuple:
    """The sweep's parent MLflow run (its id from the run folder's state.json) and its child runs."""
    import mlflow

    (run_dir,) = run_root.glob(f"sweep-{name}-*")
    parent_id = json.loads((run_dir / "state.json").read_text())["mlflow_run_id"]
    client = mlflow.tracking.MlflowClient(uri)
    parent = client.get_run(parent_id)
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    return parent, kids


def _losses(run_root: Path, name: str) -> dict[str, list[float]]:
    (run_dir,) = run_root.glob(f"sweep-{name}-*")
    return {t: json.loads((run_dir / "trials" / t / "train" / "train_result.json").read_text())["losses"]
            for t in TRIALS}


def test_three_nodes_placement_and_a_raylet_killed_mid_trial(tmp_path, tiny_dir):

    cfg = tiny_sweep_config(tmp_path, tiny_dir, [
        "sweep.trace_first=false", "sweep.include_full=false", "train.max_steps=8", "train.checkpoint_every=2",
        "train.max_failures=0", "eval.modes=[logit]", "sweep.max_concurrent_trials=2",
        "sweep.trial_resources={gpu_slot: 1}", "sweep.data_cpus_per_trial=0.5"])
    work = tmp_path / "job"
    work.mkdir()
    save_config(cfg, work / "sweep.yaml")
    run_root = Path(cfg.tracking.run_root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    evidence: dict = {}
    with LocalCluster(env, tmp_path) as c:
        head = c.start_head(num_cpus=2)
        w1 = c.add_worker("w1", 2, {"gpu_slot": 1})
        w2 = c.add_worker("w2", 2, {"gpu_slot": 1})
        alive = {n["node_id"]: n for n in c.state("nodes") if n["state"] == "ALIVE"}
        assert set(alive) == {head.node_id, w1.node_id, w2.node_id}
        workers = {w1.node_id: "w1", w2.node_id: "w2"}

        # 1. uninterrupted: both trials at once, one on each worker node
        seen: set = set()
        _submit(c, work, "ref", {"step_sleep": 0.3})
        ref = _trial_actors(c, seen)
        evidence["ref"] = {workers.get(a["node_id"], a["node_id"]): a["pid"] for a in ref}
        assert {a["node_id"] for a in ref} == set(workers), [(a["node_id"], a["state"]) for a in ref]
        (s1, e1), (s2, e2) = (_interval(a) for a in ref)
        evidence["ref_overlap_s"] = (min(e1, e2) - max(s1, s2)) / 1000
        assert evidence["ref_overlap_s"] > 0, evidence  # two at once

        sockets = c.listening()
        assert sockets and all(loopback(ip) for _, ip, _ in sockets), sockets
        evidence["listeners"] = len(sockets)

        # 2. the same sweep; w1's raylet SIGKILLed once both trials are past a checkpoint and still training
        killed: dict = {}

        def kill_when_ready(elapsed: float) -> None:
            if killed:
                return
            runs = list(run_root.glob("sweep-kill-*/trials"))
            ckpts = [p for p in runs[0].glob("*/train/ray/**/checkpoint_00000[246]")] if runs else []
            per_trial = {t: [p for p in ckpts if f"/{t}/" in str(p)] for t in TRIALS}
            if all(per_trial.values()) and not any(runs[0].glob("*/train/train_result.json")):
                c.kill_raylet(w1)
                killed.update(at_s=round(elapsed, 1), checkpoints={t: sorted(p.name for p in v)
                                                                   for t, v in per_trial.items()})

        logs = _submit(c, work, "kill", {"step_sleep": 1.0}, during=kill_when_ready)
        assert killed, "both trials finished before the raylet could be killed"
        after = _trial_actors(c, seen)
        nodes = {n["node_id"]: n["state"] for n in c.state("nodes")}
        assert nodes[w1.node_id] == "DEAD" and nodes[w2.node_id] == "ALIVE"
        on_w1 = [a for a in after if a["node_id"] == w1.node_id]
        assert on_w1 and all(a["state"] == "DEAD" for a in on_w1)
        assert all("node has died" in str(a.get("death_cause")) for a in on_w1)
        # both trials' train calls ran on w2 in the end: its own and the one retried after w1 died
        assert sum(len(a["train"]) for a in after if a["node_id"] == w2.node_id) >= 2
        evidence["kill"] = {"killed": killed, "actors": [
            (workers.get(a["node_id"]), a["state"], (a.get("death_cause") or {}).get("actor_died_error_context", {})
             .get("error_message", "")[:120], len(a["train"])) for a in after]}
        leftover_listeners = c.listening()
    assert not c.leftovers, c.leftovers
    assert not any(loopback(ip) is False for _, ip, _ in leftover_listeners)

    # the trial that ran on w1: resumed from its checkpoint, on w2
    (run_dir,) = run_root.glob("sweep-kill-*")
    results = {t: json.loads((run_dir / "trials" / t / "train" / "train_result.json").read_text()) for t in TRIALS}
    resumed = {t: r.get("resumed_from_step") for t, r in results.items()}
    victims = [t for t, s in resumed.items() if s]
    assert len(victims) == 1, resumed
    victim = victims[0]
    evidence["resumed"] = {victim: resumed[victim]}
    evidence["attempts"] = {t: json.loads((run_dir / "trials" / t / "train" / "state.json").read_text()).get("attempts")
                            for t in TRIALS}
    print("MULTI-NODE-EVIDENCE " + json.dumps(evidence, default=str), flush=True)
    # a checkpoint the trial wrote before it died (it may have gone on for a step or two after its raylet: a worker
    # notices the raylet's death only when it next talks to it), never the end
    assert 2 <= resumed[victim] < 8 and resumed[victim] % 2 == 0
    assert evidence["attempts"][victim] >= 2

    parent, children = _children(locate(cfg.tracking, check=False).uri, run_root, "kill")
    kids = {r.data.tags["raycpt.trial"]: r for r in children}
    assert sorted(kids) == sorted(TRIALS) and len(children) == 2
    assert all(r.info.status == "FINISHED" for r in children) and parent.info.status == "FINISHED"
    evidence["mlflow_nodes"] = {t: workers.get(r.data.tags.get("raycpt.node_id")) for t, r in kids.items()}
    ref_losses, kill_losses = _losses(run_root, "ref"), _losses(run_root, "kill")
    assert kill_losses == ref_losses and all(len(v) == 8 for v in ref_losses.values())
    evidence["losses"] = kill_losses
    evidence["nodes"] = {"head": head.node_id, "w1": w1.node_id, "w2": w2.node_id}
    print("MULTI-NODE-EVIDENCE " + json.dumps(evidence, default=str))
    assert "sweep finished" in logs
