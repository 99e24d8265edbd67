"""cluster/ manifests checked with Ray's own validators: the launcher YAML against the cluster-config JSON
schema shipped in the ray package, the runtime envs through Ray's RuntimeEnv parser, one image everywhere
whose Ray version is constraints.txt's pin (a mutated copy shows the check failing), and a Dockerfile that
installs the CUDA torch and raycpt from constraints.txt."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
IMAGE_RE = re.compile(r"^\s*(?:-\s*)?image:\s*(\S+)", re.M)


def ray_schema() -> dict:
    import ray

    return json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())


def image_refs(folder: Path) -> dict[str, list[str]]:
    """Every image a manifest names: ``image:`` keys, ``IMAGE=`` of image.env, the Dockerfile's FROM."""
    refs: dict[str, list[str]] = {}
    for f in sorted(folder.glob("*.yaml")):
        refs[f.name] = IMAGE_RE.findall(f.read_text())
    env = (folder / "image.env").read_text()
    refs["image.env"] = re.findall(r"^IMAGE=(\S+)", env, re.M)
    return {k: v for k, v in refs.items() if v}


def check_images(folder: Path, ray_version: str) -> str:
    """The one image of ``folder`` (raises AssertionError with the reason otherwise)."""
    refs = image_refs(folder)
    distinct = {r for v in refs.values() for r in v}
    assert len(distinct) == 1, f"several images in cluster/: {refs}"
    image = distinct.pop()
    assert "ray-ml" not in image, "rayproject/ray-ml is not published after Ray 2.49"
    m = re.search(r"ray(\d+\.\d+\.\d+)", image.rsplit(":", 1)[-1])
    assert m, f"image tag {image!r} does not carry the Ray version (…-rayX.Y.Z-…)"
    assert m.group(1) == ray_version, f"image {image} is Ray {m.group(1)}, pinned Ray is {ray_version}"
    job = yaml.safe_load((folder / "rayjob.yaml").read_text())
    assert job["spec"]["rayClusterSpec"]["rayVersion"] == ray_version
    docker = (folder / "Dockerfile").read_text()
    base = re.search(r"^ARG RAY_VERSION=(\S+)", docker, re.M)
    assert base and base.group(1) == ray_version, "Dockerfile's base image is another Ray"
    return image


def test_launcher_yaml_matches_rays_schema():
    import jsonschema

    cfg = yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())
    jsonschema.validate(cfg, ray_schema())
    # the schema is strict: a misspelt key fails (the validator is not a no-op)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**cfg, "head_start_ray_comands": []}, ray_schema())
    init = " ".join(cfg["initialization_commands"])
    assert "|| true" not in init and "mountpoint -q /mnt/shared" == cfg["initialization_commands"][-1]
    head = " ".join(cfg["head_start_ray_commands"])
    assert "mlflow server" in head and "/mnt/shared/mlflow" in head and "RAYCPT_TRACKING_URI" in head
    assert "--dashboard-host=127.0.0.1" in head


def _parse_runtime_env(text: str):
    from ray.runtime_env import RuntimeEnv

    data = yaml.safe_load(text)
    env = RuntimeEnv(**data)  # Ray's own parser: unknown fields and bad values raise
    return data, env


def test_runtime_envs_parse_with_rays_parser():
    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    for text in (job["spec"]["runtimeEnvYAML"], (CLUSTER / "runtime_env.yaml").read_text()):
        data, env = _parse_runtime_env(text)
        assert env.env_vars()["RAYCPT_CACHE"].startswith("/mnt/shared/")
        assert "pip" not in data and "conda" not in data  # the image holds the dependencies
    with pytest.raises(Exception):
        _parse_runtime_env("pip: [torch]\nconda: [torch]\n")  # Ray refuses pip and conda together
    # the job's command is raycpt's, one process (tests/unit/test_cluster_rayjob_submit.py runs KubeRay's submitter)
    assert job["spec"]["entrypoint"].startswith("python -m raycpt ")


def _pinned_ray() -> str:
    """The Ray the image installs: constraints.txt's pin (cluster/constraints-image.txt is made from it), which is
    the installed Ray in the development venv and CI, not in the minimum venv (constraints-min.txt)."""
    text = (CLUSTER.parent / "constraints.txt").read_text()
    return re.search(r"^ray==([^\s;#]+)", text, re.M).group(1)


