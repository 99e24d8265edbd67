"""One exception type for everything a user can get wrong.

The CLI catches :class:`RaycptError`, prints its message as one line and exits with code 2.
Library code raises it for bad input (config, files, model references); programming errors
stay ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations


class RaycptError(Exception):
    """A user-facing error: one line, no traceback, exit code 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ConfigError(RaycptError):
    """A config value that is missing, mistyped or out of range."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"config error: {field}={value!r}: {allowed}")


def read_user_text(path, what: str) -> str:
    """The text of a file the user named, or one RaycptError line saying why not: not found, a
    directory where a file is expected, unreadable, or not UTF-8 text (a binary file)."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise RaycptError(f"{what} {p} is a directory; expected a file")
    if not p.exists():
        raise RaycptError(f"{what} not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RaycptError(f"{what} {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                          "is it a binary file?") from None
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
