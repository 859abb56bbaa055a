"""`hicache playbook list | show | run`: on-call runbooks whose checks run `hicache` commands."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markdown import Markdown

from .options import JsonOption
from .output import emit, reporting, stderr, stdout

app = typer.Typer(help="On-call playbooks: a symptom, ordered checks, and the diagnosis at the first finding.", no_args_is_help=True)

_MARK = {"finding": "[bold red]FINDING[/]", "clear": "[green]clear[/]", "skipped": "[yellow]skipped[/]", "error": "[red]error[/]"}


@app.command("list")
def list_(json_output: JsonOption = False) -> None:
    """The playbooks and their symptoms."""
    with reporting(json_output):
        from hicache_ops.playbook import list_playbooks

        data = [{"name": p.name, "title": p.title, "symptom": p.symptom, "checks": len(p.checks)} for p in list_playbooks()]

        def render(rows: list) -> None:
            for row in rows:
                stdout.print(f"[bold]{row['name']}[/]  {row['title']} ({row['checks']} checks)", highlight=False)
                stdout.print(f"    {row['symptom']}", highlight=False)

        emit(data, json_output, render)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="Playbook name (see `hicache playbook list`).")], json_output: JsonOption = False) -> None:
    """Print a playbook: its symptom, its checks and the commands they run."""
    with reporting(json_output):
        from hicache_ops.playbook import load_playbook

        book = load_playbook(name)
        data = {"name": book.name, "title": book.title, "symptom": book.symptom, "markdown": book.text,
                "checks": [c.__dict__ for c in book.checks]}
        emit(data, json_output, lambda d: stdout.print(Markdown(d["markdown"])))


@app.command("run")
def run(
    name: Annotated[str, typer.Argument(help="Playbook name (see `hicache playbook list`).")],
    serve: Annotated[str | None, typer.Option("--serve", help="The hicache serve instance to examine (URL).", show_default=False)] = None,
    master: Annotated[
        str | None, typer.Option("--master", help="Mooncake master HOST:METRICS_PORT (default: the serve's).", show_default=False)
    ] = None,
    config: Annotated[str | None, typer.Option("--config", help="The deployment's Mooncake config file.", show_default=False)] = None,
    prompt: Annotated[
        str | None, typer.Option("--prompt", help="The prompt: a JSON array of token ids or one JSONL line.", show_default=False)
    ] = None,
    server_args: Annotated[
        str | None, typer.Option("--server-args", help="SGLang launch flags (a string or @FILE), for te checks.", show_default=False)
    ] = None,
    try_extra_key: Annotated[
        list[str] | None, typer.Option("--try-extra-key", help="Another extra_key to look for (repeatable).", show_default=False)
    ] = None,
    try_cache_salt: Annotated[
        list[str] | None, typer.Option("--try-cache-salt", help="Another cache_salt to look for (repeatable).", show_default=False)
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each answer of the serve.")] = 3.0,
    json_output: JsonOption = False,
) -> None:
    """Run a playbook's checks in order and stop at the first finding (exit 1 on a finding). Checks only observe."""
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.playbook import load_playbook, run_playbook, variables_from

        book = load_playbook(name)
        values = variables_from(serve, master, config, prompt, server_args, try_extra_key or [], try_cache_salt or [], timeout)
        if not json_output:
            stdout.print(f"[bold]{book.title}[/]\n[dim]{book.symptom}[/]", highlight=False)

        def on_check(outcome) -> None:
            if not json_output:
                note = f"  [dim]{outcome.note}[/]" if outcome.note else ""
                stdout.print(f"  {_MARK[outcome.status]}  {outcome.title}{note}", highlight=False)

        with interrupt.stop_on_signals():
            result = run_playbook(book, values, on_check=on_check)
        data = result.to_json()

        def render(d: dict) -> None:
            finding = d["finding"]
            if d["interrupted"]:
                stdout.print(f"\n[yellow]interrupted ({d['interrupted']}) after {len(d['checks'])} check(s); no diagnosis.[/]", highlight=False)
                return
            if finding is None:
                verdict = "every check is clear" if d["status"] == "pass" else "no finding, but some checks could not run"
                stdout.print(f"\n[bold green]{verdict}.[/]" if d["status"] == "pass" else f"\n[yellow]{verdict}.[/]", highlight=False)
                return
            stdout.print(f"\n[bold red]diagnosis:[/] {finding['diagnosis']}", highlight=False)
            for path, value in finding["evidence"].items():
                stdout.print(f"[bold]evidence[/] {path}: {value}", highlight=False)
            stdout.print(f"[bold green]fix:[/] {finding['fix']}", highlight=False)
            stderr.print(f"[dim]reproduce: {finding['command']}[/]", highlight=False)

        if json_output:
            emit(data, True, render)
        else:
            render(data)
        if result.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
        if result.status == "finding":
            raise typer.Exit(1)
        errors = [c.exit for c in result.checks if c.status == "error"]
        if errors:
            # A check that could not run (its service unreachable, its input refused) is not "clear".
            raise typer.Exit(3 if {3, 124} & set(errors) else 2)
