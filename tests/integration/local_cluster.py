"""A Ray cluster of several nodes on this machine, for tests: a head and worker nodes started with Ray's own
``ray start`` (through :mod:`ray_start_loopback`, so every process binds 127.0.0.1), and torn down whatever
happens to the test.

What belongs to the cluster is marked, not guessed: every ``ray start`` runs in its own session (process group)
with ``RAYCPT_TEST_CLUSTER=<token>`` in its environment, which every Ray process of that node inherits (GCS,
raylet, agents, workers). :meth:`LocalCluster.teardown` SIGKILLs the marked processes until none is left. It does
not call ``ray stop --force``: that ends every Ray process of the machine, other users' and other tests' too.
A reaper process (:func:`_reaper`) does the same teardown if the test process dies (SIGKILL) or overruns
``deadline_s``, so no Ray outlives a killed or hung test."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

START = Path(__file__).with_name("ray_start_loopback.py")
MARK = "RAYCPT_TEST_CLUSTER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:  # field 6 (session id), after the parenthesised command name
        return int(f.read().rsplit(")", 1)[1].split()[3])


def marked(token: str, sessions: frozenset = frozenset()) -> list[psutil.Process]:
    """Every live process of the cluster: in one of ``sessions`` (each ``ray start`` runs in its own session, and
    Ray's processes keep it), or with ``RAYCPT_TEST_CLUSTER=token`` in its environment (a process that left the
    session; a worker that retitled itself (``ray::...``) may have overwritten its environment, hence both)."""
    needle = f"{MARK}={token}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if _session(pid) in sessions:
                found.append(psutil.Process(int(pid)))
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(psutil.Process(int(pid)))
        except (OSError, ValueError, IndexError, psutil.Error):
            continue
    return found


def kill_marked(token: str, sessions: frozenset = frozenset(), timeout: float = 30.0) -> list[str]:
    """SIGKILL the cluster's processes until none is left (a raylet may start a worker meanwhile); what survived."""
    deadline = time.time() + timeout
    while True:
        procs = []
        for p in marked(token, sessions):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                continue
        if not procs or time.time() > deadline:
            return [f"{p.pid} {p.name()}" for p in procs]
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=3)


