"""raycpt's import graph has no cycle and no import from a lower layer into a higher one.

The graph is read with ``ast`` from the source files (nothing is imported): every ``import x``,
``from x import y`` (``y`` counts as the module ``x.y`` when that is a module of the package) and
relative import, at module level *and* inside functions, classes and ``if`` blocks, plus
``importlib.import_module("raycpt...")`` and the CLI table's lazy references (``lazy("raycpt.jobs.sweep", "SWEEP")``,
:func:`raycpt.usage.lazy`) with a literal module name. An import placed inside a function to
dodge a cycle is therefore still an edge: the rule is "move the helper down", not "hide the import".

Edges to a module's own ancestor packages are left out: Python runs a package's ``__init__`` before
any of its modules, so ``from raycpt import __version__`` adds no dependency that was not there.

The layers, top to bottom (a module may import from its own layer and from any layer below it;
within a layer the cycle check alone applies). The order follows ARCHITECTURE.md, adjusted to what
the code needs:

1. ``raycpt`` (the package root: version, and the import that registers hybrid models),
   ``raycpt.__main__``, ``raycpt.entry`` (the console entry and its one-line errors), ``raycpt.cli`` - the entry
   points: the command table (job, renderer, option -> dotted key per row), nothing else.
2. ``raycpt.jobs`` - where work runs on Ray (trace, compare, eval, sweep, contribution, hybrid, train; and
   ``jobs.info`` / ``jobs.data`` / ``jobs.sync``: the commands that run no experiment), each a ``Job``
   (``jobs/job.py``): ``prepare(cfg, options)`` -> ``execute(plan, run, options)``, run by ``run_job``.
3. ``raycpt.train`` - the TorchTrainer launcher, the worker loop and its per-step callbacks (drift).
4. ``raycpt.evaluate`` (and ``raycpt.evaluate_prefetch``, hub data fetched once on the driver) and
   ``raycpt.tasks.utils`` - the lm-eval bridge (``tasks/utils.py`` is the
   half lm-eval loads from the task YAMLs; it uses the bridge's answer extraction and question files).
   Above report (ARCHITECTURE.md drew it below): the bridge writes its per-question files with
   ``report.eval``, and no report needs the bridge.
5. ``raycpt.report`` - plots, tables and progress bars from results (data in, files out); ``report.render``
   holds what each command prints (the renderer a row of the CLI table names).
6. ``raycpt.diagnostics`` - pure torch/numpy metrics: no Ray, no MLflow, no train/jobs/report.
7. ``raycpt.strategies`` - the plan registry and ``LayerPlan``. Below diagnostics (ARCHITECTURE.md
   drew it above): the plans are the vocabulary of layer indices and the split rule, and the trace's
   split recommendation (``diagnostics.scores``) speaks it; no plan needs a diagnostic.
8. ``raycpt.data`` - corpus sources and shards.
9. ``raycpt.models`` - model references -> folders, ``LayerStack``, hybrid assembly. Inside it, the
   hybrid config never imports the hybrid model: the package wires the model's lazy registration.
10. ``raycpt.runs``, ``raycpt.tracking``, ``raycpt.runtime`` (and ``raycpt.worker_setup``, ``raycpt.cluster``,
    ``raycpt.ui``) - THE
    command lifecycle (``runs.command_run``) and run folders, MLflow (and its UI server), Ray bootstrap
    (``runs`` builds on ``tracking``, never the reverse).
11. ``raycpt.config``, ``raycpt.tasks`` (benchmark names and category tables) - the typed config tree.
12. ``raycpt.io``, ``raycpt.errors`` (and ``raycpt.splits``, ``raycpt.usage``, ``raycpt.stats``,
    ``raycpt.progress``) - atomic file helpers and run-root paths, ``RaycptError``, the split rule, usage-error
    words and the CLI table's vocabulary, bootstrap and seed intervals, THE progress bar: leaves.

Names in parentheses are modules other branches add; a module no layer names fails
:func:`test_every_module_has_a_layer`, so a new top-level module must be placed here on purpose.
The test ends with a self-test on a synthetic graph: a checker that finds nothing cannot pass for
one that works.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "raycpt"

# top to bottom; a module belongs to the layer of the longest prefix that names it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("raycpt", "raycpt.__main__", "raycpt.entry", "raycpt.cli"),
    ("raycpt.jobs",),
    ("raycpt.train",),
    ("raycpt.evaluate", "raycpt.evaluate_prefetch", "raycpt.tasks.utils"),
    ("raycpt.report",),
    ("raycpt.diagnostics",),
    ("raycpt.strategies",),
    ("raycpt.data",),
    ("raycpt.models",),
    ("raycpt.runs", "raycpt.tracking", "raycpt.runtime", "raycpt.worker_setup", "raycpt.cluster", "raycpt.ui"),
    ("raycpt.config", "raycpt.tasks"),
    ("raycpt.io", "raycpt.errors", "raycpt.splits", "raycpt.usage", "raycpt.stats", "raycpt.progress"),
)


# ------------------------------------------------------------------------------------ reading the graph

def module_names(package_dir: Path, package: str = "raycpt") -> dict[str, Path]:
    """Every module of the package: dotted name -> file (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for f in sorted(package_dir.rglob("*.py")):
        parts = list(f.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = f
    return out


def _resolve_relative(module: str, is_package: bool, level: int, name: Optional[str]) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str], package: str = "raycpt"
               ) -> set[str]:
    """The package's modules that ``source`` (the text of ``module``) imports, anywhere in the file."""
    known = set(known)

    def owner(name: str) -> Optional[str]:  # the longest known module that ``name`` is or lies in
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            if base:
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
        elif isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if fname in ("import_module", "__import__", "lazy") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                targets = [node.args[0].value]
        for t in targets:
            if t == package or t.startswith(package + "."):
                o = owner(t)
                if o is not None:
                    found.add(o)
    ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return {m for m in found if m != module and m not in ancestors}


