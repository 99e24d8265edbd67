"""Issue 48: the help names what it asks for. ``-h`` is ``--help`` on the top-level command, every group and every
command of the parser (walked as tests/unit/test_user_paths.py walks it: a new command is covered when it is added),
and every command's usage line names its positional words (``RUN_DIR [CONFIG.yaml] [KEY=VALUE]...``), never a bare
``[ARGS]...``."""

from __future__ import annotations

import typer

from raycpt.cli import app
from raycpt.entry import main
from test_user_paths import leaf_commands


def group_paths() -> list[str]:
    """``["", "config", "models", ...]``: the top-level command and every group below it."""
    out = [""]

    def walk(cmd, path=()):
        for name, sub in getattr(cmd, "commands", {}).items():
            if hasattr(sub, "commands"):
                out.append(" ".join(path + (name,)))
                walk(sub, path + (name,))

    walk(typer.main.get_command(app))
    return out


def help_text(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def usage_line(text: str) -> str:
    """The help's usage line, its wrapped continuation lines (up to the blank line after it) joined."""
    lines = [ln.strip() for ln in text.splitlines()]
    (start,) = [i for i, ln in enumerate(lines) if ln.startswith("Usage:")]
    end = lines.index("", start)
    return " ".join(lines[start:end])


def test_short_h_is_help_everywhere(capsys):
    paths = group_paths() + sorted(leaf_commands())
    assert len(paths) == 1 + 7 + len(leaf_commands())  # the top level, the 7 groups, every command
    for path in paths:
        words = path.split()
        code_long, long, err_long = help_text(words + ["--help"], capsys)
        code_short, short, err_short = help_text(words + ["-h"], capsys)
        assert code_long == 0 and err_long == "", (path, err_long)
        assert code_short == 0 and err_short == "", (path, err_short)
        assert short == long, path
        assert usage_line(long).startswith(f"Usage: {' '.join(['raycpt'] + words)} "), (path, usage_line(long))


def test_every_usage_line_names_its_words(capsys):
    usage = {}
    for path in leaf_commands():
        code, out, _ = help_text(path.split() + ["--help"], capsys)
        assert code == 0, path
        usage[path] = usage_line(out)
        assert "[ARGS]..." not in usage[path].upper(), usage[path]
        assert "{" not in usage[path], usage[path]  # typer's {files}... for a required list
    words = "[CONFIG.yaml] [KEY=VALUE]..."
    expected = {  # by hand, from each command's positional words
        "sweep": f"Usage: raycpt sweep [OPTIONS] {words}",
        "config validate": f"Usage: raycpt config validate [OPTIONS] {words}",
        "runs show": f"Usage: raycpt runs show [OPTIONS] RUN_DIR {words}",
        "runs sync": f"Usage: raycpt runs sync [OPTIONS] RUN_DIR {words}",
        "runs export": f"Usage: raycpt runs export [OPTIONS] RUN_DIR OUT_DIR {words}",
        "compare": f"Usage: raycpt compare [OPTIONS] BASE TUNED {words}",
        "models pull": f"Usage: raycpt models pull [OPTIONS] [REF] {words}",  # REF defaults to model.ref
        "cluster check": "Usage: raycpt cluster check [OPTIONS] FILE...",
    }
    for path, line in expected.items():
        assert usage[path] == line, (path, usage[path])


def test_unknown_short_option_is_still_one_line(capsys):
    """``-h`` is taken; any other unknown short option stays a one-line usage error."""
    code, out, err = help_text(["runs", "show", "-q"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "-q" in err, err
