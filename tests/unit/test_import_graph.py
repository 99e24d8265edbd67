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
4. ``raycpt.evaluate`` (and ``raycpt.evaluate_prefetch``, hub data fetched once on the driver) - the lm-eval
   bridge, with its task YAMLs (``evaluate/tasks/``) and ``evaluate/hooks.py``, the half lm-eval loads from them (it
   uses the bridge's answer extraction and question files; ``raycpt.tasks``, the vocabulary, imports nothing above it).
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
10. ``raycpt.runs`` (the run, its folder, records, store and lost server), ``raycpt.runtime`` (and ``raycpt.worker_setup``, ``raycpt.cluster``,
    ``raycpt.iam``, ``raycpt.ui``) - THE
    command lifecycle (``runs.command_run``) and run folders, MLflow (and its UI server), Ray bootstrap
    (``runs`` builds on ``tracking``, never the reverse).
11. ``raycpt.config``, ``raycpt.tasks`` (benchmark names, category tables, local copies' layouts) - the typed config tree.
12. ``raycpt.io``, ``raycpt.errors`` (and ``raycpt.splits``, ``raycpt.usage``, ``raycpt.stats``,
    ``raycpt.progress``) - atomic file helpers and run-root paths, ``RaycptError``, the split rule, usage-error
    words and the CLI table's vocabulary, bootstrap and seed intervals, THE progress bar: leaves.

Names in parentheses are modules other branches add; a module no layer names fails
:func:`test_every_module_has_a_layer`, so a new top-level module must be placed here on purpose.
The test ends with a self-test on a synthetic graph: a checker that finds nothing cannot pass for
one that works.

Imports inside functions are allow-listed below the graph checks: the third-party modules that may wait until a
function runs (``LAZY_THIRD_PARTY``, the reason per module), the stdlib exceptions (``LAZY_STDLIB``) and the
imports of raycpt's own modules that cannot be at the top of their file (``LAZY_RAYCPT``, "file:module" -> the
reason, at most ``MAX_LAZY_RAYCPT``), each with its own self-test on a synthetic package.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "raycpt"

# top to bottom; a module belongs to the layer of the longest prefix that names it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("raycpt", "raycpt.__main__", "raycpt.entry", "raycpt.cli"),
    ("raycpt.jobs",),
    ("raycpt.train",),
    ("raycpt.evaluate", "raycpt.evaluate_prefetch"),
    ("raycpt.report",),
    ("raycpt.diagnostics",),
    ("raycpt.strategies",),
    ("raycpt.data",),
    ("raycpt.models",),
    ("raycpt.runs", "raycpt.runtime", "raycpt.worker_setup", "raycpt.cluster", "raycpt.iam", "raycpt.ui"),
    ("raycpt.config", "raycpt.tasks"),
    ("raycpt.io", "raycpt.errors", "raycpt.splits", "raycpt.usage", "raycpt.stats", "raycpt.progress",
     "raycpt.registry",  # the leaf registry (issue 46 item 5): every layer above may register into it or read it
     "raycpt.decide"),  # issue 47's measures and search rule: pure, like stats
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
    assert "raycpt.train.worker.loop" in g["raycpt.train.driver.launch"]
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


@pytest.mark.parametrize("module,layer", [("raycpt.cli", 0), ("raycpt.jobs.eval", 1), ("raycpt.evaluate.hooks", 3),
                                          ("raycpt.report.eval", 4), ("raycpt.tasks", 10), ("raycpt.io", 11)])
def test_longest_prefix_names_the_layer(module, layer):
    assert layer_of(module, LAYERS) == layer


# ------------------------------------------------------------------------------------ imports inside functions
#
# An import belongs at the top of its file, where a reader sees what the file needs. Inside a function stay only
# (a) third-party modules named in LAZY_THIRD_PARTY, each with the reason it waits (import time, an optional or
# platform-only dependency, an attribute a test replaces), (b) the stdlib modules of LAZY_STDLIB, and (c) the few
# imports of raycpt's own modules named in LAZY_RAYCPT ("file:imported module"), each with the reason the import
# cannot be at the top: at most MAX_LAZY_RAYCPT of them in the whole package.

#: third-party modules that may be imported inside a function: top-level package -> why it waits
LAZY_THIRD_PARTY: dict[str, str] = {
    "torch": "1-2 s to import: `import raycpt`, the config, the CLI and a job's Ray driver (the work runs in "
             "workers) must not load it",
    "transformers": "seconds to import (and it imports torch): only where a model, config or tokenizer is loaded",
    "ray": "seconds to import: only where a job talks to Ray; light commands (models list, config show) never do",
    "mlflow": "about 1 s to import: only where a run is logged; tests replace mlflow.tracking.MlflowClient and "
              "mlflow's fluent functions, which a call-time import sees",
    "lm_eval": "seconds to import, and it loads its task registry: only when an evaluation runs",
    "peft": "imports transformers and torch: only when LoRA adapters are injected, saved or merged",
    "accelerate": "imports torch: only where a loaded model's non-persistent buffers are rebuilt (models/buffers.py)",
    "safetensors": "its torch half imports torch: only where weights are read or written",
    "huggingface_hub": "heavy (requests; its constants read the environment at import): only where the hub is "
                       "asked; tests replace snapshot_download, HfApi / HfFileSystem methods and its constants",
    "datasets": "seconds to import (pyarrow, pandas): only where hub eval data is loaded; tests replace "
                "datasets.load_dataset and datasets.config values",
    "pyarrow": "a large native library: only where a Parquet corpus is read",
    "pandas": "about 0.5 s to import: only for the trace's Parquet tables",
    "scipy": "scipy.stats takes about 0.3 s: only where an interval or a test needs a distribution",
    "matplotlib": "about 0.5 s, and the Agg backend must be chosen before pyplot: only where a figure is drawn",
    "numpy": "kept out of the modules `import raycpt` loads (the plan registry) and of the light report modules",
    "psutil": "a native module: only where processes or system metrics are read",
    "rich": "the CLI loads rich.console only; tables and progress bars load when something is drawn",
    "typer": "the CLI's: the library does not need it, usage.py reads its click's exception classes only to "
             "word a usage error",
    "click": "typer's click (older typer): read only to word a usage error, like typer",
    "tokenizers": "the fast tokenizer backend: only in a corpus pack task",
    "sqlalchemy": "MLflow's SQL store: only when the SQLite store template is made",
    "boto3": "optional (not a dependency): `raycpt cluster check` looks IAM instance profiles up with it when it "
             "is installed (raycpt/iam.py)",
    "botocore": "boto3's: imported with it",
}

#: stdlib modules that may stay inside a function (any other goes to the top): module -> why
LAZY_STDLIB: dict[str, str] = {
    "fcntl": "POSIX only: the file locks (store build, MLflow store, checkpoint publish) take it when they lock, so "
             "importing the modules does not depend on the platform having it",
}

#: raycpt's own modules imported inside a function: "file:imported module" -> why not at the top
LAZY_RAYCPT: dict[str, str] = {
    "raycpt/models/__init__.py:raycpt.models.hybrid.model":
        "the lazy registration of the hybrid model: runs when transformers' auto-model module loads; at the top "
        "`import raycpt` would import torch and transformers' modeling code",
    "raycpt/models/__init__.py:raycpt.models.hybrid.config":
        "the same for AutoConfig: the hybrid config class subclasses transformers' PretrainedConfig",
    "raycpt/strategies/apply.py:raycpt.models.stack":
        "`import raycpt` imports the plan registry and models.stack imports torch: stack_of() imports it with a "
        "model in hand (the one place the plans meet the model modules)",
    "raycpt/strategies/apply.py:raycpt.models.adapters":
        "models.adapters imports torch (see above): adapter_ids() runs with a model in hand",
    "raycpt/report/render.py:raycpt.report.sweep.views.runs_show":
        "render.py prints every command's result, light ones too (models list, config show): the sweep's tables "
        "import raycpt.stats, which imports numpy (runs show's sections only; their names: views.sections, light)",
    "raycpt/report/render.py:raycpt.report.sweep.views.terminal":
        "as raycpt.report.sweep.views.runs_show (numpy, for the sweep's compact verdict and table only)",
    "raycpt/report/render.py:raycpt.report.trace":
        "report.trace imports diagnostics.scores, which imports torch: only for the trace's table",
    "raycpt/report/render.py:raycpt.data.store":
        "data.store imports data.corpus, which imports numpy: only for the stores list",
}
MAX_LAZY_RAYCPT = 20



def function_imports(source: str, module: str, is_package: bool, known: Iterable[str] = ()
                     ) -> list[tuple[int, str]]:
    """``(line, module)`` of every import inside a function of ``source`` (methods and nested functions too):
    ``import x.y`` names ``x.y``; ``from x import y`` names ``x``, or ``x.y`` when that is one of the ``known``
    modules; a relative import is resolved; ``importlib.import_module`` / ``__import__`` with a literal name count."""
    known = set(known)
    out: list[tuple[int, str]] = []

    def names(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            return subs if len(subs) == len(node.names) else [base, *subs]
        if isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if fname in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                return [node.args[0].value]
        return []

    def walk(node, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside:
                out.extend((child.lineno, n) for n in names(child))
            walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(source), False)
    return sorted(out)


def lazy_imports(package_dir: Path = PACKAGE_DIR, package: str = "raycpt", skip: Iterable[str] = ()
                 ) -> dict[str, list[int]]:
    """``{"file:module": [lines]}`` of the imports inside functions of the package, ``file`` relative to the
    package's parent; files under a ``skip`` entry (a file, or a folder ending in ``/``) are left out."""
    skip = tuple(skip)
    mods = module_names(package_dir, package)
    out: dict[str, list[int]] = {}
    for m, f in mods.items():
        rel = f.relative_to(package_dir.parent).as_posix()
        if any(rel == s or (s.endswith("/") and rel.startswith(s)) for s in skip):
            continue
        for line, name in function_imports(f.read_text(encoding="utf-8"), m, f.name == "__init__.py", mods):
            out.setdefault(f"{rel}:{name}", []).append(line)
    return out


def _kind(name: str, package: str) -> str:
    top = name.split(".")[0]
    return "own" if top == package else "stdlib" if top in sys.stdlib_module_names else "third-party"


def unlisted(found: Mapping[str, list[int]], kind: str, allowed: Iterable[str], package: str = "raycpt"
             ) -> list[str]:
    """``"file:line: module"`` of every function-level import of ``kind`` (``"own"``: keyed by ``file:module``;
    ``"stdlib"``, ``"third-party"``: by top-level module) that ``allowed`` does not name."""
    allowed = set(allowed)
    out = []
    for key, lines in sorted(found.items()):
        rel, _, name = key.partition(":")
        if _kind(name, package) != kind:
            continue
        if (key if kind == "own" else name.split(".")[0]) not in allowed:
            out += [f"{rel}:{line}: {name}" for line in lines]
    return out


def stale(found: Mapping[str, list[int]], allowed: Iterable[str]) -> list[str]:
    """The ``file:module`` entries of an allow-list that no function-level import needs any more."""
    return sorted(set(allowed) - set(found))


def _tops(found: Mapping[str, list[int]]) -> set[str]:
    return {key.partition(":")[2].split(".")[0] for key in found}


def test_third_party_imports_inside_functions_are_named():
    found = lazy_imports()
    bad = unlisted(found, "third-party", LAZY_THIRD_PARTY)
    assert bad == [], "import these at the top, or name the module and its reason in LAZY_THIRD_PARTY"
    assert sorted(set(LAZY_THIRD_PARTY) - _tops(found)) == [], "no function imports these any more: drop them"


def test_stdlib_imports_inside_functions_go_to_the_top():
    found = lazy_imports()
    bad = unlisted(found, "stdlib", LAZY_STDLIB)
    assert bad == [], "a stdlib module costs nothing to import: at the top (or its reason in LAZY_STDLIB)"
    assert sorted(set(LAZY_STDLIB) - _tops(found)) == [], "no function imports these any more: drop them"


def test_raycpt_imports_inside_functions_are_on_the_allow_list():
    found = lazy_imports()
    assert unlisted(found, "own", LAZY_RAYCPT) == [], \
        "import at the top; if that makes a cycle or an upward edge, move the helper down"
    assert stale({k: v for k, v in found.items() if _kind(k.partition(":")[2], "raycpt") == "own"},
                 LAZY_RAYCPT) == []
    assert len(LAZY_RAYCPT) <= MAX_LAZY_RAYCPT
    assert sum(len(v) for k, v in found.items() if k in LAZY_RAYCPT) <= MAX_LAZY_RAYCPT
    assert all(reason.strip() for reason in [*LAZY_RAYCPT.values(), *LAZY_THIRD_PARTY.values(),
                                             *LAZY_STDLIB.values()])


SYNTHETIC_LAZY = {
    "pkg/__init__.py": "",
    "pkg/a.py": ("import json\nfrom pkg import b\n\n\ndef f():\n    import os\n    import numpy as np\n"
                 "    from pkg import b\n    from . import c\n\n\nclass K:\n    import re\n\n    def m(self):\n"
                 "        import importlib\n        importlib.import_module('pkg.b')\n        from pkg.b import thing\n"),
    "pkg/b.py": "thing = 1\n",
    "pkg/c.py": "def g():\n    def h():\n        import yaml.constructor\n    return lambda: __import__('scipy')\n",
}


def test_lazy_import_checker_finds_function_level_imports(tmp_path):
    for rel, text in SYNTHETIC_LAZY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = lazy_imports(tmp_path / "pkg", "pkg")  # module-level and class-level imports are not counted
    assert found == {"pkg/a.py:os": [6], "pkg/a.py:numpy": [7], "pkg/a.py:pkg.b": [8, 17, 18], "pkg/a.py:pkg.c": [9],
                     "pkg/a.py:importlib": [16], "pkg/c.py:yaml.constructor": [3], "pkg/c.py:scipy": [4]}
    assert unlisted(found, "third-party", {"numpy"}, "pkg") == ["pkg/c.py:4: scipy", "pkg/c.py:3: yaml.constructor"]
    assert unlisted(found, "stdlib", {"os"}, "pkg") == ["pkg/a.py:16: importlib"]
    assert unlisted(found, "own", {"pkg/a.py:pkg.c"}, "pkg") == ["pkg/a.py:8: pkg.b", "pkg/a.py:17: pkg.b",
                                                                  "pkg/a.py:18: pkg.b"]
    assert stale(found, {"pkg/a.py:pkg.c", "pkg/b.py:pkg.a"}) == ["pkg/b.py:pkg.a"]
    assert _tops(found) == {"os", "numpy", "pkg", "importlib", "yaml", "scipy"}
    assert lazy_imports(tmp_path / "pkg", "pkg", skip={"pkg/a.py"}).keys() == {"pkg/c.py:yaml.constructor",
                                                                              "pkg/c.py:scipy"}
    assert lazy_imports(tmp_path / "pkg", "pkg", skip={"pkg/"}) == {}
