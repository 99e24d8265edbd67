"""pyproject.toml declares compatible ranges; constraints.txt pins a tested version of every direct
dependency, inside its range (so `pip install -c constraints.txt -e .` is the tested set)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _requirements() -> list[Requirement]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in meta["dependencies"]]
    reqs += [Requirement(r) for extra in meta.get("optional-dependencies", {}).values() for r in extra]
    return reqs


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin NAME==VERSION"
            pins[canonicalize_name(name)] = version
    return pins


def test_dependencies_are_ranges_not_pins():
    pinned = [str(r) for r in _requirements() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == [], f"exact pins belong in constraints.txt, not pyproject.toml: {pinned}"


def test_every_direct_dependency_has_a_tested_pin_inside_its_range():
    pins = _pins()
    assert pins["torch"] == "2.13.0"
    for r in _requirements():
        name = canonicalize_name(r.name)
        assert name in pins, f"{r.name}: no tested pin in constraints.txt"
        assert r.specifier.contains(Version(pins[name]), prereleases=True), (str(r), pins[name])


def test_torch_floor_is_the_first_release_with_fsdp2_public_api():
    """raycpt imports ``fully_shard`` and ``MixedPrecisionPolicy`` from ``torch.distributed.fsdp``
    (raycpt/train/worker/parallel.py), public from torch 2.6 on (2.4 and 2.5: ``torch.distributed._composable``)."""
    (torch,) = [r for r in _requirements() if canonicalize_name(r.name) == "torch"]
    assert torch.specifier.contains(Version("2.6.0")) and not torch.specifier.contains(Version("2.5.1")), str(torch)
    source = (REPO / "raycpt" / "train" / "worker" / "parallel.py").read_text()
    assert "from torch.distributed.fsdp import fully_shard" in source  # the import the floor is for
