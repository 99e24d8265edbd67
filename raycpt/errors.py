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
import time
from pathlib import Path
from typing import Optional


class RaycptError(Exception):
    """A user-facing error: one line, no traceback, exit code 2."""

    exit_code = 2


class ServerUnreachable(RaycptError):
    """The MLflow tracking server did not answer its health probe (a command that finds it gone mid-way, e.g. a
    sweep trial started after it went away, goes on locally: :func:`raycpt.runs.lost.store_or_lost`)."""

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


MAX_USER_FILE_BYTES = 256 << 20
"""The size cap of a user-named file read whole (a config or cluster file has its own, 1 MiB): a prompt, question,
ranking, benchmark or run-folder JSON file is far smaller; /dev/zero or a wrong multi-GB file is refused."""
READ_SECONDS = 30.0
"""The time cap of reading one user-named file whole (checked between 1 MiB chunks): a stalled network mount or a
file still being written past it is one line, not a wait without end."""
PATH_KINDS = ("file", "folder", "new", "ref", "files", "refs", "names")
"""What a command-line word that names a path must be (:func:`user_path`): ``file`` a regular file to read,
``folder`` an existing folder, ``new`` a folder to write (absent or a folder), ``ref`` a model reference (a folder or
a regular file when it exists), ``files``/``refs``/``names`` comma lists of those (``names``: a word with no ``/`` and
no suffix, or naming nothing, is a name)."""


def _kind_of(mode: int) -> str:
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def open_user_file(path, what: str):
    """THE way a user-named file is opened (:func:`read_user_bytes` and every streaming reader, e.g. a corpus, build
    on it): an open binary file, or one RaycptError line - not found, a directory, a FIFO, socket or device (checked
    before opening, and again on the opened descriptor: opened non-blocking, so a FIFO nobody writes cannot hang
    the open), unreadable."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise RaycptError(f"{what} not found: {p}") from None
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise RaycptError(f"{what} {p} is a directory; expected a file")
    if not stat.S_ISREG(st.st_mode):
        raise RaycptError(f"{what} {p} is {_kind_of(st.st_mode)}, not a regular file; expected a file")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
        os.close(fd)
        raise RaycptError(f"{what} {p} is {_kind_of(st.st_mode)}, not a regular file; expected a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_user_bytes(path, what: str, limit: Optional[int] = None, hint: str = "",
                    seconds: float = READ_SECONDS) -> bytes:
    """The bytes of a user-named file (:func:`open_user_file`), read whole with a size cap (``limit``, default
    :data:`MAX_USER_FILE_BYTES`; read with the cap, as ``st_size`` is 0 for /proc files) and a time cap
    (``seconds``); one RaycptError line otherwise."""
    p = Path(path)
    limit = MAX_USER_FILE_BYTES if limit is None else limit
    deadline = time.monotonic() + seconds
    chunks, n = [], 0
    with open_user_file(p, what) as f:
        size = p.stat().st_size  # 0 for /proc files and devices: the read's own count decides
        try:
            while n <= limit:
                chunk = f.read(min(1 << 20, limit + 1 - n))
                if not chunk:
                    break
                chunks.append(chunk)
                n += len(chunk)
                if time.monotonic() > deadline:
                    raise RaycptError(f"{what} {p}: reading it took more than {seconds:g} s (a stalled mount, or a "
                                      "file still being written?); nothing was used")
        except OSError as e:
            raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    if n > limit:
        size_text = f"{size:,} bytes" if size > limit else f"more than {limit:,} bytes"
        raise RaycptError(f"{what} {p} is {size_text}; {hint or 'a file here is'} at most {limit:,} bytes (is it "
                          "the right file?)")
    return b"".join(chunks)


def read_user_text(path, what: str, limit: Optional[int] = None, hint: str = "", encoding: str = "utf-8") -> str:
    """The text of a user-named file (:func:`read_user_bytes`: a regular file, size and time caps), or one
    RaycptError line; not UTF-8 (a binary file) names the first bad byte and its offset. ``utf-8-sig`` drops a BOM."""
    data = read_user_bytes(path, what, limit=limit, hint=hint)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise RaycptError(f"{what} {Path(path)} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                          f"{e.start}): is it a binary file?") from None


def read_user_json(path, what: str, shape: type = dict, limit: Optional[int] = None):
    """A user-named JSON file (:func:`read_user_text`) holding a ``shape`` (dict or list), or one RaycptError line
    naming the file, the line and column of a syntax error, or the shape found."""
    text = read_user_text(path, what, limit=limit)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise RaycptError(f"{what} {Path(path)} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") \
            from None
    if not isinstance(doc, shape):
        raise RaycptError(f"{what} {Path(path)} holds a JSON {type(doc).__name__}, not the {shape.__name__} "
                          "expected")
    return doc


def user_path(word: str, kind: str, what: str) -> None:
    """THE check of a command-line word that names a path, before any work (``kind``: :data:`PATH_KINDS`); one
    RaycptError line naming ``what`` and the word otherwise. A ``file`` is read as it will be read
    (:func:`read_user_text`: a regular file, size and time caps, UTF-8), so a bad one is refused before any work;
    its format (JSON, YAML and its aliases) is checked by the job's own read, which goes through the same reader."""
    if kind in ("files", "refs", "names"):
        for part in (w.strip() for w in str(word).split(",")):
            is_path = os.sep in part or Path(part).suffix  # a bare word (mmlu) is a name even beside a folder mmlu
            if part and (kind != "names" or (is_path and os.path.lexists(os.path.expanduser(part)))):
                user_path(part, {"files": "file", "refs": "ref", "names": "file"}[kind], what)
        return
    p = Path(os.path.expanduser(str(word)))
    if kind == "file":
        read_user_text(p, what)
        return
    try:
        st = p.stat()
    except FileNotFoundError:
        if kind == "folder":
            raise RaycptError(f"{what} not found: {p}") from None
        return  # a new folder, or a model reference that is no path (a hub id)
    except OSError as e:
        raise RaycptError(f"{what} {p} cannot be read: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode) or (kind == "ref" and stat.S_ISREG(st.st_mode)):
        return
    kind_text = "a regular file" if stat.S_ISREG(st.st_mode) else _kind_of(st.st_mode)
    raise RaycptError(f"{what} {p} is {kind_text}, not a folder; expected "
                      f"{'a model folder or file' if kind == 'ref' else 'a folder'}")


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
