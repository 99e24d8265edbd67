"""The README stays true and short: its config reference (now docs/config.md) is the generated one, its test
command is CI's, it is read in two minutes (at most 200 lines, the set-up commands in its first 30), and every
link in it (and in the docs it sends readers to) resolves."""

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_config_reference_in_readme_is_current():
    mod = runpy.run_path(str(ROOT / "scripts" / "config_reference.py"))
    assert mod["block"]() in (ROOT / "docs" / "config.md").read_text(encoding="utf-8"), \
        "docs/config.md config reference is stale: run python scripts/config_reference.py --write"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    cmd = 'pytest -q -m "not slow" --timeout=900 tests'
    assert cmd in readme and cmd in ci


def test_readme_is_short_with_the_set_up_commands_first():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, len(lines)
    head = "\n".join(lines[:30])
    assert "pip install -c constraints.txt -e . && raycpt sweep configs/default.yaml --splits 0.33,0.5,0.66" in head
    assert 'pip install -c constraints.txt -e ".[dev]" && pytest -q -m "not slow" --timeout=900 tests' in head


def _broken_links(md: Path) -> list[str]:
    bad = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # web links and anchors within the page
        path = (md.parent / target.split("#")[0]).resolve()
        if not path.exists():
            bad.append(target)
    return bad


def test_readme_links_resolve():
    readme = ROOT / "README.md"
    assert _broken_links(readme) == []
    linked = {(ROOT / t.split("#")[0]).resolve() for t in LINK.findall(readme.read_text(encoding="utf-8"))
              if t.endswith(".md") or ".md#" in t}
    assert ROOT / "docs" / "benchmarks.md" in linked and ROOT / "docs" / "config.md" in linked
    for md in sorted(p for p in linked if p.is_file()):
        assert _broken_links(md) == [], md
