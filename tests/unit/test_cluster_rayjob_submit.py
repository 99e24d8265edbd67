"""The RayJob's entrypoint is ONE process that Ray runs as the job (issue 48 item 1).

KubeRay does not hand the entrypoint to Ray as an argument list: its submitter joins a `ray job submit` command line
into one string and runs it with bash. Reproduced here from ray-project/kuberay's source, in a real bash with a fake
``ray`` (and a logging ``python``) on PATH:

* v1.7.0, ``ray-operator/controllers/ray/common/job.go`` ``BuildJobSubmitCommand`` (K8sJobMode, the default): a wait
  loop on the dashboard's ``api/gcs_healthz`` (``utils.BasePythonHealthCommand``: ``python -c "..."``), then
  ``if ! ray job status --address A ID >/dev/null 2>&1 ; then ray job submit --address A --no-wait
  --runtime-env-json "<strconv.Quote(json)>" --submission-id ID -- <entrypoint> ; fi ; ray job logs --address A
  --follow ID``; ``rayjob_controller.go`` ``configureSubmitterContainer`` runs it as ``/bin/bash -ce -- <the words
  joined by spaces>`` (``utils.GetContainerCommand([]string{"e"})``).
* v1.3.0, the same file's ``GetK8sJobCommand``: ``if ray job status ... ; then ray job logs ... ; else ray job submit
  ... -- <entrypoint> ; fi`` run as ``/bin/bash -c <joined>``.

The entrypoint is pasted unquoted into that string, so the submitter's shell splits it at ``&&``, ``;`` or ``|``:
with b5f7586's ``wait_for_tracking.py 300 && python -m raycpt sweep ...`` Ray ran only the wait and the sweep ran in
the submitter pod. The checks below pass on the shipped manifest and fail on that entrypoint.
"""

from __future__ import annotations

import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from raycpt.cluster import wait_for_server
from raycpt.errors import ServerUnreachable

ROOT = Path(__file__).resolve().parents[2]
RAYJOB = ROOT / "cluster" / "rayjob.yaml"
#: cluster/rayjob.yaml's entrypoint at b5f7586 (issue 48), word for word
OLD_ENTRYPOINT = ("python /home/ray/raycpt/scripts/wait_for_tracking.py 300 && "
                  "python -m raycpt sweep /home/ray/raycpt/configs/qwen3-0.6b.yaml --splits 0.33,0.5,0.66")
JOB_ID = "raycpt-sweep-x7k2p"

FAKE_RAY = """#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({{"prog": "ray", "argv": args}}) + "\\n")
if args[:2] == ["job", "status"]:
    sys.exit(1)  # not submitted yet: the submitter goes on to submit
if args[:2] == ["job", "submit"]:
    entry = args[args.index("--") + 1:]
    # what Ray's CLI makes of it (ray/dashboard/modules/job/cli.py: entrypoint=list2cmdline(entrypoint))
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps({{"job_entrypoint": subprocess.list2cmdline(entry)}}) + "\\n")
"""
#: a ``python`` for the submitter's shell: KubeRay's own health probe (``python -c``) runs for real; anything else
#: is logged as "ran in the submitter pod" and exits 0 without running
FAKE_PYTHON = """#!/bin/bash
if [ "$1" = "-c" ]; then exec {python} "$@"; fi
{python} -c 'import json, os, sys; open(os.environ["FAKE_LOG"], "a").write(json.dumps({{"prog": "python", "argv": sys.argv[1:]}}) + "\\n")' "$@"
"""