def test_one_image_everywhere_and_its_ray_version_is_the_pinned_ray(tmp_path):
    pinned = _pinned_ray()
    image = check_images(CLUSTER, pinned)
    assert image.startswith("registry.example.com/")  # the placeholder the user replaces (image.env)

    # a mutated copy: the RayJob's image names another Ray -> refused (two images AND a wrong version)
    bad = tmp_path / "cluster"
    shutil.copytree(CLUSTER, bad)
    other = image.replace(f"ray{pinned}", "ray2.49.0")
    text = (bad / "rayjob.yaml").read_text()
    (bad / "rayjob.yaml").write_text(text.replace(image, other, 1))
    with pytest.raises(AssertionError, match="several images"):
        check_images(bad, pinned)
    # ... and set everywhere through the one place (image.env + set-image.sh), still the wrong Ray
    subprocess.run(["bash", str(bad / "set-image.sh"), other], check=True, capture_output=True)
    assert {r for v in image_refs(bad).values() for r in v} == {other}
    with pytest.raises(AssertionError, match=f"is Ray 2.49.0, pinned Ray is {re.escape(pinned)}"):
        check_images(bad, pinned)


def test_dockerfile_installs_cuda_torch_and_raycpt_from_the_constraints(tmp_path):
    docker = (CLUSTER / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PY\}-\$\{CUDA\}$", docker, re.M)
    assert re.search(r"^ARG CUDA=cu\d+$", docker, re.M)
    assert "download.pytorch.org/whl/cu" in docker and re.search(r'pip install .*"torch==\$\{TORCH_VERSION\}"', docker)
    # the image pins (constraints.txt minus its CPU torch line, tests/unit/test_image_lock.py), then raycpt itself
    assert re.search(r"pip install .*-r cluster/constraints-image\.txt", docker)
    assert re.search(r"pip install .*--no-deps \.", docker)
    constraints = (CLUSTER.parent / "constraints.txt").read_text()
    pins = [ln for ln in constraints.splitlines() if ln.strip() and not ln.startswith("#")]
    torch_pins = [ln for ln in pins if re.match(r"torch==", ln)]
    assert len(torch_pins) == 1
    image = (CLUSTER / "constraints-image.txt").read_text()
    assert not re.search(r"^torch==", image, re.M)
    names = lambda text: {ln.split("==")[0] for ln in text.splitlines() if "==" in ln and not ln.startswith("#")}  # noqa: E731
    assert names(image) == names(constraints) - {"torch"}
    # the torch version the Dockerfile's sed reads from constraints.txt is the pinned one
    sed = re.search(r"sed -n -E '([^']+)' constraints\.txt", docker).group(1)
    version = subprocess.run(["sed", "-n", "-E", sed], input=constraints, capture_output=True, text=True).stdout
    assert version.strip() == torch_pins[0].split("==", 1)[1].split()[0]


# ------------------------------------------------------------------------------------ issue 23: the cluster starts

def _variants() -> dict:
    return json.loads((CLUSTER / "torch_cuda_variants.json").read_text())


def _pinned_torch() -> str:
    text = (CLUSTER.parent / "constraints.txt").read_text()
    return re.search(r"^torch==([^\s;#]+)", text, re.M).group(1)


def docker_cuda(docker: str) -> dict[str, str]:
    """The CUDA the Dockerfile's base image, torch index and image.env tag name."""
    arg = re.search(r"^ARG CUDA=(cu\d+)$", docker, re.M).group(1)
    index = re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/(cu\d+)$", docker, re.M).group(1)
    return {"base": arg, "torch_index": index}


def check_cuda(folder: Path, torch_version: str, ray_version: str, table: dict) -> str:
    cuda = docker_cuda((folder / "Dockerfile").read_text())
    assert cuda["base"] == cuda["torch_index"], f"base image is {cuda['base']}, torch comes from {cuda['torch_index']}"
    published = table["torch"].get(torch_version, {}).get("variants")
    assert published, f"no published CUDA variants recorded for torch {torch_version}"
    assert cuda["base"] in published, f"torch {torch_version} publishes {published}, not {cuda['base']}"
    ray_suffixes = table["ray_images"][ray_version]["cuda_suffixes"]
    assert cuda["base"] in ray_suffixes, f"rayproject/ray {ray_version} images come in {ray_suffixes}"
    image = re.search(r"^IMAGE=(\S+)", (folder / "image.env").read_text(), re.M).group(1)
    assert image.endswith("-" + cuda["base"]), f"image.env's tag {image} is not the {cuda['base']} build"
    return cuda["base"]


def test_the_image_uses_a_cuda_build_the_pinned_torch_publishes_and_the_base_image_matches(tmp_path):
    pinned = _pinned_ray()
    table = _variants()
    assert table["torch"][_pinned_torch()]["sources"]  # each row says where it comes from
    assert check_cuda(CLUSTER, _pinned_torch(), pinned, table) == "cu130"
    # cu128, what the Dockerfile named before: torch 2.13 publishes no such wheel -> refused
    bad = tmp_path / "cluster"
    shutil.copytree(CLUSTER, bad)
    docker = (bad / "Dockerfile").read_text()
    (bad / "Dockerfile").write_text(docker.replace("cu130", "cu128"))
    with pytest.raises(AssertionError, match=r"torch 2\.13\.0 publishes \['cu126', 'cu130'\], not cu128"):
        check_cuda(bad, "2.13.0", pinned, table)
    (bad / "Dockerfile").write_text(docker.replace("ARG CUDA=cu130", "ARG CUDA=cu126"))
    with pytest.raises(AssertionError, match="base image is cu126, torch comes from cu130"):
        check_cuda(bad, "2.13.0", pinned, table)


