"""One exception type for everything a user can get wrong.

The CLI catches :class:`RaycptError`, prints its message as one line and exits with code 2.
Library code raises it for bad input (config, files, model references); programming errors
stay ordinary exceptions so they keep their traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Optional


class RaycptError(Exception):
    """A user-facing error: one line, no traceback, exit code 2."""

    exit_code = 2


class ServerUnreachable(RaycptError):
    """The MLflow tracking server did not answer its health probe (a command that finds it gone mid-way, e.g. a
    sweep trial started after it went away, goes on locally: :func:`raycpt.tracking.store_or_lost`)."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ConfigError(RaycptError):
    """A config value that is missing, mistyped or out of range."""

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"config error: {field}={value!r}: {allowed}")


def json_record(line: str, where: str, fields) -> dict:
    """One JSONL line as an object holding ``fields``; otherwise one line naming ``where`` (a file and line)."""
    need = ", ".join(fields)
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise RaycptError(f"{where} is not JSON ({e.msg} at column {e.colno}; each line needs {need})") from None
    if not isinstance(rec, dict):
        raise RaycptError(f"{where} is not a JSON object (a {type(rec).__name__}; each line needs {need})")
    missing = [k for k in fields if k not in rec]
    if missing:
        raise RaycptError(f"{where} lacks {', '.join(missing)} (each line needs {need})")
    return rec


def read_user_text(path, what: str, limit: Optional[int] = None, hint: str = "") -> str:
    """The text of a file the user named, or one RaycptError line saying why not: not found, a
    directory where a file is expected, not a regular file (a FIFO nobody writes would block, a device
    such as /dev/zero never ends), unreadable, over ``limit`` bytes (read with a cap: ``st_size`` is 0
    for /proc files and devices), or not UTF-8 text (a binary file)."""
    p = Path(path)
    if p.is_dir():
        raise RaycptError(f"{what} {p} is a directory; expected a file")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise RaycptError(f"{what} not found: {p}") from None
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise RaycptError(f"{what} {p} is {kind}, not a regular file; expected a file")
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1) if limit is not None else f.read()
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    if limit is not None and len(data) > limit:
        size = f"{st.st_size:,} bytes" if st.st_size > limit else f"more than {limit:,} bytes"
        raise RaycptError(f"{what} {p} is {size}; {hint or 'a file here is'} at most {limit:,} bytes (is it the "
                          "right file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RaycptError(f"{what} {p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                          "is it a binary file?") from None


#: errnos that say the machine, not the code, refused: a full disk or quota, a read-only or unwritable folder
ENVIRONMENT_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO")
#: of those, the ones a retry cannot cure (a full disk stays full, a read-only or unwritable root stays so); EIO
#: (a flaky device or network file system) may pass, so it stays retryable
NON_RETRYABLE_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM")


_WORDS = {"No space left on device": "ENOSPC", "Disk quota exceeded": "EDQUOT", "Read-only file system": "EROFS",
          "Permission denied": "EACCES", "Operation not permitted": "EPERM"}


def oserror_in_words(e: BaseException, path) -> Optional[OSError]:
    """``OSError(errno, strerror, path)`` for an error that is a full disk or an unwritable folder told in words
    only - torch.save's ``RuntimeError`` ("unexpected pos", with no space left), safetensors' ``SafetensorError``
    ("I/O error: No space left on device (os error 28)"), pyarrow's errno-less ``OSError`` - so that it becomes the
    one line (:func:`environment_error`); a quoted absolute path in the text names the file, else ``path``. None for
    any other error, and for an ``OSError`` that has its errno."""
    if isinstance(e, OSError) and e.errno is not None:
        return None
    text = str(e)
    m = re.search(r"(?:os error|errno)\s*(\d+)", text, re.IGNORECASE)
    code = int(m.group(1)) if m else None
    if code is None:
        code = next((getattr(errno, n) for w, n in _WORDS.items() if w in text), None)
    if code is None or errno.errorcode.get(code) not in ENVIRONMENT_ERRNOS:
        return None
    named = re.search(r"['\"](/[^'\"]+)['\"]", text)
    return OSError(code, os.strerror(code), named.group(1) if named else str(path))


def disk_full(path, spare: int = 1 << 20) -> bool:
    """Whether the file system holding ``path`` has less than ``spare`` bytes left for this user."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < spare


def non_retryable_oserror(e: Optional[BaseException]) -> Optional[OSError]:
    """The first ``OSError`` with an errno of :data:`NON_RETRYABLE_ERRNOS` in ``e``'s chain - ``__cause__``,
    ``__context__``, and what Ray hangs errors on (``.cause``, ``._base_exc``, a ``worker_failures`` dict of rank -> error) - or
    None. A worker failure of that kind is not worth another attempt of the training run."""
    seen, todo = set(), [e]
    while todo:
        cur = todo.pop(0)
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OSError) and errno.errorcode.get(cur.errno or -1) in NON_RETRYABLE_ERRNOS:
            return cur
        failures = getattr(cur, "worker_failures", None)
        todo += [getattr(cur, "cause", None), getattr(cur, "_base_exc", None), cur.__cause__, cur.__context__,
                 *(failures.values() if isinstance(failures, dict) else ())]
    return None


def environment_error(e: BaseException):
    """The one line (a :class:`RaycptError`) for an ``OSError`` the environment caused - a full disk or quota, a
    read-only or unwritable folder, an I/O error - naming the path and the errno; None for any other error."""
    if not isinstance(e, OSError) or errno.errorcode.get(e.errno or -1) not in ENVIRONMENT_ERRNOS:
        return None
    where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "") if e.filename else "a file"
    hint = "free some space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
    return RaycptError(f"cannot write {where}: {e.strerror or e} ({errno.errorcode[e.errno]}); {hint}, then run "
                       "the same command with --resume to continue from the last checkpoint")