class _Dashboard(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b"success" if self.path == "/api/gcs_healthz" else b"no"
        self.send_response(200 if body == b"success" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def dashboard():
    """A stand-in for Ray's dashboard health endpoint on 127.0.0.1 (KubeRay >= 1.5 waits for it)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` for printable ASCII (what a runtime env JSON holds here): double quotes, ``\\"`` and
    ``\\\\`` escaped, control characters as ``\\n``/``\\t``; refuses anything else rather than guess."""
    assert all(32 <= ord(c) < 127 or c in "\n\t" for c in s), "only printable ASCII is reproduced"
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def kuberay_submitter(spec: dict, dashboard_url: str, version: str) -> list[str]:
    """The submitter container's command and args for this RayJob ``spec`` (see the module docstring)."""
    address = "http://" + dashboard_url
    entrypoint = spec["entrypoint"].strip()
    env_json = json.dumps(yaml.safe_load(spec["runtimeEnvYAML"]), separators=(",", ":"), sort_keys=True)
    submit = ["ray", "job", "submit", "--address", address]
    options = ["--runtime-env-json", go_quote(env_json), "--submission-id", JOB_ID]
    for key, flag in (("entrypointNumCpus", "--entrypoint-num-cpus"), ("entrypointNumGpus", "--entrypoint-num-gpus")):
        if spec.get(key):
            options += [flag, f"{float(spec[key]):f}"]
    status = ["ray", "job", "status", "--address", address, JOB_ID, ">/dev/null", "2>&1"]
    logs = ["ray", "job", "logs", "--address", address, "--follow", JOB_ID]
    if version == "v1.3.0":
        words = ["if", *status, ";", "then", *logs, ";", "else", *submit, *options, "--", entrypoint, ";", "fi"]
        return ["/bin/bash", "-c", " ".join(words)]
    health = (f"python -c \"import urllib.request; r=urllib.request.urlopen('{address}/api/gcs_healthz', "
              f"timeout=10); exit(0 if b'success' in r.read() else 1)\"")
    wait = ["until", health, ">/dev/null", "2>&1", ";", "do", "echo", go_quote(f"Waiting for Ray Dashboard GCS to "
            f"become healthy at {address} ..."), ";", "sleep", "2", ";", "done", ";"]
    words = [*wait, "if", "!", *status, ";", "then", *submit, "--no-wait", *options, "--", entrypoint, ";", "fi", ";",
             *logs]
    return ["/bin/bash", "-ce", "--", " ".join(words)]


def run_submitter(spec: dict, dashboard_url: str, version: str, tmp_path: Path) -> list[dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("ray", FAKE_RAY), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), "HOME": str(tmp_path)}
    p = subprocess.run(kuberay_submitter(spec, dashboard_url, version), env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def check_one_job(calls: list[dict], spec: dict) -> None:
    """The whole entrypoint reached `ray job submit` as the job's command, and nothing but KubeRay's own commands
    ran in the submitter's shell."""
    submitted = [c["job_entrypoint"] for c in calls if "job_entrypoint" in c]
    assert len(submitted) == 1, calls
    assert shlex.split(submitted[0]) == shlex.split(spec["entrypoint"]), (submitted[0], spec["entrypoint"])
    in_shell = [c["argv"] for c in calls if c.get("prog") == "python"]
    assert in_shell == [], f"ran in the submitter pod, not as the Ray job: {in_shell}"
    runtime_env = [c["argv"] for c in calls if c.get("prog") == "ray" and c["argv"][:2] == ["job", "submit"]][0]
    env_json = runtime_env[runtime_env.index("--runtime-env-json") + 1]
    assert json.loads(env_json) == yaml.safe_load(spec["runtimeEnvYAML"])  # the env arrives intact through bash


@pytest.mark.parametrize("version", ["v1.7.0", "v1.3.0"])
def test_kuberay_submits_the_whole_sweep_as_the_ray_job(tmp_path, dashboard, version):
    spec = yaml.safe_load(RAYJOB.read_text())["spec"]
    words = shlex.split(spec["entrypoint"])
    assert words[:4] == ["python", "-m", "raycpt", "sweep"] and "tracking.wait_s=300" in words
    calls = run_submitter(spec, dashboard, version, tmp_path)
    check_one_job(calls, spec)
    assert [c["argv"][:2] for c in calls if c.get("prog") == "ray"] == (
        [["job", "status"], ["job", "submit"], ["job", "logs"]] if version == "v1.7.0" else
        [["job", "status"], ["job", "submit"]])


@pytest.mark.parametrize("version", ["v1.7.0", "v1.3.0"])
def test_the_same_check_fails_on_the_old_and_entrypoint(tmp_path, dashboard, version):
    spec = {**yaml.safe_load(RAYJOB.read_text())["spec"], "entrypoint": OLD_ENTRYPOINT}
    calls = run_submitter(spec, dashboard, version, tmp_path)
    with pytest.raises(AssertionError):
        check_one_job(calls, spec)
    # what happened instead: Ray got the wait alone, the sweep ran in the submitter's shell
    (submitted,) = [c["job_entrypoint"] for c in calls if "job_entrypoint" in c]
    assert submitted == "python /home/ray/raycpt/scripts/wait_for_tracking.py 300"
    assert [c["argv"] for c in calls if c.get("prog") == "python"] == [
        ["-m", "raycpt", "sweep", "/home/ray/raycpt/configs/qwen3-0.6b.yaml", "--splits", "0.33,0.5,0.66"]]


# ------------------------------------------------------------------ the wait, inside raycpt (tracking.wait_s)
class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


def test_wait_s_waits_for_a_server_that_starts_late(tmp_path):
    """The MLflow container may start after Ray's head is Ready: the sweep waits for it in its own process."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    servers = []

    def start_late():
        time.sleep(1.5)
        servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", port), _Health))
        servers[0].serve_forever()

    said: list[str] = []
    thread = threading.Thread(target=start_late, daemon=True)
    t0 = time.monotonic()
    thread.start()
    try:
        wait_for_server(f"http://127.0.0.1:{port}", 30, poll_s=0.2, say=said.append)
        waited = time.monotonic() - t0
    finally:
        while not servers:
            time.sleep(0.05)
        servers[0].shutdown()
        servers[0].server_close()
        thread.join(5)
    assert 1.4 < waited < 10 and said == [f"raycpt: waiting up to 30 s for the MLflow server at "
                                          f"http://127.0.0.1:{port} (tracking.wait_s)"]


def test_wait_s_gives_up_in_one_line_after_the_wait(tmp_path):
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens: refused at once, every time
    t0 = time.monotonic()
    with pytest.raises(ServerUnreachable) as e:
        wait_for_server(f"http://127.0.0.1:{port}", 1.0, poll_s=0.2, say=lambda _: None)
    assert 1.0 <= time.monotonic() - t0 < 6
    assert "\n" not in str(e.value) and "(waited 1 s, tracking.wait_s)" in str(e.value)
    with pytest.raises(ServerUnreachable) as e:  # wait_s=0: one probe, the plain line
        wait_for_server(f"http://127.0.0.1:{port}", 0, say=lambda _: pytest.fail("no wait announced"))
    assert "waited" not in str(e.value)


def test_the_shipped_entrypoint_waits_in_the_sweep_process_then_refuses_in_one_line(tmp_path):
    """The RayJob's own words, run by the real CLI (the config path mapped to this checkout, the run root and the
    server's address to this machine, the wait shortened): the sweep parses them and waits itself, before any
    model or Ray work, then gives up in one line."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    words = shlex.split(yaml.safe_load(RAYJOB.read_text())["spec"]["entrypoint"])
    words = [str(ROOT / "configs" / Path(w).name) if w.startswith("/home/ray/raycpt/configs/") else
             "tracking.wait_s=2" if w.startswith("tracking.wait_s=") else w for w in words]
    words += [f"tracking.run_root={tmp_path / 'runs'}"]
    env = {**os.environ, "RAYCPT_TRACKING_URI": f"http://127.0.0.1:{port}"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert lines[0] == f"raycpt: waiting up to 2 s for the MLflow server at http://127.0.0.1:{port} (tracking.wait_s)"
    assert len(lines) == 2 and lines[1].startswith(f"error: tracking.uri http://127.0.0.1:{port}: no MLflow server")
    assert lines[1].endswith("(waited 2 s, tracking.wait_s)") and time.monotonic() - t0 >= 2
    assert not (tmp_path / "runs").exists()  # refused before any work
