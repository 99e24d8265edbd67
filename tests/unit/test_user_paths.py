"""Rule 4 (issue 51): one way to read a user-named file.

Every command of the CLI, enumerated from its own parser (typer's click tree: a new command is covered when it is
added), is fed ``/dev/zero``, a FIFO nobody writes, a directory, non-UTF-8 bytes and an alias-bomb YAML in every slot
that can name a path: the CONFIG word, each positional word of its row (``BASE TUNED``, ``RUN_DIR OUT_DIR``, ``REF``)
and every option that takes a value. Each must end in one line on stderr, nothing else, a nonzero exit, within a few
seconds (a SIGALRM stops a hang and fails the case). Then the reader itself: its caps, the offset of a bad byte, a
FIFO opened without a wait.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import typer

from raycpt.cli import COMMANDS, app
from raycpt.entry import main
from raycpt.errors import PATH_KINDS, RaycptError, read_user_bytes, read_user_json, read_user_text, user_path

BAD = ("zero", "fifo", "dir", "binary", "bomb")
FOLDER_KINDS = ("folder", "new", "ref", "refs")
SECONDS = 5.0
BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(10))


def leaf_commands() -> dict:
    """``{"runs export": click command, ...}``: every command the CLI's parser holds."""
    out = {}

    def walk(cmd, path=()):
        for name, sub in getattr(cmd, "commands", {}).items():
            if hasattr(sub, "commands"):
                walk(sub, path + (name,))
            else:
                out[" ".join(path + (name,))] = sub

    walk(typer.main.get_command(app))
    return out


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict:
    """Each bad input twice: ``NAME.yaml`` (taken as CONFIG) and ``NAME.bin`` (taken as a positional word)."""
    root = tmp_path_factory.mktemp("bad")
    out = {}
    for suffix in (".yaml", ".bin"):
        (root / f"zero{suffix}").symlink_to("/dev/zero")
        os.mkfifo(root / f"fifo{suffix}")
        (root / f"dir{suffix}").mkdir()
        (root / f"binary{suffix}").write_bytes(b"model:\n  ref: caf\xe9\n")
        (root / f"bomb{suffix}").write_text(BOMB)
        out.update({(n, suffix): str(root / f"{n}{suffix}") for n in BAD})
    (root / "ok_dir").mkdir()
    out["ok_dir"] = str(root / "ok_dir")
    return out


class Hang(Exception):
    pass


def run_cli(argv: list[str], capfd) -> tuple[int, str, str, float]:
    """``raycpt ARGV`` in this process: (exit code, stdout, stderr, seconds); a SIGALRM after 3x the bound."""
    def alarm(signum, frame):
        raise Hang(f"raycpt {' '.join(argv)} did not end within {3 * SECONDS:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 3 * SECONDS)
    t0 = time.monotonic()
    try:
        code = main(argv)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    took = time.monotonic() - t0
    out, err = capfd.readouterr()
    return code, out, err, took


def cases(bad: dict) -> list[tuple[str, list[str], str]]:
    """``(command, argv, the bad path)`` for every path slot of every command of the parser: its positional words
    (CONFIG, then the row's own words) and its options that name a path (``Opt.path``; every option whose help
    speaks of a file or folder must have one: :func:`test_the_walk_covers_every_command_and_path_option`)."""
    out = []
    for name, cmd in leaf_commands().items():
        words = name.split()
        row = COMMANDS.get(name)
        rest = row.rest if row is not None else 0
        kinds = {o.name: o.path for o in row.options} if row is not None else {}
        for p in cmd.params:
            if p.param_type_name == "argument":  # the CONFIG word (cluster check: each FILE)
                out += [(name, words + [bad[(n, ".yaml")]], bad[(n, ".yaml")]) for n in BAD]
                for i in range(rest):  # each positional word of the row, the others an empty folder
                    for n in BAD:
                        rest_words = [bad["ok_dir"]] * rest
                        rest_words[i] = bad[(n, ".bin")]
                        out.append((name, words + rest_words, bad[(n, ".bin")]))
            elif kinds.get(p.name) is not None:  # every option that names a path
                filler = [bad["ok_dir"]] * rest
                out += [(name, words + filler + [p.opts[0], bad[(n, ".yaml")]], bad[(n, ".yaml")]) for n in BAD
                        if n != "dir" or kinds[p.name] not in FOLDER_KINDS]  # a folder is what those name
    return out


def test_the_walk_covers_every_command_and_path_option(bad):
    """The walk reaches every command of the parser, every row's positional words and path options."""
    got = cases(bad)
    commands = {c for c, _, _ in got}
    assert commands == set(leaf_commands()) and len(commands) == len(COMMANDS) + 1  # + cluster check
    for name, row in COMMANDS.items():
        assert len(row.rest_paths) == row.rest, f"{name}: name what each of its {row.rest} word(s) is (rest_paths)"
        for o in row.options:
            assert o.path is None or o.path in PATH_KINDS, (name, o.name, o.path)
            if any(w in o.help.lower() for w in ("file", "folder")) and o.type is not bool:
                assert o.path is not None, f"{name} --{o.name} names a file or folder: give it path= (PATH_KINDS)"


def test_every_path_slot_of_every_command_refuses_bad_files_in_one_line(bad, capfd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default run root's write probe lands here
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    for row in COMMANDS.values():  # every job's module imported first: the bound times the command, not torch's import
        row.job.resolve()
    failures = []
    for name, argv, path in cases(bad):
        try:
            code, out, err, took = run_cli(argv, capfd)
        except Hang as e:
            failures.append(str(e))
            continue
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if code == 0 or len(lines) != 1 or "Traceback" in err or took > SECONDS or out.strip():
            failures.append(f"raycpt {' '.join(argv)}: exit {code}, {took:.1f} s, stdout {out[-200:]!r}, "
                            f"stderr {err[-600:]!r}")
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} case(s))"


