"""Issue 27: every failure path ends cleanly, driven from outside through ``python -m raycpt`` (PYTHONPATH set):
exit 2, one stderr line, no traceback, and nothing left behind (no tmp copy in the user's folder, no run folder
of a run that never started, the user's files untouched)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bad_inputs", ROOT / "scripts" / "bad_inputs.py")
bad_inputs = importlib.util.module_from_spec(_spec)
sys.modules["bad_inputs"] = bad_inputs
_spec.loader.exec_module(bad_inputs)


def _env(**extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def _one_line(r) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    return lines[0]


def _cli(args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, timeout=timeout,
                          env=env or _env())


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    f = bad_inputs.fixtures(tmp_path_factory.mktemp("bad27"))
    yield f, {c.label: c for c in bad_inputs.issue27_cases(f)}
    f["busy"].close()


FAST = [label for label in (
    "hybrid build --out FILE", "hybrid build --out DIR --overwrite, a file at DIR/new_shallow",
    "eval a folder without weights", "eval a checkpoint its manifest disagrees with", "eval pickle weights (.bin)",
    "ui on a corrupt mlflow.db", "train on a corrupt mlflow.db", "tracking.uri naming a text file",
    "tracking.uri postgresql:// without its driver", "tracking.uri mysql:// without its driver",
    "tracking.run_root=~ (YAML null)", "trace on four identical prompts")]


@pytest.mark.parametrize("label", FAST)
def test_failure_is_one_line_and_leaves_nothing(table, label):
    f, cases = table
    t = f["tmp"]
    runs = Path(f["runs"])
    before = _tree(t)
    r = bad_inputs.run_case(cases[label], _env())
    assert r["ok"], r
    after = _tree(t)
    new = sorted(k for k in set(after) - set(before)
                 if not k.startswith(("runs/packed/", "corrupt_runs/packed/")) and not k.endswith(".lock"))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k] and not k.startswith("runs/"))
    assert not any(".tmp" in k for k in after), [k for k in after if ".tmp" in k]  # no half-written copy anywhere
    assert changed == []  # the user's files (and a corrupt store) untouched
    assert [k for k in new if "/" in k and k.split("/")[1].startswith(("eval-", "train-", "hybrid-"))] == [], new
    if "corrupt" in label:
        assert not any(p.name.startswith("train-") for p in (t / "corrupt_runs").iterdir())
    if "hybrid" in label:
        assert (t / "an_out_file").read_text() == "the user's file named as --out"
        assert (t / "out2" / "new_shallow").read_text() == "the user's file where a build would go"
        assert sorted(p.name for p in (t / "out2").iterdir()) == ["new_shallow"]


def test_a_full_disk_is_one_line_naming_the_path_and_errno_and_leaves_no_store(table):
    f, _ = table
    t = f["tmp"]
    root = t / "full_runs"
    env = _env(PYTHONPATH=f"{ROOT / 'tests' / 'fault_site'}{os.pathsep}{ROOT}", RAYCPT_TEST_ENOSPC=str(root / "packed"))
    r = _cli(["data", "prepare", f"model.ref={f['model']}", f"data.corpus=[{t / 'small.jsonl'}]", "data.seq_len=16",
              f"tracking.run_root={root}"], env=env)
    line = _one_line(r)
    assert "No space left on device (ENOSPC)" in line and str(root / "packed") in line and "--resume" in line
    packed = root / "packed"
    left = sorted(p.name for p in packed.iterdir() if not p.name.endswith((".lock", "builds.jsonl")))
    assert left == []  # neither a store that looks complete nor the tmp folder of the pack


def test_two_commands_of_one_name_at_once_on_a_fresh_run_root_both_open_the_store(tmp_path):
    """The SQLite schema is created under a file lock: two drivers at once on a fresh run root (the issue's
    `raycpt train name=twin` twice) no longer race on `CREATE TABLE` - one waits, both get the experiment."""
    code = ("import sys; from raycpt.config import load_config; from raycpt.runs.store import ensure_store; "
            "from raycpt.runs.location import locate; "
            "cfg = load_config(None, ['name=twin', 'tracking.run_root=' + sys.argv[1]]); "
            "print(ensure_store(locate(cfg.tracking)))")
    for i in range(3):
        root = tmp_path / f"runs{i}"
        procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=_env()) for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
        ids = {o[0].strip().splitlines()[-1] for o in outs}
        assert len(ids) == 1  # one experiment, made once


def test_models_pull_error_is_the_only_output_on_stderr(table):
    """No step list ("hash ...", "load GGUF ...") above the error line, not even a blank line."""
    f, cases = table
    case = cases["models pull a broken .gguf"]
    r = _cli(case.args)
    line = _one_line(r)
    assert r.stderr.splitlines() == [line] and case.expect in line
    assert not (f["tmp"] / "cache").exists() or not any(p.name.startswith(".tmp-") for p in (f["tmp"] / "cache").rglob("*"))
