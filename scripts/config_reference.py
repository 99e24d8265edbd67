"""Print (or, with --write, refresh in docs/config.md) the config reference table, generated from the
docstrings of the dataclass fields in raycpt/config/, so the docs never drift from the code."""

from __future__ import annotations

import sys
from pathlib import Path

from raycpt.config import field_docs

BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def table() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for name, default, doc in field_docs():
        default = default.replace("|", "\\|")
        if len(default) > 60:
            default = default[:57] + "..."
        rows.append(f"| `{name}` | `{default}` | {doc.replace('|', '/')} |")
    return "\n".join(rows)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def main() -> int:
    readme = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    if "--write" in sys.argv:
        text = readme.read_text(encoding="utf-8")
        start, end = text.index(BEGIN), text.index(END) + len(END)
        readme.write_text(text[:start] + block() + text[end:], encoding="utf-8")
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
