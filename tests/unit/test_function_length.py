"""No function in raycpt/ is longer than 80 lines (a longer one is several named steps) and no file longer than 600
(a longer one holds several ideas, each of which is a file).

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
FILE_LIMIT = 600



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


# ------------------------------------------------------------------------------------ file length
"""Counted as the lines of the file as read (``str.splitlines``: a final line without a newline counts, an empty
file is 0 lines), every ``.py`` under the package, ``__init__.py`` included."""


def line_count(text: str) -> int:
    return len(text.splitlines())


def too_long(text: str, limit: int = FILE_LIMIT) -> bool:
    return line_count(text) > limit


@pytest.mark.parametrize("rel", [_rel(f) for f in _files()])
def test_no_file_longer_than_600_lines(rel):
    n = line_count((PACKAGE_DIR / rel).read_text(encoding="utf-8"))
    assert n <= FILE_LIMIT, f"raycpt/{rel} has {n} lines (at most {FILE_LIMIT}): split it along its seams"


def test_counter_sees_a_601_line_file(tmp_path):
    f = tmp_path / "long.py"
    f.write_text("x = 1\n" * 601, encoding="utf-8")
    assert line_count(f.read_text(encoding="utf-8")) == 601 and too_long(f.read_text(encoding="utf-8"))
    f.write_text("x = 1\n" * 599 + "x = 1", encoding="utf-8")  # 600 lines, the last without a newline
    assert line_count(f.read_text(encoding="utf-8")) == 600 and not too_long(f.read_text(encoding="utf-8"))
    assert line_count("") == 0 and line_count("\n") == 1
