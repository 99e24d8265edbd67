"""The cluster image builds and checks, offline: raycpt's image pins resolved against Ray's own image lock (the
verdict ``pip check`` gives inside the image), and the Dockerfile's steps linted for what only BuildKit forgives.

No network: the lock (``cluster/image-lock/``, Apache-2.0, vendored) and the recorded requirement metadata
(``requires.json``) are data in the repository."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"


def _pins_module():
    spec = importlib.util.spec_from_file_location("image_pins", ROOT / "scripts" / "image_pins.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pins_mod = _pins_module()


def _data():
    lock = pins_mod.parse_lock((CLUSTER / "image-lock" / "ray_img_cu130_py311.lock").read_text())
    requires = json.loads((CLUSTER / "image-lock" / "requires.json").read_text())["requires"]
    return lock, requires


def test_the_vendored_lock_is_rays_image_with_its_licence():
    lock, _ = _data()
    # facts of Ray's cu130 image read from its lock (ENVIRONMENT.md, issue 39): the pyOpenSSL / cryptography pair
    assert lock["pyopenssl"]["version"] == "25.1.0" and lock["cryptography"]["version"] == "44.0.3"
    assert "pyopenssl" in lock["cryptography"]["via"] and len(lock) > 100
    assert "Apache License" in (CLUSTER / "image-lock" / "LICENSE").read_text()
    assert "ray-project/ray" in (CLUSTER / "image-lock" / "NOTICE").read_text()


def _independent_pip_check(env: dict[str, str], requires: dict) -> set[tuple[str, str]]:
    """A second, plain reading of the same rule (not the script's function): (package, dependency) pairs whose
    requirement the image's version breaks, Linux / CPython 3.11, no extras."""
    bad = set()
    marker_env = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11",
                  "python_full_version": "3.11.11", "platform_python_implementation": "CPython",
                  "implementation_name": "cpython", "os_name": "posix", "extra": ""}
    for name, version in env.items():
        for text in requires.get(name, {}).get(version, []):
            r = Requirement(text)
            if r.marker and not r.marker.evaluate(marker_env):
                continue
            dep = canonicalize_name(r.name)
            if dep in env and Version(env[dep]) not in r.specifier:
                if not (Version(env[dep]).is_prerelease and r.specifier.contains(env[dep], prereleases=True)):
                    bad.add((name, dep))
    return bad


def test_image_pins_agree_with_rays_image_lock_as_pip_check_would():
    lock, requires = _data()
    pins = pins_mod.parse_pins((CLUSTER / "constraints-image.txt").read_text())
    env = pins_mod.image_environment(lock, pins)
    assert pins_mod.conflicts(env, requires) == []
    assert pins_mod.unchecked(env, lock, pins, requires) == []  # nothing that could conflict goes unread
    assert _independent_pip_check(env, requires) == set()
    # every package both sides name was read: the check covered the overlap, not a sample of it
    both = [n for n in pins if n in lock]
    assert len(both) > 60 and all(env[n] in requires.get(n, {}) for n in both)
    # the image keeps Ray's pyOpenSSL and its cryptography (the choice: pin cryptography, not upgrade pyOpenSSL)
    assert env["pyopenssl"] == "25.1.0" and env["cryptography"] == "44.0.3"


def test_constraints_txt_as_it_is_fails_in_rays_image_for_the_known_reasons():
    """The check can fail: the development pins over Ray's image give exactly the conflicts the issue names
    (pyOpenSSL 25.1.0 requires cryptography<46; 50.0.2 is pinned) and the second one the lock shows."""
    lock, requires = _data()
    pins = pins_mod.parse_pins((ROOT / "constraints.txt").read_text())
    pins.pop("torch")
    env = pins_mod.image_environment(lock, pins)
    found = pins_mod.conflicts(env, requires)
    assert found == ["mdit-py-plugins 0.3.5 requires markdown-it-py<3.0.0,>=1.0.0, but the image has markdown-it-py "
                     "4.3.0", "pyopenssl 25.1.0 requires cryptography<46,>=41.0.5, but the image has cryptography "
                     "50.0.2"]
    assert _independent_pip_check(env, requires) == {("pyopenssl", "cryptography"), ("mdit-py-plugins",
                                                                                       "markdown-it-py")}


def test_constraints_image_is_generated_from_constraints_txt():
    text = (ROOT / "constraints.txt").read_text()
    assert (CLUSTER / "constraints-image.txt").read_text() == pins_mod.image_constraints(text)
    dev, image = pins_mod.parse_pins(text), pins_mod.parse_pins((CLUSTER / "constraints-image.txt").read_text())
    assert "torch" not in image and set(image) == set(dev) - {"torch"}
    assert {n for n in image if image[n] != dev[n]} == set(pins_mod.OVERRIDES)


