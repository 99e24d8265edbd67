"""The console entry point (``raycpt`` and ``python -m raycpt``): the command table of :mod:`raycpt.cli` run by
typer's click, and every way a command can end mapped to what the user sees - one line on stderr and exit code 2
for bad input (raycpt's own errors, typer's and click's usage errors, a full disk, a tracking server that stopped
answering), ``interrupted`` and 130 for Ctrl-C, never a traceback for them; a bug stays a traceback. A command that
finished while its tracking server was gone gets one warning line per run folder."""

from __future__ import annotations

import gc
import sys
from typing import Optional

import typer
from rich.console import Console

from raycpt.cli import app
from raycpt.errors import RaycptError, environment_error
from raycpt.runs.run import LOST_RUNS
from raycpt import runtime
from raycpt.runtime import NOISE, filter_stderr, quiet_environment
from raycpt.runs.lost import lost_line, read_lost, unreachable
from raycpt.usage import click_classes, set_verbose, usage_line, verbose

err_console = Console(stderr=True)


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: one line and exit 2 for user errors, never a traceback for them. The console script
    (``argv`` None) then exits without the interpreter's last heap walk (:func:`exit_quickly`)."""
    code = _main(argv)
    if argv is None:
        exit_quickly()
    return code


def _main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--verbose" in args:  # accepted anywhere (`raycpt sweep ... --verbose`), set before anything starts
        args.remove("--verbose")
        set_verbose(True)
    quiet_environment()
    if argv is None:  # the console script (not an in-process call)
        runtime.WATCH_PRIVATE_RAY = True  # Ray's own processes dying ends the run in one line (runtime.RayWatch)
        if not verbose():  # Ray's native noise off
            filter_stderr(NOISE)
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=args, prog_name="raycpt", standalone_mode=False)
        _warn_lost_tracking()
        return int(rv or 0) if isinstance(rv, int) else 0
    except RaycptError as e:
        err_console.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        return e.exit_code
    except click_classes("Exit") as e:
        return e.exit_code
    except click_classes("NoArgsIsHelpError"):  # `raycpt models`: typer has printed the group's help
        return 0
    except click_classes("ClickException") as e:  # typer's vendored click and click itself
        err_console.print(usage_line(e), markup=False, highlight=False, soft_wrap=True)
        return 2
    except OSError as e:  # a full disk, a read-only or unwritable folder: one line naming the path and the errno
        line = environment_error(e)
        if line is None:
            raise
        err_console.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
        return line.exit_code
    except click_classes("Abort") + (KeyboardInterrupt,):
        err_console.print("interrupted", markup=False)
        return 130
    except Exception as e:  # noqa: BLE001 - a tracking server that stopped answering is one line; bugs stay loud
        died = runtime.ray_death_line()  # a Ray call failed because Ray's own processes died (kill -9, OOM)
        if died is not None:
            err_console.print(died, markup=False, highlight=False, soft_wrap=True)
            return 2
        if not unreachable(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        err_console.print(f"error: the MLflow tracking server stopped answering ({first}); start it again (or "
                          "leave tracking.uri empty for SQLite in the run root), then run the same command with "
                          "--resume", markup=False, highlight=False, soft_wrap=True)
        return 2


def _warn_lost_tracking() -> None:
    """A command that finished while its tracking server was gone exits 0 (its run folder holds every result;
    ``raycpt runs sync`` records them later) with one warning line per such run folder."""
    for run_dir in LOST_RUNS:
        err_console.print(lost_line(run_dir, read_lost(run_dir)), markup=False, highlight=False, soft_wrap=True)


def _entry() -> None:  # pragma: no cover
    sys.exit(main())


def exit_quickly() -> None:
    """The command is over (its files closed, its runs ended): leave the interpreter's last garbage collection
    out. ``gc.freeze()`` moves every object to the permanent generation, which that collection skips: it walked
    the whole heap of torch, transformers, Ray and MLflow for ~2.7 s on this machine (py-spy: ``gc_collect_main``
    after the last line). Exit handlers still run; objects are still freed by reference count."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    _entry()
