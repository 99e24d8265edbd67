"""What the cluster manifests ask of Kubernetes, Docker and MLflow (issue 48 item 1), checked with those tools' own
rules: the RayJob against KubeRay's RayJob CRD (v1.3.0 and v1.7.0, tests/data/kuberay/), GPU worker pods that
tolerate the ``nvidia.com/gpu`` taint, the launcher's GPU node type started with ``--gpus all`` (Ray's own docker
command builder), and MLflow's Host-header allow-list (MLflow's own matcher) admitting pod networks in 100.64.0.0/10
and RFC 1918, and nothing public."""

from __future__ import annotations

import copy
import gzip
import ipaddress
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
CRDS = ROOT / "tests" / "data" / "kuberay"


def _rayjob() -> dict:
    return yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())


def _crd_schema(tag: str) -> dict:
    crd = yaml.safe_load(gzip.decompress((CRDS / f"ray.io_rayjobs.{tag}.yaml.gz").read_bytes()))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("tag", ["v1.3.0", "v1.7.0"])
def test_the_rayjob_is_valid_against_kuberays_crd(tag):
    import jsonschema

    schema = _crd_schema(tag)
    job = _rayjob()
    jsonschema.validate(job, schema)
    # the validator sees the pod spec: a toleration list written as a mapping is refused
    bad = copy.deepcopy(job)
    group = bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    group["tolerations"] = {"key": "nvidia.com/gpu", "operator": "Exists"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' toleration rule (k8s.io/api core/v1 Toleration.ToleratesTaint): the key matches (or the toleration
    has no key and operator Exists), the effect matches or is empty, and Exists ignores the value while Equal (the
    default operator) compares it."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def test_gpu_worker_pods_tolerate_the_gpu_taint_and_the_head_does_not():
    cluster = _rayjob()["spec"]["rayClusterSpec"]
    gke = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    other = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    gpu_groups = [g for g in cluster["workerGroupSpecs"]
                  if any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
                         for c in g["template"]["spec"]["containers"])]
    assert gpu_groups
    for g in gpu_groups:
        tol = g["template"]["spec"].get("tolerations", [])
        assert _tolerates(tol, gke) and _tolerates(tol, {**gke, "value": "true", "effect": "NoExecute"})
        assert not _tolerates(tol, other)
    assert not _tolerates(cluster["headGroupSpec"]["template"]["spec"].get("tolerations", []), gke)
    # the rule itself: an Equal toleration with another value does not match
    assert not _tolerates([{"key": "nvidia.com/gpu", "value": "x", "effect": "NoSchedule"}], gke)


def test_the_launchers_gpu_node_type_starts_its_container_with_gpus_all():
    from ray.autoscaler._private.docker import docker_start_cmds

    cfg = yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())

    def start_cmd(node_type: str, as_head: bool) -> str:
        # what Ray's autoscaler does: the node type's docker fields update the global ones
        # (StandardAutoscaler._get_node_specific_docker_config), then run_options + head_/worker_run_options
        # (DockerCommandRunner.run_init)
        docker = {**cfg["docker"], **cfg["available_node_types"][node_type].get("docker", {})}
        options = docker.get("run_options", []) + docker.get("head_run_options" if as_head else "worker_run_options", [])
        return docker_start_cmds("ubuntu", docker["image"], {}, docker["container_name"], options, cfg["cluster_name"],
                                 "/home/ray", "docker")

    gpu = start_cmd("gpu_h200", as_head=False)
    assert re.search(r"(^| )--gpus all( |$)", gpu), gpu
    assert "--gpus" not in start_cmd("head", as_head=True)


def _allowed_hosts(text: str) -> list[str]:
    (hosts,) = set(re.findall(r"--allowed-hosts '([^']+)'", text))
    return [h.strip() for h in hosts.split(",")]  # MLflow's own split (server.security_utils)


@pytest.mark.parametrize("manifest", ["rayjob.yaml", "ray-cluster-h200.yaml"])
def test_mlflows_allowed_hosts_admit_pod_networks_and_loopback_only(manifest):
    from mlflow.server.security_utils import is_allowed_host_header

    allowed = _allowed_hosts((CLUSTER / manifest).read_text())
    private = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")]
    # every second octet of 10, 100, 172 and 192, and a few other first octets: allowed exactly when inside a network
    for first in (8, 10, 11, 100, 101, 172, 192, 203):
        for second in range(256):
            ip = ipaddress.ip_address(f"{first}.{second}.37.201")
            want = any(ip in n for n in private)
            for host in (f"{ip}:5000", str(ip)):
                assert is_allowed_host_header(allowed, host) == want, (host, want)
    for host in ("127.0.0.1:5000", "localhost:5000", "localhost"):
        assert is_allowed_host_header(allowed, host)  # kubectl port-forward / the SSH tunnel
    for host in ("mlflow.example.com", "example.com:5000", "1.2.3.4:5000", ""):
        assert not is_allowed_host_header(allowed, host)
