#!/usr/bin/env python
"""The cluster image's pins against Ray's own image lock: what ``pip check`` would say inside the image, offline.

The image is ``rayproject/ray:{ray}-py311-cu130`` (its packages: Ray's lock, vendored in
``cluster/image-lock/``) with raycpt installed over it under ``cluster/constraints-image.txt``. That file is
``constraints.txt`` without its CPU torch line and with :data:`OVERRIDES` applied (``--write`` makes it;
tests/unit/test_image_lock.py checks it is up to date). Inside the image every package both sides name takes
the image pin (raycpt's dependency closure is the whole of ``constraints.txt``), every other package keeps
the lock's version.

:func:`conflicts` is ``pip check`` over that environment: every requirement (``Requires-Dist``, markers
evaluated for Linux / CPython 3.11, no extras) of every package whose metadata is recorded in
``cluster/image-lock/requires.json`` is checked against the version the image holds. ``--refresh`` rebuilds
that file (it needs the development venv and a package index): the metadata of every pinned package from the
venv, and, through ``pip install --dry-run --report`` (metadata only, nothing installed), the packages that
only the lock names and that require a package the image pins to another version than the lock.

Run: ``python scripts/image_pins.py`` (prints the conflicts, exit 1 when there are any), ``--write``,
``--refresh``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "cluster" / "image-lock" / "ray_img_cu130_py311.lock"
REQUIRES = ROOT / "cluster" / "image-lock" / "requires.json"
CONSTRAINTS = ROOT / "constraints.txt"
IMAGE_CONSTRAINTS = ROOT / "cluster" / "constraints-image.txt"

#: pins the image takes instead of constraints.txt's, with the reason (each one a conflict with Ray's image)
OVERRIDES = {
    "cryptography": ("44.0.3", "the image's own: its pyOpenSSL 25.1.0 requires cryptography<46 (mlflow 3.17 "
                               "accepts >=43,<51, google-auth >=38.0.3)"),
    "markdown-it-py": ("2.2.0", "the image's own: its mdit-py-plugins 0.3.5 requires markdown-it-py<3 (rich 15 "
                                "accepts >=2.2.0)"),
}
#: the image: Linux, CPython 3.11 (rayproject/ray:*-py311-*)
ENVIRONMENT = {**default_environment(), "sys_platform": "linux", "platform_system": "Linux",
               "platform_python_implementation": "CPython", "implementation_name": "cpython",
               "python_version": "3.11", "python_full_version": "3.11.11", "os_name": "posix"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#\\]+)")


def parse_lock(text: str) -> dict[str, dict]:
    """``name -> {"version", "via": [dependents]}`` from a pip-compile / uv lock (``# via`` comments)."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = PIN.match(line)
        if m:
            current = canonicalize_name(m.group(1))
            out[current] = {"version": m.group(2), "via": []}
            continue
        m = re.match(r"^#\s+([A-Za-z0-9][A-Za-z0-9._-]*)\s*$", line)
        if m and current is not None:
            out[current]["via"].append(canonicalize_name(m.group(1)))
    return out


def parse_pins(text: str) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line (comments and blank lines skipped)."""
    return {canonicalize_name(m.group(1)): m.group(2) for m in map(PIN.match, text.splitlines()) if m}


def image_environment(lock: dict[str, dict], pins: dict[str, str]) -> dict[str, str]:
    """The versions inside the image: the lock's, replaced by the image pins where both name a package."""
    return {**{n: v["version"] for n, v in lock.items()}, **pins}


def conflicts(env: dict[str, str], requires: dict[str, dict[str, list[str]]]) -> list[str]:
    """``pip check`` over ``env``: one line per requirement that the version in ``env`` does not satisfy.
    ``requires``: ``name -> {version: [Requires-Dist, ...]}``; a package whose version there is not recorded
    is listed as unchecked (one line), never silently passed."""
    lines = []
    for name, version in sorted(env.items()):
        known = requires.get(name, {})
        if version not in known:
            continue
        for text in known[version]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**ENVIRONMENT, "extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in env:
                continue  # not in the image: pip check's "not installed", outside what the pins decide
            if not req.specifier.contains(Version(env[dep]), prereleases=True):
                lines.append(f"{name} {version} requires {dep}{req.specifier}, but the image has {dep} {env[dep]}")
    return lines


def unchecked(env: dict[str, str], lock: dict[str, dict], pins: dict[str, str],
              requires: dict[str, dict[str, list[str]]]) -> list[str]:
    """Packages whose requirements could decide a conflict but have no recorded metadata: a package that
    requires (per the lock's ``# via``) something the image pins to another version than the lock."""
    moved = {n for n, v in pins.items() if n in lock and lock[n]["version"] != v}
    need = {d for n in moved for d in lock[n]["via"] if d in env}
    return sorted(f"{d} {env[d]}" for d in need if env[d] not in requires.get(d, {}))


def image_constraints(constraints: str, overrides: dict = OVERRIDES) -> str:
    """``constraints.txt`` for the image: its torch line dropped (the Dockerfile installs the CUDA build first),
    the :data:`OVERRIDES` applied, each marked with its reason."""
    out = ["# GENERATED by scripts/image_pins.py --write from constraints.txt: the pins for the cluster image",
           "# (cluster/Dockerfile), checked against Ray's image lock by tests/unit/test_image_lock.py. Do not edit:",
           "# change constraints.txt or OVERRIDES in scripts/image_pins.py, then run --write."]
    for line in constraints.splitlines():
        m = PIN.match(line)
        if not m:
            continue
        name = canonicalize_name(m.group(1))
        if name == "torch":
            continue
        if name in overrides:
            version, why = overrides[name]
            out.append(f"{m.group(1)}=={version}  # image override (constraints.txt: {m.group(2)}): {why}")
        else:
            out.append(line.split("#", 1)[0].rstrip())
    return "\n".join(out) + "\n"


def _venv_requires(pins: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    import importlib.metadata as md

    out: dict[str, dict[str, list[str]]] = {}
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if pins.get(name) == dist.version:
            out.setdefault(name, {})[dist.version] = list(dist.requires or [])
    return out


def _index_requires(specs: list[str]) -> dict[str, dict[str, list[str]]]:
    """Requires-Dist of ``name==version`` specs from the package index (pip's metadata-only dry run)."""
    if not specs:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                        "--quiet", "--report", str(report), *specs], check=True)
        items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): {i["metadata"]["version"]: i["metadata"].get("requires_dist")
                                                       or []} for i in items}


