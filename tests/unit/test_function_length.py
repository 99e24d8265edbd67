"""No function in raycpt/ is longer than 80 lines: a longer one is several named steps.

Counted with ``ast`` over every ``def`` / ``async def`` in the package, nested ones and methods
included, from the ``def`` line to the last line of its body (docstring and comments inside count;
decorators do not). The self-test below shows the counter sees a long nested function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "raycpt"
LIMIT = 80



def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every function in ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append((node.name, node.lineno, n))
    return sorted(out, key=lambda t: t[1])


def _files():
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _rel(f: Path) -> str:
    return f.relative_to(PACKAGE_DIR).as_posix()


@pytest.mark.parametrize("rel", [_rel(f) for f in _files()])
def test_no_function_longer_than_80_lines(rel):
    assert long_functions((PACKAGE_DIR / rel).read_text(encoding="utf-8")) == []


def test_counter_sees_nested_and_async_functions():
    body = "\n".join(f"        x{i} = {i}" for i in range(79))
    src = f"def outer():\n    def inner():\n{body}\n    return inner\n\nasync def short():\n    return 1\n"
    # inner: its def line + 79 body lines = 80 (at the limit); outer = 1 + 80 + 1 = 82
    assert long_functions(src) == [("outer", 1, 82)]
    assert long_functions(src, limit=79) == [("outer", 1, 82), ("inner", 2, 80)]
    assert long_functions("async def a():\n" + "    pass\n" * 81) == [("a", 1, 82)]
