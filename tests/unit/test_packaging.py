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


def _pins(file: str = "constraints.txt") -> dict[str, str]:
    pins = {}
    for line in (REPO / file).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{file}: {line!r} is not an exact pin NAME==VERSION"
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


def test_lower_bounds_are_the_minimums_the_unit_suite_passed_with():
    """Issue 48 item 8: every runtime dependency's lower bound in pyproject.toml equals its pin in
    constraints-min.txt, the set the unit suite passed with (scripts/check_minimums.sh rebuilds it; the run is in
    docs/dependencies.md). torch is the one exception: its floor (2.6) is an API fact, and the minimum venv keeps
    the torch 2.13.0 CPU wheel that lies on disk. Moving a bound without a run at the new minimum fails here."""
    pins = _pins("constraints-min.txt")
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for r in (Requirement(d) for d in meta["dependencies"]):
        name = canonicalize_name(r.name)
        assert name in pins, f"{r.name}: no pin in constraints-min.txt"
        if name == "torch":
            assert pins[name] == "2.13.0"
            continue
        floors = [s.version for s in r.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{r}: one lower bound (>=) expected"
        assert Version(floors[0]) == Version(pins[name]), f"{r}: the minimum run pinned {pins[name]}"
        assert r.specifier.contains(Version(pins[name]), prereleases=True), (str(r), pins[name])
