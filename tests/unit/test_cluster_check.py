"""`raycpt cluster check FILE`: the shipped launcher YAML and RayJob are refused, one line per placeholder, until a
copy is edited to real-looking values (then exit 0); a region other than provider.region is refused too. And the
launcher / RayJob fixes of issue 39 are in the files: instance profiles, login as the pulling user, capacity
reservations, volume ownership, a head readiness that does not wait on the MLflow sidecar."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from raycpt.entry import main
from raycpt.cluster import check_cluster_file
from raycpt.config import load_config
from raycpt.errors import RaycptError

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
REAL_AMI = "ami-0f1e2d3c4b5a69788"
REAL_FS = "fs-0a1b2c3d4e5f67890"
REAL_IMAGE = "210987654321.dkr.ecr.us-east-1.amazonaws.com/raycpt:0.1.0-ray2.60.0-py311-cu130"


def _placeholder_lines(path: Path) -> dict[int, str]:
    """Line number -> which placeholder, read from the text directly (comment lines left out)."""
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = "" if line.lstrip().startswith("#") else line.split(" #")[0]
        for needle in ("ami-09ee1a996ac214ce7", "fs-EXAMPLE", "registry.example.com"):
            if needle in code:
                out[n] = needle
    return out


NO_FILE = "/nonexistent/raycpt-test-no-aws-file"


def no_aws_environment() -> dict:
    """This environment without AWS credentials (no AWS_* variable, credentials and config files that do not exist,
    no instance metadata): the instance profile lookup is skipped, whatever machine runs the test, and nothing
    reaches the network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "AWS_SHARED_CREDENTIALS_FILE": NO_FILE, "AWS_CONFIG_FILE": NO_FILE, "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    """In-process checks see no AWS credentials either."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.setenv(k, no_aws_environment()[k])


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raycpt", "cluster", "check", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=no_aws_environment())


def _not_checked(stdout: str, path: str) -> None:
    """stdout is the one line saying the launcher's two instance profiles were not checked (no credentials)."""
    (line,) = [ln for ln in stdout.splitlines() if "IAM" in ln]
    assert line.startswith(f"{path}: IAM instance profiles raycpt-head, raycpt-worker not checked: "), line


def test_the_shipped_launcher_yaml_is_refused_one_line_per_placeholder():
    path = CLUSTER / "ray-cluster-h200.yaml"
    expected = _placeholder_lines(path)
    assert set(expected.values()) == {"ami-09ee1a996ac214ce7", "fs-EXAMPLE", "registry.example.com"}
    p = _run_cli("cluster/ray-cluster-h200.yaml")
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stdout.splitlines()) == 1
    _not_checked(p.stdout, "cluster/ray-cluster-h200.yaml")
    lines = p.stderr.splitlines()
    got = {int(m.group(1)): ln for ln in lines for m in [re.match(r"cluster/ray-cluster-h200\.yaml:(\d+): ", ln)]
           if m}
    assert len(got) == len(lines) == len(expected)  # one line each, every line a placeholder line
    for n, needle in expected.items():
        assert needle in got[n], (n, got[n])


def _real_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "cluster"
    shutil.copytree(CLUSTER, folder)
    subprocess.run(["bash", str(folder / "set-image.sh"), REAL_IMAGE], check=True, capture_output=True)
    y = folder / "ray-cluster-h200.yaml"
    y.write_text(y.read_text().replace("ami-09ee1a996ac214ce7", REAL_AMI).replace("fs-EXAMPLE", REAL_FS))
    return folder


def test_an_edited_copy_passes_and_the_same_command_exits_0(tmp_path):
    folder = _real_copy(tmp_path)
    for name in ("ray-cluster-h200.yaml", "rayjob.yaml"):
        assert check_cluster_file(folder / name) == []
    p = _run_cli(str(folder / "ray-cluster-h200.yaml"), str(folder / "rayjob.yaml"))
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and len(p.stdout.splitlines()) == 3 and "us-east-1" in p.stdout
    _not_checked(p.stdout, str(folder / "ray-cluster-h200.yaml"))  # rayjob.yaml names no instance profile


def test_a_region_other_than_provider_region_is_refused(tmp_path, capsys):
    folder = _real_copy(tmp_path)
    y = folder / "ray-cluster-h200.yaml"
    text = y.read_text()
    # the cluster moved to us-west-2, its registry, file system and (commented) AMI region did not
    moved = text.replace("region: us-east-1", "region: us-west-2")
    moved = moved.replace(f"ImageId: {REAL_AMI}   #", f"ImageId: {REAL_AMI}   # us-east-1:")
    y.write_text(moved)
    problems = check_cluster_file(y)
    lines = {n: ln for n, ln in enumerate(moved.splitlines(), 1)}
    ecr = [n for n, ln in lines.items() if "dkr.ecr.us-east-1" in ln and not ln.lstrip().startswith("#")]
    efs = [n for n, ln in lines.items() if ".efs.us-east-1." in ln]
    ami = [n for n, ln in lines.items() if "ImageId:" in ln and not ln.lstrip().startswith("#")]
    assert ecr and efs and len(ami) == 2
    flagged = sorted(int(p.split(":")[1]) for p in problems)
    assert flagged == sorted(ecr + efs + ami), problems
    assert all("provider.region is us-west-2" in p for p in problems)
    # in-process, through the CLI's own entry: exit 2, the lines on stderr
    assert main(["cluster", "check", str(y)]) == 2
    assert capsys.readouterr().err.count("provider.region is us-west-2") == len(problems)


