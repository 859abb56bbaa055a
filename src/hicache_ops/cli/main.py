"""The root `hicache` app: composes the command groups and formats every failure."""

from __future__ import annotations

import os
import sys

import typer

from hicache_ops.cli import bench, inspect, lab, playbook, prefetch, serve, trace, upgrade, warm
from hicache_ops.cli import tap as tap_command
from hicache_ops.cli import te as te_command
from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup
from hicache_ops.cli.common.output import ARGV, DEBUG_ENV, JSON_EXTRAS, print_error, stderr
from hicache_ops.errors import HicacheError, InputError


def _json_requested(argv: list[str]) -> bool:
    return "--json" in argv


class _RootGroup(HicacheGroup):
    """With --json on the command line, Typer's own parse errors (unknown option, bad value,
    missing argument) are the JSON error object on stdout too, so a script reading stdout always
    gets JSON; without it, Typer's usual usage message."""

    def main(self, args=None, prog_name=None, **extra):
        # Each invocation starts with no JSON extras (in-process runs share the context).
        token = JSON_EXTRAS.set({})
        argv_token = ARGV.set(tuple(str(a) for a in (sys.argv[1:] if args is None else args)))
        try:
            return self._main(args, prog_name, **extra)
        finally:
            JSON_EXTRAS.reset(token)
            ARGV.reset(argv_token)

    def _main(self, args=None, prog_name=None, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        if not _json_requested(argv):
            return super().main(args=argv, prog_name=prog_name, **extra)
        extra.pop("standalone_mode", None)
        try:
            code = super().main(args=argv, prog_name=prog_name, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # Typer's bundled Click usage errors derive from it
            ctx = getattr(exc, "ctx", None)
            hint = f"See `{ctx.command_path} --help`." if ctx is not None else "See `hicache --help`."
            error = InputError(exc.format_message(), hint=hint)
            if exc.exit_code != InputError.exit_code:
                error = HicacheError(exc.format_message(), hint=hint)
            print_error(error, json_output=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print_error(HicacheError("aborted."), json_output=True)
            sys.exit(1)
        # Without standalone mode a command's typer.Exit(code) comes back as its return value.
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="hicache",
    cls=_RootGroup,
    help="Make every step between SGLang HiCache and its Mooncake L3 tier visible and testable.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(inspect.app, name="inspect")
app.add_typer(bench.app, name="bench")
app.command("serve", cls=HicacheCommand, epilog=serve.EXAMPLES)(serve.serve)
app.add_typer(trace.app, name="trace")
app.command("tap", cls=HicacheCommand, epilog=tap_command.EXAMPLES)(tap_command.tap)
app.command("warm", cls=HicacheCommand, epilog=warm.EXAMPLES)(warm.warm)
app.command("prefetch", cls=HicacheCommand, epilog=prefetch.EXAMPLES)(prefetch.prefetch)
app.add_typer(playbook.app, name="playbook")
app.add_typer(te_command.app, name="te")
app.add_typer(lab.app, name="lab")
app.add_typer(upgrade.app, name="upgrade")


def run() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug: one line, the traceback only on request
        if os.environ.get(DEBUG_ENV):
            raise
        hint = f"set {DEBUG_ENV}=1 for the traceback and report it."
        if _json_requested(sys.argv[1:]):
            print_error(HicacheError(f"internal error: {type(exc).__name__}: {exc}", hint=hint), json_output=True)
        else:
            stderr.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc}\n[dim]hint:[/] {hint}")
        sys.exit(1)
