"""The config reference (docs/config.md): every leaf field's dotted name, default and docstring."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing

from raycpt.config.experiment import ExperimentConfig


def field_docs(cls=ExperimentConfig) -> list[tuple[str, str, str]]:
    """(dotted name, default, doc) for every leaf field: the README's config reference."""
    out = []

    def docs_of(c):
        src = inspect.getsource(c)
        tree = ast.parse(src)
        body = tree.body[0].body
        d = {}
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
                d[a.target.id] = " ".join(str(b.value.value).split())
        return d

    def walk(c, prefix):
        docs = docs_of(c)
        hints = typing.get_type_hints(c)
        inst = c()
        for f in dataclasses.fields(c):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            else:
                out.append((prefix + f.name, repr(getattr(inst, f.name)), docs.get(f.name, "")))

    walk(cls, "")
    return out
