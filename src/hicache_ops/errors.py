"""Errors a user can cause, each carrying the exit code the CLI maps it to.

Exit codes (stable, documented in the README):
  0 ok, 1 the check found a problem, 2 usage or input error, 3 an external service is unreachable.
"""

from __future__ import annotations


class HicacheError(Exception):
    """An error with a one-sentence message and an optional hint on how to fix it.

    `kind` names the condition for scripts and playbooks where one is worth testing (e.g. "l3_down"),
    so they never match the message's wording; it is part of the JSON error, stable across releases.
    """

    exit_code = 1
    code = "error"

    def __init__(self, message: str, hint: str | None = None, *, kind: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.kind = kind


class InputError(HicacheError):
    """Bad flags, values, files or geometry supplied by the user (exit 2)."""

    exit_code = 2
    code = "input_error"


class SettingError(InputError):
    """A bad value of one named setting: `setting` is its field name in the library's own words
    (a concern dataclass field such as `tp_size`, or a command argument such as `timeout`).

    The message is `detail` after the setting's name; `worded(name)` gives it after another name
    (the CLI puts its flag there, `--tp-size`, mapped once in cli/common/output.py).
    """

    def __init__(self, setting: str, detail: str, hint: str | None = None):
        self.setting = setting
        self.detail = detail
        super().__init__(f"{setting} {detail}", hint)

    def worded(self, name: str) -> str:
        return f"{name} {self.detail}"


class UnreachableError(HicacheError):
    """A Mooncake master, store or serve instance did not answer (exit 3)."""

    exit_code = 3
    code = "unreachable"


class CheckFailed(HicacheError):
    """A check ran and found a problem (exit 1)."""

    exit_code = 1
    code = "check_failed"


def transport_reason(exc: BaseException, timeout_s: float | None = None) -> str:
    """Why a connection failed, in a few words a person can act on, never the peer's raw bytes.

    Works on the exceptions of http.client, httpx and sockets alike (walks the cause chain): a
    closed port reads "connection refused", a peer that does not speak HTTP "not an HTTP answer".
    """
    import errno

    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    names = {type(e).__name__ for e in seen}
    texts = " ".join(str(e) for e in seen).lower()
    if any(isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED for e in seen):
        return "connection refused"
    if "connection refused" in texts:
        return "connection refused"
    if any(isinstance(e, TimeoutError) for e in seen) or any("Timeout" in n for n in names):
        return f"no answer within {timeout_s:g} s" if timeout_s else "no answer in time"
    if names & {"BadStatusLine", "LineTooLong", "RemoteProtocolError", "LocalProtocolError", "UnknownProtocol"}:
        return "what answered is not an HTTP server"
    if any(isinstance(e, (ConnectionResetError, BrokenPipeError)) for e in seen) or "RemoteDisconnected" in names:
        return "the connection was dropped"
    if any(isinstance(e, OSError) and getattr(e, "strerror", None) for e in seen):
        return next(e.strerror for e in seen if isinstance(e, OSError) and e.strerror).lower()
    return type(exc).__name__
