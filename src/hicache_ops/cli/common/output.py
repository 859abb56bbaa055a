"""One way to print: data on stdout (a Rich rendering or JSON), diagnostics and errors on stderr.

In JSON mode an error is printed on stdout as {"error": {"code", "message", "hint"}} (plus "kind"
where the error names a condition scripts may test, e.g. "l3_down") so a script reading stdout
always gets JSON; the exit code says which kind of failure it was.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

import typer
from rich.console import Console

from hicache_ops.errors import HicacheError, SettingError

# highlight=False: Rich would otherwise colour numbers and paths inside our sentences at random.
stdout = Console(soft_wrap=True, highlight=False)
stderr = Console(stderr=True, soft_wrap=True, highlight=False)

DEBUG_ENV = "HICACHE_DEBUG"
# ctx.meta key of what --sglang-url read (a ServerProvenance, set by sglang_url_option), which
# emit adds to the command's JSON.
PROVENANCE = "hicache.sglang_url"
# ctx.meta key of the rules --sglang-version chose (an SglangRulesView and its warnings), likewise.
RULES = "hicache.sglang_rules"
# The running command's options: parameter name -> its flag (set by HicacheCommand.invoke), so a
# library error naming a setting names the flag that sets it.
COMMAND_FLAGS: ContextVar[Mapping[str, str]] = ContextVar("command_flags", default=MappingProxyType({}))
# The invocation's arguments (set by the root app), for options whose meaning depends on another.
ARGV: ContextVar[tuple[str, ...]] = ContextVar("argv", default=())
# The running command's `ctx.meta` (set by HicacheCommand.invoke), where its options leave what
# they read (PROVENANCE, RULES) for emit. Typer has no public way to ask for the current context.
COMMAND_META: ContextVar[Mapping[str, Any]] = ContextVar("command_meta", default=MappingProxyType({}))


def provenance_fields() -> dict[str, Any]:
    """The JSON fields the running command's options add (what --sglang-url read, the rules
    --sglang-version chose, its warnings as `notes`); empty without those options."""
    meta = COMMAND_META.get()
    fields: dict[str, Any] = {}
    if meta.get(RULES) is not None:
        rules, notes = meta[RULES]
        fields["sglang_rules"] = json_data(rules)
        if notes:
            fields["notes"] = list(notes)
    if meta.get(PROVENANCE) is not None:
        fields.update(json_data(meta[PROVENANCE]))
    return fields


def _merged(data: dict[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
    """The result's fields and the options' ones; an option's notes follow the result's own."""
    out = {**data, **extras}
    if "notes" in extras and isinstance(data.get("notes"), list):
        out["notes"] = [*data["notes"], *extras["notes"]]
    return out


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(json_data(data), indent=2, default=str) + "\n")
    sys.stdout.flush()


def json_data(result: Any) -> Any:
    """The one JSON rendering of a command's result (hicache_ops.results.json_data), loaded with the
    command that prints it, not with `hicache --help`."""
    from hicache_ops.results import json_data as render

    return render(result)


def emit(result: Any, json_output: bool, render: Callable[[Any], None]) -> None:
    """Print `result` as JSON (json_data, plus what --sglang-url read, beside the result's own fields),
    or hand it to `render` for people."""
    if json_output:
        data = json_data(result)
        extras = provenance_fields()
        print_json(_merged(data, extras) if extras and isinstance(data, dict) else data)
    else:
        render(result)


def print_wrapped(text: str, indent: int = 0, console: Console | None = None, *, hang: int = 0) -> None:
    """Print one line of prose (Rich markup allowed) wrapped to the terminal's width, every
    wrapped line indented by `indent` spaces (the lines after the first by `hang` more, so a
    continuation never reads as a new item), with no trailing padding."""
    console = console or stdout
    rendered = console.render_str(text)
    for n, line in enumerate(rendered.wrap(console, max(console.width - indent - hang, 20))):
        line.rstrip()
        console.print(" " * (indent + (hang if n else 0)), line, sep="", soft_wrap=True)


# Human output shows this many rows of detail after its verdict; --all shows every row.
DETAIL_ROWS = 20


def first_rows(rows: list, show_all: bool, limit: int = DETAIL_ROWS) -> tuple[list, int]:
    """The rows to print and how many were left out (none with --all)."""
    if show_all or len(rows) <= limit:
        return rows, 0
    return rows[:limit], len(rows) - limit


def print_left_out(left_out: int, what: str = "rows") -> None:
    if left_out:
        stdout.print(f"[dim]{left_out} more {what} (use --all or --json)[/]")


def setting_flag(setting: str) -> str:
    """The flag of a library setting: the running command's option of that parameter name (its
    longest spelling, `--hicache-mem-layout` for `layout`), else the name as a flag (`--tp-size`).
    One flag has one parameter name (tests/cli/test_options.py), so this is the whole mapping."""
    return COMMAND_FLAGS.get().get(setting) or "--" + setting.replace("_", "-")


def error_message(err: HicacheError) -> str:
    """The error in the CLI's words: a setting the library names becomes the flag that sets it."""
    if isinstance(err, SettingError):
        return err.worded(setting_flag(err.setting))
    return err.message


