"""`raycpt cluster check` reads the parsed YAML (issue 48 item 3, issue 51's cluster-check cases): every image-valued
key of the Ray launcher schema and of Kubernetes manifests (``image``, ``head_image``, ``worker_image``) in block or
flow style, availability zones against ``provider.region``; and it reads the file through the one bounded reader of
``config validate``: ``/dev/zero``, a FIFO nobody writes, a directory, non-UTF-8 bytes, a 60 MB file and an alias
bomb each end in one line, exit 2, within about a second and < 200 MB (the child's own VmHWM)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raycpt.cluster import check_cluster_file
from raycpt.errors import RaycptError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "registry.example.com/raycpt:0.1.0"
REAL = "210987654321.dkr.ecr.us-east-1.amazonaws.com/raycpt:0.1.0"


def _line_of(text: str, needle: str) -> int:
    """The 1-based line of the only line holding ``needle`` (read from the text, not from the checker)."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, hits
    return hits[0]


# --------------------------------------------------------------------------------- every image key, any style
LAUNCHER = "provider: {{type: aws, region: us-east-1}}\n"
CASES = {
    "docker.image, block": LAUNCHER + "docker:\n  image: {img}\n",
    "docker.image, flow": LAUNCHER + "docker: {{image: {img}, container_name: ray}}\n",
    "docker.head_image": LAUNCHER + "docker:\n  image: rayproject/ray:2.60.0\n  head_image: {img}\n",
    "docker.worker_image, flow": LAUNCHER + "docker: {{image: rayproject/ray:2.60.0, worker_image: '{img}'}}\n",
    "node type docker.worker_image": LAUNCHER + ("available_node_types:\n  gpu:\n    node_config: {{}}\n"
                                                 "    docker: {{worker_image: \"{img}\"}}\n"),
    "RayJob container, flow": ("apiVersion: ray.io/v1\nkind: RayJob\nspec:\n  rayClusterSpec:\n    headGroupSpec:\n"
                               "      template:\n        spec:\n"
                               "          containers: [{{name: ray-head, image: {img}}}]\n"),
    "init container, flow list item": ("kind: RayCluster\nspec:\n  headGroupSpec:\n    template:\n      spec:\n"
                                       "        initContainers:\n          - {{name: owner, image: {img}}}\n"),
    "second document of a manifest": "kind: ConfigMap\ndata: {{a: b}}\n---\nkind: Pod\nspec:\n  containers:\n"
                                     "  - name: x\n    image: >-\n      {img}\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_example_registry_in_any_image_key_is_one_line_and_a_real_one_passes(tmp_path, case):
    f = tmp_path / "c.yaml"
    text = CASES[case].format(img=EXAMPLE)
    f.write_text(text)
    problems = check_cluster_file(f)
    assert problems == [f"{f}:{_line_of(text, EXAMPLE)}: registry registry.example.com is an example: write your "
                        "registry (cluster/image.env, then cluster/set-image.sh)"]
    f.write_text(CASES[case].format(img=REAL))
    assert check_cluster_file(f) == []


@pytest.mark.parametrize("image", ["<your-image>", "your-registry/raycpt:1", "raycpt:CHANGEME"])
def test_a_placeholder_image_without_a_registry_host_is_refused(tmp_path, image):
    f = tmp_path / "c.yaml"
    f.write_text(f"spec:\n  containers: [{{name: a, image: '{image}'}}]\n")
    (problem,) = check_cluster_file(f)
    assert problem.startswith(f"{f}:2: ") and "image" in problem


def test_the_cli_refuses_a_flow_style_placeholder_image_that_the_line_reader_passed(tmp_path):
    """Issue 48: `containers: [{name: x, image: registry.example.com/...}]` passed with exit 0."""
    f = tmp_path / "job.yaml"
    f.write_text("kind: RayJob\nspec:\n  containers: [{name: x, image: registry.example.com/raycpt:1}]\n")
    p = subprocess.run([sys.executable, "-m", "raycpt", "cluster", "check", str(f)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"{f}:3: registry registry.example.com is an example: write your registry "
                                     "(cluster/image.env, then cluster/set-image.sh)"]


def test_an_availability_zone_outside_provider_region_is_refused(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("provider: {type: aws, region: us-east-1, availability_zone: 'us-east-1a,us-west-2b'}\n"
                 "available_node_types:\n  gpu:\n    node_config:\n      Placement: {AvailabilityZone: eu-west-1a}\n")
    assert check_cluster_file(f) == [
        f"{f}:1: availability_zone us-west-2b is not in provider.region us-east-1",
        f"{f}:5: AvailabilityZone eu-west-1a is not in provider.region us-east-1"]


def test_an_anchored_placeholder_is_reported_once_at_its_anchor(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: &img registry.example.com/x:1\nb: [*img, *img]\nc: {image: *img}\n")
    (problem,) = check_cluster_file(f)
    assert problem.startswith(f"{f}:1: registry registry.example.com")


# --------------------------------------------------------------------------------- the bounded reader
def _bomb(levels: int = 9, width: int = 9) -> str:
    """A billion-laughs YAML: level k is a list of ``width`` aliases of level k-1 (width**levels leaves)."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * width) + "]" for k in range(1, levels)]
    return "\n".join(lines) + "\n"


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.fifo"
    os.mkfifo(path)  # nobody ever opens it for writing: an open() for reading would block forever
    return path


def _make(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """(path, the phrase its one line must hold)."""
    if kind == "/dev/zero":
        return Path("/dev/zero"), "is a device, not a regular file"
    if kind == "fifo":
        return _fifo(tmp_path), "is a FIFO (named pipe), not a regular file"
    if kind == "directory":
        return tmp_path, "is a directory; expected a file"
    if kind == "non-utf8":
        path = tmp_path / "latin1.yaml"
        data = b"provider:\n  region: us-east-1\n# caf\xe9\n"
        path.write_bytes(data)
        return path, f"is not UTF-8 text (byte 0xe9 at offset {data.index(0xe9)})"
    if kind == "60 MB":
        path = tmp_path / "big.yaml"
        with open(path, "wb") as f:
            chunk = b"".join(b"key%06d: value\n" % i for i in range(4096))
            while f.tell() < 60_000_000:
                f.write(chunk)
        return path, f"is {path.stat().st_size:,} bytes; a cluster file is at most 1,048,576 bytes"
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    assert 9 ** 9 > 100_000_000  # what it would expand to
    return path, "expands to more than 100,000 nodes through its aliases"


KINDS = ["/dev/zero", "fifo", "directory", "non-utf8", "60 MB", "alias bomb"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_file_is_one_line_within_a_second_in_process(tmp_path, kind):
    path, phrase = _make(kind, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(RaycptError) as e:
        check_cluster_file(path)
    assert time.monotonic() - t0 < 1.0
    assert phrase in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


#: runs before the measured program in the child: caps its address space at 2 GiB (a regression cannot take the
#: machine down) and, at exit, writes the child's own VmHWM (peak RSS of this process image, from the kernel) to
#: $PEAK_FILE. A fork's ru_maxrss would not do: Linux carries the parent's (pytest's) high-water mark across exec.
PRELUDE = ("import atexit, os, resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
           "atexit.register(lambda: open(os.environ['PEAK_FILE'], 'w').write("
           "open('/proc/self/status').read().split('VmHWM:')[1].split()[0])); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def _run_bounded(script: Path, args: list[str], tmp_path: Path, limit_s: float = 20.0):
    """Run ``python SCRIPT ARGS`` in a child; (exit code, stdout, stderr, wall seconds, peak RSS in KiB)."""
    peak = tmp_path / f"peak-{time.monotonic_ns()}"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", PRELUDE, str(script), *args], capture_output=True, text=True,
                       timeout=limit_s, cwd=ROOT, env={**os.environ, "PEAK_FILE": str(peak)})
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0, int(peak.read_text())


CLI = ROOT / "raycpt" / "__main__.py"


@pytest.mark.parametrize("kind", KINDS)
def test_the_cli_on_a_bad_file_is_one_line_exit_2_bounded_in_time_and_memory(tmp_path, kind):
    path, phrase = _make(kind, tmp_path)
    code, out, err, wall, peak_kib = _run_bounded(CLI, ["cluster", "check", str(path)], tmp_path)
    assert code == 2, (code, err[-2000:])
    assert out == "" and len(err.splitlines()) == 1 and phrase in err and "Traceback" not in err
    assert peak_kib < 200 * 1024, f"{peak_kib / 1024:.0f} MB"
    assert wall < 3.0, wall  # interpreter start included (~0.3 s here); the check itself is < 1 s (test above)


def test_config_validate_and_cluster_check_read_a_file_the_same_way(tmp_path):
    """One reader: the same refusal, word for word after the file's role, from both commands."""
    fifo = _fifo(tmp_path)
    lines = {}
    for cmd in (["config", "validate"], ["cluster", "check"]):
        code, _, err, _, _ = _run_bounded(CLI, [*cmd, str(fifo)], tmp_path)
        assert code == 2
        lines[cmd[0]] = err.strip()
    assert lines["config"] == f"error: config file {fifo} is a FIFO (named pipe), not a regular file; expected a file"
    assert lines["cluster"] == f"error: cluster file {fifo} is a FIFO (named pipe), not a regular file; expected a file"


def test_the_measurement_is_the_childs_own(tmp_path):
    """The peak reading is the child's: one that touches 300 MB reads above the 200 MB bound, one that does nothing
    reads far below it, whatever this (pytest) process holds."""
    big, small = tmp_path / "big.py", tmp_path / "small.py"
    big.write_text("b = bytearray(300 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\nprint(len(b))\n")
    small.write_text("print(0)\n")
    code, out, _, _, peak_kib = _run_bounded(big, [], tmp_path)
    assert code == 0 and int(out) == 300 * 1024 * 1024 and peak_kib > 280 * 1024
    code, out, _, _, peak_kib = _run_bounded(small, [], tmp_path)
    assert code == 0 and out == "0\n" and peak_kib < 60 * 1024