# ------------------------------------------------------------------------------------ the reader itself
def test_the_reader_bounds_size_time_and_names_the_bad_byte(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}' + b" " * 100)
    with pytest.raises(RaycptError) as e:
        read_user_bytes(p, "test file", limit=50, hint="a test file is")
    assert str(e.value) == f"test file {p} is 108 bytes; a test file is at most 50 bytes (is it the right file?)"
    with pytest.raises(RaycptError) as e:
        read_user_bytes("/dev/zero", "test file")
    assert str(e.value) == "test file /dev/zero is a device, not a regular file; expected a file"
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(RaycptError) as e:
        read_user_bytes(p, "test file", seconds=30)
    assert "reading it took more than 30 s" in str(e.value)
    monkeypatch.undo()
    p.write_bytes(b'{"a": "caf\xe9"}')
    with pytest.raises(RaycptError) as e:
        read_user_text(p, "test file")
    assert str(e.value) == f"test file {p} is not UTF-8 text (byte 0xe9 at offset 10): is it a binary file?"
    p.write_text('{"a": 1,}')
    with pytest.raises(RaycptError) as e:
        read_user_json(p, "test file")
    assert str(e.value) == f"test file {p} is not valid JSON (Expecting property name enclosed in double quotes at " \
                           "line 1 column 9)"
    p.write_text("[1]")
    with pytest.raises(RaycptError, match="holds a JSON list, not the dict expected"):
        read_user_json(p, "test file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    for call in (lambda: read_user_text(fifo, "f"), lambda: user_path(str(fifo), "file", "--x"),
                 lambda: user_path(str(fifo), "folder", "RUN_DIR"), lambda: user_path(str(fifo), "ref", "REF")):
        with pytest.raises(RaycptError, match="FIFO"):
            call()
    assert time.monotonic() - t0 < 1.0


def test_user_path_kinds(tmp_path):
    f = tmp_path / "a.gguf"
    f.write_bytes(b"x")
    user_path(str(f), "ref", "REF")  # a model file is a reference
    user_path(str(tmp_path), "ref", "REF")
    user_path("HuggingFaceTB/SmolLM2-135M", "ref", "REF")  # no such path: a hub id
    user_path(str(tmp_path / "new"), "new", "OUT_DIR")
    user_path("mmlu,wordnet_mc", "names", "--tasks")
    (tmp_path / "mmlu").mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        user_path("mmlu", "names", "--tasks")  # a bare word is a name, even beside a folder of that name
        with pytest.raises(RaycptError, match="is a directory"):
            user_path("./mmlu", "names", "--tasks")
    finally:
        os.chdir(cwd)
    with pytest.raises(RaycptError, match=r"^RUN_DIR not found: "):
        user_path(str(tmp_path / "gone"), "folder", "RUN_DIR")
    with pytest.raises(RaycptError, match="is a regular file, not a folder; expected a folder"):
        user_path(str(f), "new", "OUT_DIR")
    with pytest.raises(RaycptError, match="is a directory; expected a file"):
        user_path(f"{f},{tmp_path}", "files", "--spearman")
    with pytest.raises(RaycptError, match="device"):
        user_path("mmlu,/dev/zero", "names", "--tasks")
    assert Path(f).read_bytes() == b"x"