def error_payload(err: HicacheError) -> dict:
    error: dict[str, str | None] = {"code": err.code, "message": error_message(err), "hint": err.hint}
    if err.kind is not None:
        error["kind"] = err.kind
    return {"error": error}


def print_error(err: HicacheError, json_output: bool) -> None:
    if json_output:
        print_json(error_payload(err))
        return
    stderr.print(f"[bold red]error:[/] {error_message(err)}")
    if err.hint:
        stderr.print(f"[dim]hint:[/] {err.hint}")


@contextmanager
def reporting(json_output: bool) -> Iterator[None]:
    """Turn the library's known errors into one clear message and their exit code; SIGTERM ends a
    command like Ctrl-C (one line, exit 130) unless the command installed its own stop handling."""
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        yield
    except HicacheError as err:
        if os.environ.get(DEBUG_ENV):
            raise
        print_error(err, json_output)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        # A command without a stop-aware loop (or a second Ctrl-C): one line, exit 130, no traceback.
        from hicache_ops.interrupt import Interrupted

        print_error(Interrupted("interrupted before it finished; nothing more was done."), json_output)
        raise typer.Exit(130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt("SIGTERM")


@contextmanager
def native_stderr_to_file(
    log_dir: str | None, name: str = "mooncake_client.log", *, restore: bool = True
) -> Iterator[str]:
    """Send file descriptor 2 to a log file while the block runs, keeping sys.stderr on the terminal.

    Mooncake's client logs through glog straight to fd 2 and ignores GLOG_* variables before its
    own initialisation; this keeps a command's output readable. Yields the log file's path.
    Without `log_dir` the file lives in a temporary folder that is removed when the block ends
    well or is interrupted; when it fails and the log says something, the folder is kept and its
    path printed (the log explains the failure).
    `restore=False` leaves fd 2 on the file for the rest of the process (a command that ends
    right after, whose Mooncake destructors still log at interpreter exit); give it a `log_dir`.
    With HICACHE_DEBUG set, native lines stay on the terminal (yields "stderr").
    """
    if os.environ.get(DEBUG_ENV):
        yield "stderr"
        return
    temporary = log_dir is None
    folder = log_dir or tempfile.mkdtemp(prefix="hicache-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    sys.stderr.flush()
    saved_fd = os.dup(2)
    saved_stream = sys.stderr
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = os.fdopen(os.dup(saved_fd), "w", buffering=1)
    failed = False
    try:
        yield path
    except Exception:  # an interrupt is not a failure the log would explain
        failed = True
        raise
    finally:
        if restore:
            sys.stderr.flush()
            sys.stderr.close()
            sys.stderr = saved_stream
            os.dup2(saved_fd, 2)
        os.close(saved_fd)
        if temporary and restore:
            if failed and os.path.getsize(path):
                stderr.print(f"[dim]Mooncake's native log: {path}[/]")
            else:
                shutil.rmtree(folder, ignore_errors=True)
