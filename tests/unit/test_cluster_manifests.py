"""cluster/ manifests checked with Ray's own validators: the launcher YAML against the cluster-config JSON
schema shipped in the ray package, the runtime envs through Ray's RuntimeEnv parser, one image everywhere
whose Ray version is the installed Ray (a mutated copy shows the check failing), and a Dockerfile that
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
    assert m.group(1) == ray_version, f"image {image} is Ray {m.group(1)}, installed Ray is {ray_version}"
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
    assert job["spec"]["entrypoint"].startswith("python -m raycpt ")


def test_one_image_everywhere_and_its_ray_version_is_the_installed_ray(tmp_path):
    import ray

    image = check_images(CLUSTER, ray.__version__)
    assert image.startswith("registry.example.com/")  # the placeholder the user replaces (image.env)

    # a mutated copy: the RayJob's image names another Ray -> refused (two images AND a wrong version)
    bad = tmp_path / "cluster"
    shutil.copytree(CLUSTER, bad)
    other = image.replace(f"ray{ray.__version__}", "ray2.49.0")
    text = (bad / "rayjob.yaml").read_text()
    (bad / "rayjob.yaml").write_text(text.replace(image, other, 1))
    with pytest.raises(AssertionError, match="several images"):
        check_images(bad, ray.__version__)
    # ... and set everywhere through the one place (image.env + set-image.sh), still the wrong Ray
    subprocess.run(["bash", str(bad / "set-image.sh"), other], check=True, capture_output=True)
    assert {r for v in image_refs(bad).values() for r in v} == {other}
    with pytest.raises(AssertionError, match=f"is Ray 2.49.0, installed Ray is {re.escape(ray.__version__)}"):
        check_images(bad, ray.__version__)


def test_dockerfile_installs_cuda_torch_and_raycpt_from_the_constraints(tmp_path):
    docker = (CLUSTER / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PY\}-\$\{CUDA\}$", docker, re.M)
    assert re.search(r"^ARG CUDA=cu\d+$", docker, re.M)
    assert "download.pytorch.org/whl/cu" in docker and re.search(r'pip install .*"torch==\$\{TORCH_VERSION\}"', docker)
    assert re.search(r"pip install .*-c /tmp/constraints-gpu\.txt \.", docker)  # raycpt itself, pinned deps
    # the torch filter of the Dockerfile, run on the real constraints.txt: every pin but torch survives
    grep = re.search(r"grep -v -E '([^']+)' constraints\.txt", docker).group(1)
    sed = re.search(r"sed -n -E '([^']+)' constraints\.txt", docker).group(1)
    constraints = (CLUSTER.parent / "constraints.txt").read_text()
    kept = subprocess.run(["grep", "-v", "-E", grep], input=constraints, capture_output=True, text=True).stdout
    pins = [ln for ln in constraints.splitlines() if ln.strip() and not ln.startswith("#")]
    torch_pins = [ln for ln in pins if re.match(r"torch==", ln)]
    assert len(torch_pins) == 1
    assert [ln for ln in kept.splitlines() if ln.strip() and not ln.startswith("#")] == \
        [ln for ln in pins if ln not in torch_pins]
    version = subprocess.run(["sed", "-n", "-E", sed], input=constraints, capture_output=True, text=True).stdout
    assert version.strip() == torch_pins[0].split("==", 1)[1].split()[0]