@pytest.mark.parametrize("line, what", [
    ("      CapacityReservationSpecification: {CapacityReservationTarget: {CapacityReservationId: cr-EXAMPLE}}",
     "capacity reservation cr-EXAMPLE"),
    ("      IamInstanceProfile: {Arn: arn:aws:iam::123456789012:instance-profile/raycpt}", "example account"),
    ("      ImageId: ami-0abcdef1234567890", "placeholder of AWS's EC2"),
    ("  image: 111122223333.dkr.ecr.us-east-1.amazonaws.com/raycpt:1", "example account 111122223333"),
    ("  - aws ecr get-login-password --region eu-west-1 | docker login", "region eu-west-1 in a command"),
])
def test_each_kind_of_placeholder_is_one_line(tmp_path, line, what):
    f = tmp_path / "c.yaml"
    f.write_text(f"provider:\n  type: aws\n  region: us-east-1\nx:\n{line}\n")
    problems = check_cluster_file(f)
    assert len(problems) == 1 and what in problems[0] and problems[0].startswith(f"{f}:5: ")
    # the same line commented out is documentation, not configuration
    f.write_text(f"provider:\n  region: us-east-1\n# {line.strip()}\n")
    assert check_cluster_file(f) == []


@pytest.mark.parametrize("name, text, why", [("missing.yaml", None, "cluster file not found: "),
                                             ("bad.yaml", "a: [1, 2\n", r"is not valid YAML at line \d+: ")])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, name, text, why):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(RaycptError, match=why):
        check_cluster_file(path)
    assert main(["cluster", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------------------------------- what the files now hold (issue 39)
def test_every_launcher_node_pulls_the_private_image_as_the_user_that_pulls():
    cfg = yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())
    for name, node in cfg["available_node_types"].items():
        assert node["node_config"]["IamInstanceProfile"]["Name"], name  # ECR read on every node type
    login = next(c for c in cfg["initialization_commands"] if "docker login" in c)
    assert "sudo docker" not in login and "| docker login" in login
    assert not re.search(r"--region [a-z]", login)  # the region comes from the registry host, not a literal
    # the region the login derives from an ECR host is that host's region
    sed = re.search(r"sed -n -E '([^']+)'", login).group(1)
    host = "210987654321.dkr.ecr.ap-southeast-2.amazonaws.com"
    got = subprocess.run(["sed", "-n", "-E", sed], input=host + "\n", capture_output=True, text=True).stdout
    assert got.strip() == "ap-southeast-2"
    gpu = cfg["available_node_types"]["gpu_h200"]["node_config"]
    assert gpu["CapacityReservationSpecification"] == {"CapacityReservationPreference": "open"}
    text = (CLUSTER / "ray-cluster-h200.yaml").read_text()
    assert "# InstanceMarketOptions: {MarketType: capacity-block}" in text  # the Capacity Block option, documented


def test_the_rayjob_head_is_ready_without_the_sidecar_and_its_volumes_are_writable():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["securityContext"]["fsGroup"] == 100
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert group["template"]["spec"]["securityContext"]["fsGroup"] == 100
    (init,) = head["initContainers"]
    assert init["securityContext"]["runAsUser"] == 0
    script = " ".join(init["args"])
    made, owned = script.split("&&")
    cfg = load_config(CLUSTER.parent / "configs" / "qwen3-0.6b.yaml")
    mlflow = next(c for c in head["containers"] if c["name"] == "mlflow")
    db_dir = re.search(r"sqlite:///(/\S+)/mlflow\.db", " ".join(mlflow["args"])).group(1)
    artifacts = re.search(r"--artifacts-destination ([^\s;]+)", " ".join(mlflow["args"])).group(1)
    for folder in (cfg.tracking.run_root, cfg.model.cache_dir, cfg.data.store_dir, artifacts, db_dir, "/mnt/shared/hf"):
        assert folder in made.split() and folder in owned.split(), folder
    assert "chown 1000:100" in owned
    assert "readinessProbe" not in mlflow and "until mlflow server" in " ".join(mlflow["args"])
    # the job waits for the sidecar in its own process (tracking.wait_s; tests/unit/test_cluster_rayjob_submit.py)
    assert "tracking.wait_s=300" in job["spec"]["entrypoint"].split()
