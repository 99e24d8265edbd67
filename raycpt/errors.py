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
