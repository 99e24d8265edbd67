"""The Ray that raycpt starts is private: while a real 2-worker `raycpt train` runs (its own local
Ray, not the test session's), every socket that any process of THAT run listens on (the CLI
driver and its descendants: GCS, raylet, agents, workers, the torch process group) is loopback."""

import ipaddress
import os
import subprocess
import sys
import time

import psutil

from test_train import _base


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if getattr(addr, "ipv4_mapped", None) is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _listening(root: psutil.Process) -> dict[tuple, str]:
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            name = f"{p.name()} {' '.join(p.cmdline())[-120:]}"
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and c.laddr):  # TCP listeners, bound UDP
                    out[(p.pid, c.laddr.ip, c.laddr.port)] = name
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def test_local_ray_of_a_run_listens_on_loopback_only(tmp_path, tiny_dir):
    args = [sys.executable, "-m", "raycpt.cli", "train"] + _base(tmp_path, tiny_dir, max_steps=400,
                                                                  checkpoint_every=100) + \
        ["ray.num_cpus=4", "ray.include_dashboard=true"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log = open(tmp_path / "train.log", "w")
    p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    metrics = None
    seen: dict = {}
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            metrics = next((tmp_path / "runs").glob("train-default-*/train_metrics.jsonl"), None)
            if metrics is not None and '"step": 3' in metrics.read_text():
                break
            time.sleep(0.5)
        assert p.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        for _ in range(3):  # a few looks while the workers train
            seen.update(_listening(psutil.Process(p.pid)))
            time.sleep(1)
    finally:
        if p.poll() is None:
            p.terminate()  # the CLI shuts down the Ray it started
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        log.close()
    names = " ".join(seen.values())
    assert "gcs_server" in names and "raylet" in names and "RayTrainWorker" in names, seen
    exposed = {k: v for k, v in seen.items() if not _loopback(k[1])}
    assert not exposed, f"listening beyond loopback: {exposed}"
    print(f"{len(seen)} listening sockets, all loopback:", sorted({ip for _, ip, _ in seen}))
