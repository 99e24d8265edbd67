"""The private local Ray starts no idle workers, its workers import :mod:`raycpt.worker_setup` before any work
(no job runtime env, so no wrapper process), and it stops without Ray's one-second wait on its autoscaler monitor:
a real ``init_ray`` and ``shutdown_ray`` in a process of their own (the test session's Ray is not this one)."""

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, time
    import psutil
    import ray._private.node as node
    from raycpt.config import RayConfig
    from raycpt.runtime import init_ray, shutdown_ray

    steps = {}
    original = node.Node._kill_process_impl
    def timed(self, kind, *a, **k):
        t = time.perf_counter()
        try:
            return original(self, kind, *a, **k)
        finally:
            steps[kind] = time.perf_counter() - t
    node.Node._kill_process_impl = timed

    me = psutil.Process()
    assert init_ray(RayConfig(num_cpus=2, object_store_memory=200_000_000))
    time.sleep(2.0)  # idle workers of a prestart appear within a second of the raylet's start
    names = []
    for p in me.children(recursive=True):
        try:
            argv = p.cmdline()
            names.append(" ".join(a for a in argv[:3] if a != "-u") or p.name())  # program and script
        except psutil.Error:
            pass
    import ray  # after the listing: the probe's worker stays (as ray::IDLE) once its task is done

    @ray.remote
    def probe():
        import os, sys
        r = sys.modules.get("torch.distributed.rendezvous")
        return getattr(r, "_raycpt_loopback", False), dict(ray.get_runtime_context().runtime_env)
    patched, worker_env = ray.get(probe.remote())
    t = time.perf_counter()
    shutdown_ray()
    took = time.perf_counter() - t
    time.sleep(0.5)
    left = [p.pid for p in me.children(recursive=True) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"names": names, "steps": steps, "shutdown_s": took, "left": left, "patched": patched,
                      "worker_env": worker_env}))
""")


def test_private_ray_workers_and_stop(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180,
                         env={**__import__("os").environ, "RAY_ADDRESS": ""})
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert any("raylet" in n for n in rec["names"]) and any("monitor.py" in n for n in rec["names"]), rec["names"]
    assert not [n for n in rec["names"] if "ray::IDLE" in n or n.endswith("default_worker.py")], rec["names"]
    # Ray's own stop gives the monitor SIGTERM and a full second before SIGKILL (measured 1.00 s every time)
    assert rec["steps"].get("monitor", 0.0) < 0.5, rec["steps"]
    assert rec["left"] == [], rec
    # a task's worker imported raycpt.worker_setup before it ran (the loopback store), with no runtime env (a
    # worker with one starts through the runtime env agent's wrapper process)
    assert rec["patched"] is True and rec["worker_env"] == {}, rec
