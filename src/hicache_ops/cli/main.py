"""The root `hicache` app: composes the command groups and formats every failure."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from hicache_ops.cli import bench, inspect, lab, playbook, prefetch, serve, trace, upgrade, warm
from hicache_ops.cli import explain as explain_command
from hicache_ops.cli import tap as tap_command
from hicache_ops.cli import te as te_command
from hicache_ops.cli import watch as watch_command
from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.common.output import ARGV, DEBUG_ENV, print_error, print_json, stderr
from hicache_ops.errors import HicacheError, InputError


def _json_requested(argv: list[str]) -> bool:
    return "--json" in argv


class _RootGroup(HicacheGroup):
    """With --json on the command line, Typer's own parse errors (unknown option, bad value,
    missing argument) are the JSON error object on stdout too, so a script reading stdout always
    gets JSON; without it, Typer's usual usage message."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv_token = ARGV.set(tuple(str(a) for a in (sys.argv[1:] if args is None else args)))
        try:
            return self._main(
                args,
                prog_name,
                complete_var=complete_var,
                standalone_mode=standalone_mode,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        finally:
            ARGV.reset(argv_token)

    def _main(
        self,
        args: Sequence[str] | None,
        prog_name: str | None,
        *,
        standalone_mode: bool,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if argv and set(argv) <= {"--version", "-V", "--json"} and set(argv) != {"--json"}:
            # `hicache --version --json`: the root takes no --json of its own, so answer here.
            from hicache_ops.commands.version import version_facts

            facts = version_facts()
            if "--json" in argv:
                from hicache_ops.commands.version_result import VersionResult

                print_json(VersionResult.of(facts))
            else:
                sys.stdout.write(facts.text() + "\n")
            sys.exit(0)
        if not _json_requested(argv):
            return super().main(args=argv, prog_name=prog_name, standalone_mode=standalone_mode, **extra)
        try:
            code = super().main(args=argv, prog_name=prog_name, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # Typer's bundled Click usage errors derive from it
            ctx = getattr(exc, "ctx", None)
            hint = f"See `{ctx.command_path} --help`." if ctx is not None else "See `hicache --help`."
            error: HicacheError = InputError(exc.format_message(), hint=hint)
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
    epilog=examples(
        "hicache inspect keys --tokens 1,2,3,4 --page-size 2",
        "hicache serve",
        "hicache playbook list",
    ),
    # Typer's --install-completion / --show-completion for bash, zsh, fish and PowerShell.
    add_completion=True,
    pretty_exceptions_enable=False,
    # -h everywhere: subcommands inherit the root context's help option names.
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from hicache_ops.commands.version import version_facts

        sys.stdout.write(version_facts().text() + "\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Show hicache-ops' version, the SGLang releases it knows and the Mooncake release, then exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Make every step between SGLang HiCache and its Mooncake L3 tier visible and testable."""


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
app.command("watch", cls=HicacheCommand, epilog=watch_command.EXAMPLES)(watch_command.watch)
app.add_typer(upgrade.app, name="upgrade")
app.command("explain", cls=HicacheCommand, epilog=explain_command.EXAMPLES)(explain_command.explain)


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
