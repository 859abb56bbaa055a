"""Errors a user can cause, each carrying the exit code the CLI maps it to.

Exit codes (stable, documented in the README):
  0 ok, 1 the check found a problem, 2 usage or input error, 3 an external service is unreachable.
"""

from __future__ import annotations


class HicacheError(Exception):
    """An error with a one-sentence message and an optional hint on how to fix it."""

    exit_code = 1
    code = "error"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(HicacheError):
    """Bad flags, values, files or geometry supplied by the user (exit 2)."""

    exit_code = 2
    code = "input_error"


class UnreachableError(HicacheError):
    """A Mooncake master, store or serve instance did not answer (exit 3)."""

    exit_code = 3
    code = "unreachable"


class CheckFailed(HicacheError):
    """A check ran and found a problem (exit 1)."""

    exit_code = 1
    code = "check_failed"
