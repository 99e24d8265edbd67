"""Ray bootstrap: join a cluster when one is named, otherwise start a local Ray fit for this machine.

Only what this module started is shut down. The local Ray we start ourselves is private: every
server it runs (GCS, raylet, object manager, workers, dashboard and its agents, runtime-env agent)
listens on 127.0.0.1 only (:func:`loopback_only`), so turning token authentication (on by default
in Ray 2.60) off for it, which lets CLI clients on the same machine work, exposes nothing to the
network. On a cluster the caller's ``RAY_AUTH_MODE`` / token is left as it is.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import ipaddress
import logging
import os
import re
import signal
import socket
import sys
import termios
import threading
import time
from typing import Callable, Iterator, Optional

from raycpt.config import RayConfig
from raycpt.usage import verbose

log = logging.getLogger(__name__)

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # hub downloads and transformers' weight-loading tqdm bars
    "TQDM_DISABLE": "1",  # every other tqdm bar (lm-eval's request bars, datasets' map): raycpt draws its own
}
"""Environment defaults of the quiet mode (``setdefault``: a user's own setting wins)."""
QUIET_LOGGERS = ("ray.data._internal.progress",)
"""Python loggers lowered to ERROR in the quiet mode (Ray Data's "Progress bars disabled")."""
WORKER_ENV: dict[str, str] = {}
"""Env vars every worker of the next Ray job gets (job runtime env): ``HF_*_OFFLINE`` once raycpt.evaluate_prefetch ran."""


def quiet_environment() -> None:
    """Environment defaults that keep Ray quiet and offline-safe; never overrides a user's choice."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # MLflow's "creating tables" / "experiment does not exist" INFO lines are noise around our output
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # its SQL errors are raised as exceptions too (one line: raycpt.runs); logged, each is a 60-line traceback
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    if not verbose():  # quiet by default; `raycpt --verbose` keeps all of it (errors always show)
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


NOISE = (
    # Ray Data's actor pools always have max_restarts > 0 and their UDF in the object store: the driver's core
    # worker logs this (at level E) for every trace, though nothing is wrong
    re.compile(r"core_worker\.cc:\d+.*has constructor arguments in the object store and max_restarts > 0"),
)
"""Lines of native (C++) log output that the quiet mode drops from this process's stderr."""
_filtered = False


_REAL_STDERR: list[int] = []  # the terminal's stderr while filter_stderr pipes fd 2 through its filter


def _pending(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` (``FIONREAD``); 0 where that cannot be asked."""
    try:
        buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(buf, sys.byteorder)


def filter_stderr(patterns) -> None:
    """Drop lines matching ``patterns`` from everything written to file descriptor 2 by this process
    (Python and native code alike); every other line passes through unchanged. Installed once. At exit
    the original stderr is restored and what is still in the pipe (a traceback) is forwarded first."""
    global _filtered
    if _filtered or not patterns:
        return
    try:
        real = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
    except OSError:  # pragma: no cover - no usable fd 2
        return
    _filtered = True
    _REAL_STDERR.append(real)

    def pump() -> None:
        with os.fdopen(r, "rb", buffering=0) as src:
            for line in iter(src.readline, b""):
                text = line.decode("utf-8", "replace")
                if not any(p.search(text) for p in patterns):
                    os.write(real, line)

    thread = threading.Thread(target=pump, name="raycpt-stderr-filter", daemon=True)
    thread.start()

    def restore() -> None:
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os.dup2(real, 2)  # closes this process's write end: with no other writer the pump reads EOF and stops
        thread.join(timeout=0.2)
        # A child that inherited fd 2 and outlives this point (multiprocessing's resource tracker of a spawn pool)
        # keeps the pipe open, so EOF never comes: forward what this process wrote (still in the pipe), then go,
        # rather than wait out a timeout at every exit (5 s per command did).
        deadline = time.monotonic() + 5
        while thread.is_alive() and _pending(r) and time.monotonic() < deadline:
            time.sleep(0.01)
        thread.join(timeout=0.05)

    atexit.register(restore)


def cluster_address(cfg: RayConfig) -> str | None:
    return cfg.address or os.environ.get("RAY_ADDRESS") or None


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """While a local Ray starts: make it advertise and bind 127.0.0.1 (the node IP every process gets).

    ``ray.init(_node_ip_address="127.0.0.1")`` alone is turned back into the machine's address
    (``services.resolve_ip_for_localhost``) unless Ray's single-machine mode is on - the switch
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets at import time, set here for this start only. With a
    loopback node IP Ray's gRPC servers and agents bind 127.0.0.1 instead of every interface
    (checked by tests/integration/test_private_ray.py, which lists the sockets of a real run)."""
    from ray._private import ray_constants

    old = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def private_worker_setup() -> None:
    """Run in every worker of the local Ray (:mod:`raycpt.worker_setup`): torch.distributed's rendezvous store (the
    TCPStore rank 0 hosts for a multi-worker run) listens on the loopback master address only.

    torch binds that store to every interface and has no bind-address option; it does take an
    already-listening socket (``master_listen_fd``), which this gives it when the master address
    Ray Train hands out is loopback (always, with the local Ray of :func:`init_ray`)."""
    try:  # never fail a worker's start over this: without it the store is as torch makes it
        rdzv = importlib.import_module("torch.distributed.rendezvous")  # (the package attribute is a function)
        from torch.distributed import TCPStore

        original = rdzv._create_c10d_store
    except (ImportError, AttributeError) as e:  # pragma: no cover - torch without distributed / renamed
        log.warning("torch rendezvous store not moved to loopback: %s", e)
        return
    if getattr(rdzv, "_raycpt_loopback", False):
        return

    def create(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank != 0 or not port or not _is_loopback(hostname):
            return original(hostname, port, rank, world_size, timeout, use_libuv)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        return TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True, timeout=timeout,
                        multi_tenant=True, master_listen_fd=sock.detach(), use_libuv=use_libuv)

    rdzv._create_c10d_store = create
    rdzv._raycpt_loopback = True


_SIGTERM_HANDLERS: list = []
"""The handlers :func:`sigterm_as_interrupt` installed, innermost last (re-asserted after Ray starts and stops)."""


def _sigterm_handler(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _reassert_sigterm() -> None:
    """Ray's core worker installs its own SIGTERM handler (it logs and aborts, leaving MLflow runs RUNNING) when
    the driver connects: put the command's back."""
    if _SIGTERM_HANDLERS and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _SIGTERM_HANDLERS[-1])


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``, a scheduler) raises KeyboardInterrupt in the main thread, so a command
    ends KILLED as on Ctrl-C; kept over Ray's own handler (:func:`init_ray`). The one place raycpt handles a
    signal (:func:`raycpt.runs.run.command_run` uses it); the old handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _sigterm_handler)
    _SIGTERM_HANDLERS.append(_sigterm_handler)
    try:
        yield
    finally:
        _SIGTERM_HANDLERS.pop()
        signal.signal(signal.SIGTERM, old)


def init_ray(cfg: RayConfig) -> bool:
    """Initialise Ray once; return True when this call started it (and so must shut it down)."""
    started = _init_ray_here(cfg)
    if started:
        _reassert_sigterm()
    return started


def _init_ray_here(cfg: RayConfig) -> bool:
    """:func:`init_ray` without touching signal handlers (which only the main thread may set)."""
    import ray

    quiet_environment()
    if ray.is_initialized():
        return False
    _start_ray(cfg)
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    except Exception:  # pragma: no cover - older/newer Ray
        pass
    return True


class _EarlyStart:
    """Ray starting in a background thread (:func:`ray_starting`). The thread lives until Ray is shut down, and
    shuts it down itself: Ray's own processes die with the thread that started them (they are spawned with
    ``PR_SET_PDEATHSIG``, which fires when that thread ends), so a thread that returned would take the GCS and
    the raylet with it."""

    def __init__(self, cfg: RayConfig):
        self.cfg, self.started, self.error = cfg, False, None
        self.up, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="raycpt-ray", daemon=True)

    def _run(self) -> None:
        try:
            self.started = _init_ray_here(self.cfg)
        except BaseException as e:  # noqa: BLE001 - the main thread starts it again, and reports what fails there
            self.error = e
        finally:
            self.up.set()
        self.release.wait()
        if self.started and self.error is None:
            shutdown_ray()

    def join(self) -> None:
        """Wait for the start; a failed one is cleaned up here, for :func:`init_ray` to try again in this thread."""
        self.up.wait()
        if self.error is not None:
            import ray

            _stop_watches()
            ray.shutdown()
            self.release.set()


_EARLY: list[_EarlyStart] = []


@contextlib.contextmanager
def ray_starting(cfg: RayConfig) -> Iterator[None]:
    """``with ray_starting(cfg.ray): <set-up that needs no Ray>`` - a grid command's Ray starts in a background
    thread while the driver opens its MLflow run (single-threaded work: the other core is idle); the first
    :func:`ray_session` inside joins it (and starts Ray itself if the background start failed). Ray is shut down
    at the end when it was started here, or earlier by :func:`stop_ray_soon`. Only after the command's checks:
    bad input never starts Ray."""
    import ray

    if _EARLY or ray.is_initialized():
        yield
        return
    early = _EarlyStart(cfg)
    _EARLY.append(early)
    early.thread.start()
    try:
        yield
    finally:
        _EARLY.remove(early)
        early.up.wait()
        early.release.set()
        early.thread.join()
        if early.started:
            _reassert_sigterm()


def shutdown_ray() -> None:
    """``ray.shutdown()`` of a Ray this process started, without its one-second wait on the autoscaler monitor.

    Ray stops its processes one after the other, each with SIGTERM and up to a second to exit before SIGKILL.
    The monitor (the autoscaler's, idle on a local Ray) outlives that second every time: it is stopped after the
    raylet and the GCS and keeps trying to reach them (measured: raylet 0.04 s, GCS 0.02 s, monitor 1.00 s, the
    rest 0.01 s). So it gets the SIGKILL it would get a second later first; the rest stop as Ray stops them."""
    import ray

    _stop_watches()  # what follows stops Ray's processes on purpose
    try:
        from ray._private import ray_constants
        from ray._private import worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        monitors = node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []) if node is not None else []
        for info in monitors:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception as e:  # noqa: BLE001 - another Ray layout: Ray stops it itself, a second later
        log.debug("autoscaler monitor not stopped ahead of ray.shutdown: %s", e)
    ray.shutdown()


# ------------------------------------------------------------------------------------ Ray's own processes dying

WATCH_PRIVATE_RAY = False
"""Whether a private Ray this process starts is watched (:class:`RayWatch`); the console script sets it (the watch
ends the process when Ray's own processes die, which a library caller or a test process must not have)."""
RAY_DEATH_HOOKS: list[Callable[[str], None]] = []
"""Called with the one line when the private Ray's own processes died (:func:`on_ray_death`): each ends its run."""
_WATCHES: list["RayWatch"] = []


@contextlib.contextmanager
def on_ray_death(hook: Callable[[str], None]) -> Iterator[None]:
    """``hook(line)`` runs, inside this block, if the private Ray's GCS or raylet dies (then the process ends)."""
    RAY_DEATH_HOOKS.append(hook)
    try:
        yield
    finally:
        RAY_DEATH_HOOKS.remove(hook)


class RayWatch(threading.Thread):
    """Watches the private Ray's own processes (``gcs_server``, ``raylet``). When one dies (``kill -9``, the OOM
    killer), Ray's core worker ends the driver from C++ a minute later - no Python handler, no stderr line, the run
    left RUNNING and Ray's agents (children of the raylet, then of init) left behind. Here instead, within a few
    seconds: every :data:`RAY_DEATH_HOOKS` runs (the command's run and ``state.json`` end FAILED), every process
    this one started (remembered each beat, so the agents are found after the raylet is gone) is killed, one line
    goes to stderr and the process exits with code 2. A deliberate ``ray.shutdown`` stops the watch first
    (:func:`shutdown_ray`); a process found dead is re-checked after two beats, so a shutdown under way is not a
    death."""

    def __init__(self, beat: float = 1.0):
        super().__init__(name="raycpt-ray-watch", daemon=True)
        self.beat, self.stopped, self.family = beat, threading.Event(), {}
        self.died: Optional[str] = None  # the line of a death seen before a deliberate shutdown stopped the watch

    @staticmethod
    def own_processes() -> list:
        from ray._private import ray_constants
        from ray._private import worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        kinds = (ray_constants.PROCESS_TYPE_GCS_SERVER, ray_constants.PROCESS_TYPE_RAYLET)
        return [(k, info.process) for k in kinds for info in (node.all_processes.get(k, []) if node else [])]

    def remember(self) -> None:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children(recursive=True):
                self.family.setdefault(child.pid, child)

    def run(self) -> None:
        while not self.stopped.wait(self.beat):
            self.remember()
            dead = [(k, p) for k, p in self.own_processes() if p.poll() is not None]
            if dead and not self.stopped.wait(2 * self.beat) and \
                    any(p is q for _, p in dead for _, q in self.own_processes()):
                self.fire(*dead[0])

    def dead_line(self) -> Optional[str]:
        """The one line for the first of Ray's own processes found dead now, else None."""
        for kind, proc in self.own_processes():
            code = proc.poll()
            if code is not None:
                how = (f"killed by signal {-code}{' (kill -9, or the out-of-memory killer)' if code == -9 else ''}"
                       if code < 0 else f"exit code {code}")
                return (f"error: Ray's own {kind} (pid {proc.pid}) died while the command ran ({how}); the run ended "
                        "FAILED and Ray's other processes were stopped; run the same command with --resume to "
                        "continue from the last checkpoint")
        return None

    def fire(self, kind: str, proc) -> None:
        line = self.dead_line() or f"error: Ray's own {kind} (pid {proc.pid}) died while the command ran"
        for hook in list(RAY_DEATH_HOOKS):
            try:
                hook(line)
            except Exception as e:  # noqa: BLE001 - best effort while Ray is gone; the line still comes
                log.debug("ray death hook failed: %s", e)
        self.kill_family()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.write(_REAL_STDERR[0] if _REAL_STDERR else 2, (line + "\n").encode())  # no exit handler drains a pipe
        os._exit(2)

    def kill_family(self) -> None:
        import psutil

        self.remember()
        for p in self.family.values():
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil checks the pid still names the process it remembered
        psutil.wait_procs(list(self.family.values()), timeout=5)


def ray_death_line() -> Optional[str]:
    """When the private Ray's GCS or raylet is dead now (an error a Ray call raised on its way out, before the
    watch's next beat): Ray's other processes are stopped and the one line returned; else None."""
    for watch in list(_WATCHES):
        line = watch.died or (None if watch.stopped.is_set() else watch.dead_line())
        if line is not None:
            watch.stopped.set()
            watch.kill_family()
            return line
    return None


def _watch_private_ray() -> None:
    if WATCH_PRIVATE_RAY:
        _WATCHES.append(RayWatch())
        _WATCHES[-1].start()
        atexit.register(_stop_watches)  # before Ray's own exit handler (last in, first run) stops its processes


def _stop_watches() -> None:
    """Before a deliberate shutdown: each watch stops, keeping the line of a death that came first."""
    for watch in _WATCHES:
        if not watch.stopped.is_set():
            watch.died = watch.dead_line()
            watch.stopped.set()


def stop_ray_soon() -> None:
    """The command needs Ray no more (its grid ran): a Ray that :func:`ray_starting` started begins shutting down
    in its own thread while the driver writes its summary; the end of ``ray_starting`` waits for it."""
    for early in _EARLY:
        early.release.set()


def _start_ray(cfg: RayConfig) -> None:
    import ray

    address = cluster_address(cfg)
    if address:
        host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
        # a loopback address stays loopback (Ray would turn 127.0.0.1 into this machine's IP, which a
        # private Ray does not listen on)
        with loopback_only() if _is_loopback(host) else contextlib.nullcontext():
            ray.init(address=address, log_to_driver=False, ignore_reinit_error=True, logging_level=logging.ERROR,
                     runtime_env={"env_vars": dict(WORKER_ENV)} if WORKER_ENV else None)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    num_cpus = cfg.num_cpus or max(4, os.cpu_count() or 1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # torch.distributed (gloo) pairs on loopback too
    with loopback_only():
        ray.init(
            address="local",  # always a new private instance, never a `ray start` cluster found on this machine
            num_cpus=num_cpus,
            object_store_memory=cfg.object_store_memory,
            include_dashboard=cfg.include_dashboard,
            dashboard_host="127.0.0.1",
            _node_ip_address="127.0.0.1",
            runtime_env={"env_vars": dict(WORKER_ENV)} if WORKER_ENV else None,
            # no idle workers started with the raylet (the driver's registration waits for them, init 3.4 -> 2.7 s,
            # and the job's Tune actors got workers of their own all the same); every worker imports
            # raycpt.worker_setup before it accepts work (the loopback rendezvous store; no job runtime env)
            _system_config={"prestart_worker_first_driver": False, "preload_python_modules": ["raycpt.worker_setup"]},
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=True,
        )
    _watch_private_ray()


@contextlib.contextmanager
def ray_session(cfg: RayConfig, meanwhile=None) -> Iterator[None]:
    """``with ray_session(cfg.ray): ...`` - Ray is up inside, and shut down after if we started it.
    ``meanwhile()``: work that needs no Ray, done while a start begun by :func:`ray_starting` is still under way
    (skipped when Ray is already up: then there is nothing to wait for)."""
    import ray

    if meanwhile is not None and any(not early.up.is_set() for early in _EARLY):
        meanwhile()
    for early in list(_EARLY):  # a start begun by ray_starting: wait for it (a failed one is retried below)
        early.join()
        if early.started and early.error is None:
            _reassert_sigterm()
    started = init_ray(cfg)
    try:
        yield
    finally:
        if started:
            shutdown_ray()
            _reassert_sigterm()
