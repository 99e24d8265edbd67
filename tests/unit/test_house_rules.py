"""The house's rules, read from the source (nothing is imported):

* no module imports another module's private name (``from raycpt.x import _y``): a private name used elsewhere is a
  public name in hiding, or a boundary in the wrong place;
* no three sibling files share a prefix (``sweep_a.py``, ``sweep_b.py``, ``sweep_c.py``) outside a package of that
  name: a family of files is a package;
* no import cycle between packages: inside every package, its children (modules and subpackages, each subpackage
  taken whole) import each other without a cycle (the module-level cycle check is tests/unit/test_import_graph.py);
* no file of the package over 600 lines.

Each rule ends with a self-test on a synthetic package, so a checker that finds nothing cannot pass for one that works.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path
from typing import Mapping

from test_import_graph import PACKAGE_DIR, cycles, import_graph, module_names

MAX_LINES = 600
FAMILY = 3


# ------------------------------------------------------------------------------------ the checks

def private_cross_imports(package_dir: Path = PACKAGE_DIR, package: str = "raycpt") -> list[str]:
    """``"file: module._name"`` for each private name a module imports from another of the package's modules."""
    out = []
    for f in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package):
                out += [f"{f.relative_to(package_dir)}: {node.module or '.'}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def prefix_families(package_dir: Path = PACKAGE_DIR, size: int = FAMILY) -> list[str]:
    """``"folder/prefix_* (n files)"`` for each group of ``size`` or more sibling files named ``prefix_...``."""
    out = []
    for folder in sorted({f.parent for f in package_dir.rglob("*.py")}):
        count = collections.Counter(f.stem.split("_")[0] for f in folder.glob("*.py")
                                    if "_" in f.stem.strip("_") and not f.stem.startswith("_"))
        out += [f"{folder.relative_to(package_dir.parent)}/{p}_* ({n} files)" for p, n in sorted(count.items())
                if n >= size]
    return out


def package_cycles(graph: Mapping[str, set[str]], modules: Mapping[str, Path]) -> list[str]:
    """For each package, the cycles among its children (a subpackage is one node: all the modules inside it)."""
    packages = {m for m, f in modules.items() if f.name == "__init__.py"}
    out = []
    for pkg in sorted(packages):
        def child(m: str) -> str | None:
            if not m.startswith(pkg + "."):
                return None
            return pkg + "." + m[len(pkg) + 1:].split(".")[0]

        edges: dict[str, set[str]] = collections.defaultdict(set)
        for a, targets in graph.items():
            ca = child(a)
            for b in targets:
                cb = child(b)
                if ca and cb and ca != cb:
                    edges[ca].add(cb)
        out += [f"{pkg}: {' <-> '.join(c)}" for c in cycles(edges)]
    return out


def long_files(package_dir: Path = PACKAGE_DIR, limit: int = MAX_LINES) -> list[str]:
    return [f"{f.relative_to(package_dir.parent)} ({n} lines)" for f in sorted(package_dir.rglob("*.py"))
            if (n := len(f.read_text(encoding="utf-8").splitlines())) > limit]


# ------------------------------------------------------------------------------------ the package

def test_no_private_name_is_imported_from_another_module():
    assert private_cross_imports() == []


def test_no_family_of_sibling_files_outside_its_package():
    assert prefix_families() == []


def test_no_import_cycle_between_packages():
    assert package_cycles(import_graph(), module_names(PACKAGE_DIR)) == []


def test_no_file_over_600_lines():
    assert long_files() == []


# ------------------------------------------------------------------------------------ self-tests

def _write(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_checkers_find_what_they_name(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import _hidden, shown\nfrom .b import _also\n",  # two private imports
        "pkg/b.py": "_hidden = shown = _also = 1\n",
        "pkg/sweep_x.py": "", "pkg/sweep_y.py": "", "pkg/sweep_z.py": "",  # a family of three
        "pkg/other_x.py": "", "pkg/other_y.py": "",                          # two: not a family
        "pkg/__main__.py": "", "pkg/_private_a.py": "", "pkg/_private_b.py": "", "pkg/_private_c.py": "",
        "pkg/left/__init__.py": "", "pkg/left/m.py": "from pkg.right import n\n",
        "pkg/right/__init__.py": "", "pkg/right/n.py": "def f():\n    from pkg.left import m\n",  # packages in a cycle
        "pkg/long.py": "x = 1\n" * (MAX_LINES + 1),
    })
    assert private_cross_imports(pkg, "pkg") == ["a.py: pkg.b._hidden", "a.py: b._also"]
    assert prefix_families(pkg) == ["pkg/sweep_* (3 files)"]
    graph = import_graph(pkg, "pkg")
    assert package_cycles(graph, module_names(pkg, "pkg")) == ["pkg: pkg.left <-> pkg.right"]
    assert long_files(pkg) == [f"pkg/long.py ({MAX_LINES + 1} lines)"]


def test_checkers_pass_a_clean_package(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "", "pkg/a.py": "from pkg.b import shown\n", "pkg/b.py": "shown = 1\n",
        "pkg/sweep/__init__.py": "", "pkg/sweep/x.py": "", "pkg/sweep/y.py": "", "pkg/sweep/z.py": "",
        "pkg/left/__init__.py": "", "pkg/left/m.py": "from pkg.right import n\n",
        "pkg/right/__init__.py": "", "pkg/right/n.py": "",
    })
    assert private_cross_imports(pkg, "pkg") == []
    assert prefix_families(pkg) == []
    assert package_cycles(import_graph(pkg, "pkg"), module_names(pkg, "pkg")) == []
    assert long_files(pkg) == []


def test_vulture_finds_no_dead_code():
    """``python -m vulture raycpt --min-confidence 80`` (names it cannot see used: pyproject's [tool.vulture])."""
    import subprocess
    import sys

    root = PACKAGE_DIR.parent
    out = subprocess.run([sys.executable, "-m", "vulture", "raycpt", "--min-confidence", "80"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, "")