def import_graph(package_dir: Path = PACKAGE_DIR, package: str = "raycpt") -> dict[str, set[str]]:
    mods = module_names(package_dir, package)
    return {m: imports_of(f.read_text(encoding="utf-8"), m, f.name == "__init__.py", mods, package)
            for m, f in mods.items()}


# ------------------------------------------------------------------------------------ the checks

def layer_of(module: str, layers: Sequence[Sequence[str]]) -> Optional[int]:
    best, where = -1, None
    for i, prefixes in enumerate(layers):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, where = len(p), i
    return where


def upward_imports(graph: Mapping[str, set[str]], layers: Sequence[Sequence[str]]) -> list[str]:
    """``"a (layer i) -> b (layer j)"`` for every import of a higher layer (j < i) from a lower one."""
    out = []
    for a, targets in sorted(graph.items()):
        la = layer_of(a, layers)
        for b in sorted(targets):
            lb = layer_of(b, layers)
            if la is not None and lb is not None and lb < la:
                out.append(f"{a} (layer {la + 1}) imports {b} (layer {lb + 1})")
    return out


def unlayered(graph: Mapping[str, set[str]], layers: Sequence[Sequence[str]]) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# ------------------------------------------------------------------------------------ the tests

def test_graph_reads_the_package():
    g = import_graph()
    assert len(g) > 30, "the walker found too few modules"
    # spot checks against the source: a module-level import and a function-level one
    assert "raycpt.errors" in g["raycpt.config"]
    assert "raycpt.train.loop" in g["raycpt.train.launch"]
    # the CLI table's lazy references: cli -> every job module its rows name
    assert {"raycpt.jobs.sweep", "raycpt.jobs.info", "raycpt.jobs.data", "raycpt.jobs.sync"} <= g["raycpt.cli"]


def test_every_module_has_a_layer():
    assert unlayered(import_graph(), LAYERS) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_upward_imports():
    assert upward_imports(import_graph(), LAYERS) == []


def test_diagnostics_import_no_ray_mlflow_train_jobs_report_or_tracking():
    """The diagnostics layer is pure torch/numpy: not even a lazy import of Ray or MLflow."""
    bad = []
    for m, f in module_names(PACKAGE_DIR).items():
        if not m.startswith("raycpt.diagnostics"):
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{m}: {n}" for n in names if n.split(".")[0] in ("ray", "mlflow")]
    assert bad == []


# ------------------------------------------------------------------------------------ self-test

SYNTHETIC = {
    "pkg/__init__.py": "",
    "pkg/top.py": "from pkg import low\n",
    "pkg/mid/__init__.py": "",
    "pkg/mid/a.py": "def f():\n    from pkg.mid import b\n",           # function-level import
    "pkg/mid/b.py": "from . import a\n",                                  # relative: closes a cycle a <-> b
    "pkg/low.py": "import importlib\n\ndef g():\n    importlib.import_module('pkg.top')\n",  # upward, by string
    "pkg/leaf.py": "from pkg.low import g\nfrom pkg import __doc__\n",    # a name in a module; the root package
    "pkg/mid/c.py": "JOB = lazy('pkg.top', 'JOB')\nNOT = lazy(name, 'X')\n",  # upward, by a lazy reference
}
SYNTHETIC_LAYERS = (("pkg", "pkg.top"), ("pkg.mid",), ("pkg.low",), ("pkg.leaf",))


def test_checker_finds_a_cycle_and_an_upward_import(tmp_path):
    for rel, text in SYNTHETIC.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    g = import_graph(tmp_path / "pkg", "pkg")
    assert g == {"pkg": set(), "pkg.top": {"pkg.low"}, "pkg.mid": set(), "pkg.mid.a": {"pkg.mid.b"},
                 "pkg.mid.b": {"pkg.mid.a"}, "pkg.low": {"pkg.top"}, "pkg.leaf": {"pkg.low"},
                 "pkg.mid.c": {"pkg.top"}}
    assert cycles(g) == [["pkg.low", "pkg.top"], ["pkg.mid.a", "pkg.mid.b"]]
    assert upward_imports(g, SYNTHETIC_LAYERS) == ["pkg.leaf (layer 4) imports pkg.low (layer 3)",
                                                   "pkg.low (layer 3) imports pkg.top (layer 1)",
                                                   "pkg.mid.c (layer 2) imports pkg.top (layer 1)"]
    assert unlayered({**g, "other": set()}, SYNTHETIC_LAYERS) == ["other"]


@pytest.mark.parametrize("module,layer", [("raycpt.cli", 0), ("raycpt.jobs.eval", 1), ("raycpt.tasks.utils", 3),
                                          ("raycpt.report.eval", 4), ("raycpt.tasks", 10), ("raycpt.io", 11)])
def test_longest_prefix_names_the_layer(module, layer):
    assert layer_of(module, LAYERS) == layer
