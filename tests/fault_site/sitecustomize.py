"""Fault injection for tests that drive the console script from outside: with ``RAYCPT_TEST_ENOSPC=DIR`` set, an
``os.replace`` (the last step of every atomic write) into DIR fails as a full disk does (ENOSPC). Put this
folder first on PYTHONPATH of the child process only."""

import errno
import os

_full = os.environ.get("RAYCPT_TEST_ENOSPC")
if _full:
    _replace = os.replace

    def _replace_on_a_full_disk(src, dst, *a, **k):
        if os.path.abspath(os.fspath(dst)).startswith(os.path.abspath(_full)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(dst))
        return _replace(src, dst, *a, **k)

    os.replace = _replace_on_a_full_disk