def test_every_launcher_node_type_names_an_ami_and_the_driver_it_needs():
    cfg = yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())
    for name, node in cfg["available_node_types"].items():
        assert re.fullmatch(r"ami-[0-9a-f]{8,17}", node["node_config"].get("ImageId", "")), name
    text = (CLUSTER / "ray-cluster-h200.yaml").read_text()
    assert ">= 580" in text and "PER REGION" in text and "set-ami.sh" in text
    assert (CLUSTER / "set-ami.sh").is_file()
    assert "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id" in (CLUSTER / "set-ami.sh").read_text()


def test_shared_folders_are_made_on_the_host_and_owned_by_the_container_user_and_the_registry_is_logged_in():
    cfg = yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())
    init = cfg["initialization_commands"]
    made = next(c for c in init if c.startswith("sudo mkdir -p /mnt/shared/raycpt"))
    owned = next(c for c in init if c.startswith("sudo chown 1000:100 "))
    raycpt_cfg = __import__("raycpt.config", fromlist=["load_config"]).load_config(
        CLUSTER.parent / "configs" / "qwen3-0.6b.yaml")
    for folder in (raycpt_cfg.tracking.run_root, raycpt_cfg.model.cache_dir, raycpt_cfg.data.store_dir):
        assert folder in made.split() and folder in owned.split(), folder
    assert not any("mkdir" in c and "/mnt/shared" in c for c in cfg["setup_commands"])  # not as the container user
    image = re.search(r"^IMAGE=(\S+)", (CLUSTER / "image.env").read_text(), re.M).group(1)
    login = next(c for c in init if "docker login" in c)
    assert f"REGISTRY={image.split('/')[0]};" in login
    assert init.index(login) < len(init)  # before the host pulls the image (docker runs after init commands)


def test_no_placeholder_url_anywhere_in_cluster():
    bad = re.compile(r"https?://[^\s\"')]*(example|placeholder|changeme|your-|<)", re.I)
    for f in sorted(CLUSTER.iterdir()):
        if f.is_file() and f.suffix != ".md":  # the walkthrough's prose may show <head IP>; the files the tools read may not
            hits = bad.findall(f.read_text())
            assert not hits, f"{f.name}: placeholder URL"
    assert bad.search('working_dir: "https://example.com/raycpt/raycpt-main.zip"')  # the check can fail


def test_rayjob_runs_the_concurrent_trials_at_once_with_shm_staging_and_one_mlflow_writer():
    from raycpt.config import load_config

    job = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    spec = job["spec"]
    entry = spec["entrypoint"].split()
    config = entry[entry.index("sweep") + 1]
    assert config.startswith("/home/ray/raycpt/configs/")  # inside the image (the Dockerfile copies configs/)
    assert "COPY --chown=ray:users configs ./configs" in (CLUSTER / "Dockerfile").read_text()
    cfg = load_config(CLUSTER.parent / "configs" / Path(config).name)
    assert "working_dir" not in yaml.safe_load(spec["runtimeEnvYAML"])
    cluster = spec["rayClusterSpec"]
    gpu_groups = [g for g in cluster["workerGroupSpecs"]
                  if "nvidia.com/gpu" in g["template"]["spec"]["containers"][0]["resources"]["limits"]]
    per_pod = int(gpu_groups[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    pods_per_trial = -(-cfg.train.num_workers // per_pod)
    for g in gpu_groups:
        assert g["replicas"] >= cfg.sweep.max_concurrent_trials * pods_per_trial
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        if g["maxReplicas"] > g["replicas"]:
            assert cluster.get("enableInTreeAutoscaling") is True  # maxReplicas does nothing without it
        mounts = {m["mountPath"] for m in g["template"]["spec"]["containers"][0]["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in g["template"]["spec"]["containers"][0]["env"]}
        assert "/dev/shm" in mounts and env.get("TMPDIR") in mounts
    head = cluster["headGroupSpec"]["template"]["spec"]
    head_mounts = {m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert "/dev/shm" in head_mounts
    mlflow = next(c for c in head["containers"] if c["name"] == "mlflow")
    cmd = " ".join(mlflow["args"])
    assert "--workers 1" in cmd
    db = re.search(r"--backend-store-uri sqlite:///(\S+)", cmd).group(1)
    assert not db.startswith("/mnt/shared")  # SQLite never on the NFS volume
    launcher = " ".join(yaml.safe_load((CLUSTER / "ray-cluster-h200.yaml").read_text())["head_start_ray_commands"])
    assert "--workers 1" in launcher and "sqlite:////mnt/shared" not in launcher
