"""No file in raycpt/ is longer than 600 lines: a longer one holds several ideas, each of which is a file.

Counted as the lines of the file as read (``str.splitlines``: a final line without a newline counts, an
empty file is 0 lines), every ``.py`` under the package, ``__init__.py`` included. The self-test below shows
the counter sees a 601-line file and passes a 600-line one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "raycpt"
LIMIT = 600


def line_count(text: str) -> int:
    return len(text.splitlines())


def too_long(text: str, limit: int = LIMIT) -> bool:
    return line_count(text) > limit


def _files():
    return sorted(PACKAGE_DIR.rglob("*.py"))


def _rel(f: Path) -> str:
    return f.relative_to(PACKAGE_DIR).as_posix()


@pytest.mark.parametrize("rel", [_rel(f) for f in _files()])
def test_no_file_longer_than_600_lines(rel):
    n = line_count((PACKAGE_DIR / rel).read_text(encoding="utf-8"))
    assert n <= LIMIT, f"raycpt/{rel} has {n} lines (at most {LIMIT}): split it along its seams"


def test_counter_sees_a_601_line_file(tmp_path):
    f = tmp_path / "long.py"
    f.write_text("x = 1\n" * 601, encoding="utf-8")
    assert line_count(f.read_text(encoding="utf-8")) == 601 and too_long(f.read_text(encoding="utf-8"))
    f.write_text("x = 1\n" * 599 + "x = 1", encoding="utf-8")  # 600 lines, the last without a newline
    assert line_count(f.read_text(encoding="utf-8")) == 600 and not too_long(f.read_text(encoding="utf-8"))
    assert line_count("") == 0 and line_count("\n") == 1
