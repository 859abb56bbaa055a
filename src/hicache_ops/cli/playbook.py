"""`hicache playbook list | show | run`: on-call runbooks whose checks run `hicache` commands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markdown import Markdown
from rich.markup import escape

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.common.options import (
    INPUT,
    JsonOption,
    MasterOption,
    MooncakeConfigOption,
    OptionalServeOption,
    ServerArgsOption,
    TimeoutOption,
    TryCacheSaltOption,
    TryExtraKeyOption,
)
from hicache_ops.cli.common.output import emit, print_wrapped, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import sglang_url_option

if TYPE_CHECKING:
    from hicache_ops.commands.playbook import PlaybookRun

app = typer.Typer(
    cls=HicacheGroup,
    help="On-call playbooks: a symptom, ordered checks, and the diagnosis at the first finding.",
    no_args_is_help=True,
    epilog=examples("hicache playbook list", "hicache playbook show no-l3-hit"),
)


def evidence_text(value: object) -> str:
    """Evidence as a person reads it, not as Python prints it: a mapping as `key value` pairs (empty
    values left out), a list of several items one per line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        pairs = [f"{k} {_inline(v)}" for k, v in value.items() if v not in (None, "", [], {})]
        return ", ".join(pairs) or "none"
    if isinstance(value, list):
        if len(value) == 1:
            return evidence_text(value[0])
        return "".join(f"\n  - {evidence_text(item)}" for item in value) or "none"
    return str(value)


def _inline(value: object) -> str:
    """A value inside a mapping: nested lists and mappings stay on the line."""
    if isinstance(value, list):
        return "; ".join(_inline(v) for v in value)
    if isinstance(value, dict):
        return f"({evidence_text(value)})"
    return evidence_text(value)


_MARK = {
    "finding": "[bold red]FINDING[/]",
    "clear": "[green]clear[/]",
    "skipped": "[yellow]skipped[/]",
    "error": "[red]error[/]",
}


@app.command("list", cls=HicacheCommand, epilog=examples("hicache playbook list", "hicache playbook list --json"))
def list_(json_output: JsonOption = False) -> None:
    """The playbooks and their symptoms."""
    with reporting(json_output):
        from hicache_ops.commands.playbook import list_playbooks, summary

        def render(rows: list) -> None:
            for row in rows:
                print_wrapped(f"[bold]{row.name}[/]  {row.title} ({row.checks} checks)", hang=2)
                print_wrapped(row.symptom, 4)

        emit([summary(p) for p in list_playbooks()], json_output, render)


@app.command(
    "show",
    cls=HicacheCommand,
    epilog=examples("hicache playbook show no-l3-hit", "hicache playbook show te-not-reused --json"),
)
def show(
    name: Annotated[str, typer.Argument(help="Playbook name (see `hicache playbook list`).", metavar="NAME")],
    json_output: JsonOption = False,
) -> None:
    """Print a playbook: its symptom, its checks and the commands they run."""
    with reporting(json_output):
        from hicache_ops.commands.playbook import load_playbook, show_result

        # Wrapped at the terminal width, never cut: a run line or a diagnosis must stay whole.
        emit(
            show_result(load_playbook(name)), json_output, lambda d: stdout.print(Markdown(d.markdown), soft_wrap=False)
        )


def _render_run(run: PlaybookRun) -> None:
    """The answer first (the diagnosis, or that every check is clear), its evidence and fix, then the checks."""
    finding = run.finding
    if run.interrupted:
        print_wrapped(f"[yellow]interrupted ({run.interrupted}) after {len(run.checks)} check(s); no diagnosis.[/]")
    elif finding is None:
        verdict = "every check is clear" if run.status == "pass" else "no finding, but some checks could not run"
        print_wrapped(f"[bold green]{verdict}.[/]" if run.status == "pass" else f"[yellow]{verdict}.[/]")
    else:
        print_wrapped(f"[bold red]diagnosis:[/] {finding.diagnosis}")
        for path, value in finding.evidence.items():
            print_wrapped(f"[bold]evidence[/] {escape(path)}: {escape(evidence_text(value))}")
        print_wrapped(f"[bold green]fix:[/] {finding.fix}")
    print_wrapped(f"[bold]{run.title}[/]")
    for outcome in run.checks:
        note = f"  [dim]{outcome.note}[/]" if outcome.note else ""
        print_wrapped(f"{_MARK[outcome.status]}  {outcome.title}{note}", 2)
    if finding is not None:
        print_wrapped(f"[dim]reproduce: {finding.command}[/]", console=stderr)


RUN_EXAMPLES = examples(
    "hicache playbook run no-l3-hit --serve http://127.0.0.1:18080 --prompt prompt.jsonl",
    "hicache playbook run te-not-reused --server-args @launch-flags.txt --config mooncake.json",
)


@app.command("run", cls=HicacheCommand, epilog=RUN_EXAMPLES)
@sglang_url_option("server_args")
def run(
    name: Annotated[str, typer.Argument(help="Playbook name (see `hicache playbook list`).", metavar="NAME")],
    serve: OptionalServeOption = None,
    master: MasterOption = None,
    prompt: Annotated[
        str | None,
        typer.Option(
            "--prompt",
            help="A file holding the prompt: a JSON array of token ids or one JSONL line.",
            metavar="FILE",
            show_default=False,
            rich_help_panel=INPUT,
        ),
    ] = None,
    try_extra_key: TryExtraKeyOption = None,
    try_cache_salt: TryCacheSaltOption = None,
    server_args: ServerArgsOption = None,
    config: MooncakeConfigOption = None,
    timeout: TimeoutOption = 3.0,
    json_output: JsonOption = False,
) -> None:
    """Run a playbook's checks in order and stop at the first finding (exit 1 on a finding).

    Checks only observe. --master defaults to the serve's master; --server-args and --config feed
    the te checks.
    """
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.playbook import load_playbook, run_playbook, variables_from

        book = load_playbook(name)
        values = variables_from(
            serve, master, config, prompt, server_args, try_extra_key or [], try_cache_salt or [], timeout
        )
        total = len(book.checks)
        numbers = iter(range(1, total + 1))

        def on_check(outcome) -> None:
            # Progress on stderr only: the verdict, then the checks' list, come on stdout at the end.
            progress.update(f"check {next(numbers)}/{total} {outcome.title}: {outcome.status}")

        with interrupt.stop_on_signals(), stderr.status(f"running {total} checks of {book.name}") as progress:
            result = run_playbook(book, values, on_check=on_check)
        emit(result, json_output, _render_run)
        if result.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
        if result.status == "finding":
            raise typer.Exit(1)
        errors = [c.exit for c in result.checks if c.status == "error"]
        if errors:
            # A check that could not run (its service unreachable, its input refused) is not "clear".
            raise typer.Exit(3 if {3, 124} & set(errors) else 2)