def refresh() -> dict:
    """Rebuild ``requires.json`` for the image pins and for ``constraints.txt`` itself (so that the unit test
    can show the unmodified pins failing for the right reasons)."""
    lock = parse_lock(LOCK.read_text())
    variants = [parse_pins(IMAGE_CONSTRAINTS.read_text()), parse_pins(CONSTRAINTS.read_text())]
    requires: dict[str, dict[str, list[str]]] = {}
    for pins in variants:
        for name, versions in _venv_requires(pins).items():
            requires.setdefault(name, {}).update(versions)
    missing = set()
    for pins in variants:
        missing |= {s.replace(" ", "==") for s in unchecked(image_environment(lock, pins), lock, pins, requires)}
        missing |= {f"{n}=={v}" for n, v in pins.items() if v not in requires.get(n, {}) and n in OVERRIDES}
    for name, versions in _index_requires(sorted(missing)).items():
        requires.setdefault(name, {}).update(versions)
    REQUIRES.write_text(json.dumps({"about": "Requires-Dist per package and version, for scripts/image_pins.py "
                                    "(--refresh): from the development venv and pip's metadata-only dry run",
                                    "requires": dict(sorted(requires.items()))}, indent=1) + "\n")
    return requires


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write cluster/constraints-image.txt from constraints.txt")
    ap.add_argument("--refresh", action="store_true", help="rebuild cluster/image-lock/requires.json (needs an index)")
    args = ap.parse_args(argv)
    if args.write:
        IMAGE_CONSTRAINTS.write_text(image_constraints(CONSTRAINTS.read_text()))
    requires = refresh() if args.refresh else json.loads(REQUIRES.read_text())["requires"]
    lock, pins = parse_lock(LOCK.read_text()), parse_pins(IMAGE_CONSTRAINTS.read_text())
    env = image_environment(lock, pins)
    found, blind = conflicts(env, requires), unchecked(env, lock, pins, requires)
    for line in found:
        print(line)
    for line in blind:
        print(f"unchecked (no metadata recorded): {line}")
    print(f"{len(env)} packages in the image, {sum(v in requires.get(n, {}) for n, v in env.items())} with "
          f"metadata: {len(found)} conflicts, {len(blind)} unchecked")
    return 1 if found or blind else 0


if __name__ == "__main__":
    sys.exit(main())