def _sessions(path: Path) -> frozenset:
    try:
        return frozenset(int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return frozenset()


def _reaper(parent: int, token: str, sessions_file: str, deadline_s: float) -> None:
    """Run in its own process: when ``parent`` is gone or ``deadline_s`` has passed, kill the cluster."""
    end = time.time() + deadline_s
    while psutil.pid_exists(parent) and time.time() < end:
        time.sleep(1)
    kill_marked(token, _sessions(Path(sessions_file)))


def loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


@dataclass
class Node:
    name: str
    pgid: int
    log: Path
    node_id: str = ""
    raylet_pid: int = 0


@dataclass
class LocalCluster:
    """``with LocalCluster(env) as c: c.start_head(); c.add_worker(...)`` - see the module docstring."""

    env: dict
    log_dir: Path
    deadline_s: float = 1500.0
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rcn", dir="/tmp"))  # AF_UNIX paths stay < 108 bytes
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: every Ray process of the cluster (agents, job supervisor, workers)
        # keeps 127.0.0.1 as 127.0.0.1 when it connects (see ray_start_loopback.py)
        self.env = {**self.env, MARK: self.token, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        self.sessions_file = self.temp_dir.with_name(self.temp_dir.name + ".sessions")
        self.env.pop("RAY_ADDRESS", None)
        # this interpreter's `python` first, as in an activated venv (a job's entrypoint names `python`)
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), self.env.get("PATH", "")])
        self.gcs_port, self.dash_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard = f"http://127.0.0.1:{self.dash_port}"
        code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import local_cluster as m; " \
               f"m._reaper({os.getpid()}, {self.token!r}, {str(self.sessions_file)!r}, {self.deadline_s})"
        # the reaper is not marked (it must outlive what it kills); it ends by itself after its kill
        env = {k: v for k, v in self.env.items() if k != MARK}
        self.reaper = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.teardown()

    # ----------------------------------------------------------------------------------- nodes
    def _start(self, name: str, args: list[str]) -> Node:
        log = self.log_dir / f"ray-start-{name}.log"
        with log.open("w") as out:
            # a temp dir per node: nodes that share one share its runtime_resources/ folder, and one node's
            # runtime-env cleanup then deletes the working dir a job's driver runs in on another
            p = subprocess.Popen([sys.executable, str(START), "start", "--node-ip-address=127.0.0.1",
                                  f"--temp-dir={self.temp_dir / name}", "--disable-usage-stats",
                                  f"--dashboard-agent-listen-port={free_port()}",
                                  f"--metrics-export-port={free_port()}",
                                  *args], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            node = Node(name, p.pid, log)
            self.nodes.append(node)
            with self.sessions_file.open("a") as f:  # before anything of the node can outlive a failure here
                f.write(f"{p.pid}\n")
            rc = p.wait(timeout=180)
        if rc != 0:
            raise RuntimeError(f"ray start ({name}) exited {rc}: {log.read_text()[-2000:]}")
        raylets = [q for q in marked(self.token, self.sessions)
                   if q.name() == "raylet" and os.getsid(q.pid) == node.pgid]
        assert len(raylets) == 1, f"{name}: raylets {raylets}"
        node.raylet_pid = raylets[0].pid
        node.node_id = next(a.split("=", 1)[1] for a in raylets[0].cmdline() if a.startswith("--node_id="))
        return node

    def start_head(self, num_cpus: int = 2) -> Node:
        return self._start("head", ["--head", f"--port={self.gcs_port}", "--include-dashboard=true",
                                    "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dash_port}",
                                    f"--ray-client-server-port={free_port()}", f"--num-cpus={num_cpus}",
                                    "--object-store-memory=300000000"])

    def add_worker(self, name: str, num_cpus: int, resources: dict) -> Node:
        return self._start(name, [f"--address={self.address}", f"--num-cpus={num_cpus}",
                                  f"--resources={json.dumps(resources)}", "--object-store-memory=300000000"])

    @property
    def sessions(self) -> frozenset:
        return frozenset(n.pgid for n in self.nodes)

    def kill_raylet(self, node: Node) -> None:
        os.kill(node.raylet_pid, signal.SIGKILL)

    # ----------------------------------------------------------------------------------- clients
    def ray(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Ray's CLI as a client of this cluster (``job submit``, ``list actors`` ...)."""
        p = subprocess.run([sys.executable, str(START), *args], env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args[:3])} exited {p.returncode}: {(p.stdout + p.stderr)[-3000:]}")
        return p

    def state(self, kind: str, *filters: str) -> list[dict]:
        """``ray list KIND --detail --format json`` (Ray's state API): dead actors and finished tasks included."""
        args = ["list", kind, "--address", self.dashboard, "--detail", "--format", "json", "--limit", "10000"]
        for f in filters:
            args += ["--filter", f]
        return json.loads(self.ray(*args).stdout)

    def listening(self) -> dict[tuple, str]:
        """(pid, ip, port) -> process name for every TCP listener of the cluster's processes."""
        out = {}
        for p in marked(self.token, self.sessions):
            try:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        out[(p.pid, c.laddr.ip, c.laddr.port)] = p.name()
            except psutil.Error:
                continue
        return out

    # ----------------------------------------------------------------------------------- teardown
    def teardown(self) -> list[str]:
        left = kill_marked(self.token, self.sessions)
        if self.reaper.poll() is None:
            self.reaper.kill()
            self.reaper.wait()
        import shutil

        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.sessions_file.unlink(missing_ok=True)
        self.leftovers = left
        return left
