"""The README stays true: its config reference is the generated one, and its test command is CI's."""

from pathlib import Path
import runpy

ROOT = Path(__file__).resolve().parents[2]


def test_config_reference_in_readme_is_current():
    mod = runpy.run_path(str(ROOT / "scripts" / "config_reference.py"))
    assert mod["block"]() in (ROOT / "README.md").read_text(encoding="utf-8"), \
        "README config reference is stale: run python scripts/config_reference.py --write"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    cmd = 'pytest -q -m "not slow" --timeout=900 tests'
    assert cmd in readme and cmd in ci
