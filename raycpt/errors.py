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


#: errnos that say the machine, not the code, refused: a full disk or quota, a read-only or unwritable folder
ENVIRONMENT_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO")


def environment_error(e: BaseException):
    """The one line (a :class:`RaycptError`) for an ``OSError`` the environment caused - a full disk or quota, a
    read-only or unwritable folder, an I/O error - naming the path and the errno; None for any other error."""
    import errno

    if not isinstance(e, OSError) or errno.errorcode.get(e.errno or -1) not in ENVIRONMENT_ERRNOS:
        return None
    where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "") if e.filename else "a file"
    hint = "free some space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
    return RaycptError(f"cannot write {where}: {e.strerror or e} ({errno.errorcode[e.errno]}); {hint}, then run "
                       "the same command with --resume to continue from the last checkpoint")