# ------------------------------------------------------------------------------------------- the Dockerfile
def dockerfile_steps(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per step; continuation lines joined, comments dropped."""
    steps, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        steps.append((word.upper(), rest.strip()))
        buf = ""
    return steps


def lint_dockerfile(text: str, base_user: str = "ray", base_dirs=("/home/ray",)) -> list[str]:
    """What breaks a build under kaniko or the legacy builder but not under BuildKit, one line each:
    WORKDIR to a folder that the current (non-root) user did not get from a root step (they create it as root);
    COPY/ADD without --chown as a non-root user (root-owned files the next RUN cannot write); BuildKit-only
    syntax (RUN --mount/--network/--security, heredocs, COPY --chmod/--link/--parents)."""
    user, owned, problems = base_user, set(base_dirs), []
    for i, (word, args) in enumerate(dockerfile_steps(text), 1):
        if word == "USER":
            user = args.split(":")[0]
        elif word == "RUN":
            if re.search(r"--(mount|network|security)\b", args.split(" ", 1)[0]) or "<<" in args:
                problems.append(f"step {i}: RUN uses BuildKit-only syntax: {args[:60]}")
            if user == "root" and "chown" in args:
                words = shlex.split(args.replace("&&", " "))
                owner = next((w for w in words[words.index("chown") + 1:] if not w.startswith("-")), "")
                made = [w for w in words if w.startswith("/")]
                owned.update((owner.split(":")[0], d) for d in made)
        elif word == "WORKDIR" and user != "root":
            if args not in owned and (user, args) not in owned:
                problems.append(f"step {i}: WORKDIR {args} as user {user}: kaniko and the legacy builder create "
                                "it as root; make it and chown it as root first")
        elif word in ("COPY", "ADD"):
            flags = [w for w in args.split() if w.startswith("--")]
            if any(f.split("=")[0] in ("--chmod", "--link", "--parents") for f in flags):
                problems.append(f"step {i}: {word} {' '.join(flags)}: BuildKit-only flag")
            if user != "root" and not any(f.startswith("--chown=") for f in flags) and "--from" not in args:
                problems.append(f"step {i}: {word} without --chown as user {user}: the files are root's")
    return problems


def test_the_dockerfile_builds_under_every_builder_and_carries_the_device_check():
    text = (CLUSTER / "Dockerfile").read_text()
    assert lint_dockerfile(text) == []
    steps = dockerfile_steps(text)
    copies = " ".join(a for w, a in steps if w == "COPY")
    assert "scripts ./scripts" in copies and "tests/tiny.py ./tests/tiny.py" in copies  # scripts/device_check.py
    assert "cluster/constraints-image.txt" in copies
    runs = " ".join(a for w, a in steps if w == "RUN")
    assert "-r cluster/constraints-image.txt" in runs and "pip check" in runs
    # what the device check imports from outside the package is exactly what the image holds
    check = (ROOT / "scripts" / "device_check.py").read_text()
    assert re.search(r"^\s*from tiny import", check, re.M) and (ROOT / "tests" / "tiny.py").is_file()


@pytest.mark.parametrize("bad, why", [
    ("FROM rayproject/ray:2.60.0-py311-cu130\nWORKDIR /home/ray/raycpt\nCOPY --chown=ray:users . .\n",
     "WORKDIR /home/ray/raycpt as user ray"),
    ("FROM x\nWORKDIR /home/ray/raycpt\nCOPY pyproject.toml ./\n", "COPY without --chown as user ray"),
    ("FROM x\nRUN --mount=type=cache,target=/root/.cache pip install .\n", "BuildKit-only syntax"),
    ("FROM x\nCOPY --chown=ray:users --chmod=755 a b\n", "--chmod"),
    ("FROM x\nRUN <<EOF\npip install .\nEOF\n", "BuildKit-only syntax"),
])
def test_the_lint_finds_each_builder_problem(bad, why):
    found = lint_dockerfile(bad)
    assert any(why in p for p in found), found
    # and the fix for the first: made and chowned as root, then the same WORKDIR passes
    fixed = "USER root\nRUN mkdir -p /home/ray/raycpt && chown ray:users /home/ray/raycpt\nUSER ray\n" \
            "WORKDIR /home/ray/raycpt\n"
    assert lint_dockerfile(fixed) == []
