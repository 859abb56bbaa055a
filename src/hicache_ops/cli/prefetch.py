"""`hicache prefetch`: pull prompts from L3 into a serve instance's host pool, with per-policy verdicts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    AllOption,
    CacheSaltOption,
    ExtraKeyOption,
    JsonOption,
    PoolOption,
    PoolPresetOption,
    ServeOption,
    TimeoutOption,
    TokenizerOption,
)
from hicache_ops.cli.common.output import emit, first_rows, print_left_out, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import SglangCompareUrlOption, warn_serve_disagreements

if TYPE_CHECKING:
    from hicache_ops.commands.prefetch import PrefetchResult

EXAMPLES = examples(
    "hicache prefetch prompts.jsonl --serve http://127.0.0.1:18080",
    "hicache prefetch prompts.jsonl --extra-key tenant-a --json",
)


def _render(data: PrefetchResult, show_all: bool = False) -> None:
    rows = data.prompts
    unverified = [r for r in rows if not r.verified]
    stdout.print(f"prefetch through {data.serve} (stop policy {data.stop_policy})")
    if data.interrupted:  # the verdict covers only what ran before the stop
        stdout.print(
            f"[bold yellow]interrupted[/] ({data.interrupted}): {len(rows)} prompt(s) prefetched before the "
            f"stop, {len(rows) - len(unverified)} of them verified; the rest were not reached.",
            soft_wrap=False,
        )
    elif unverified:
        stdout.print(
            f"[bold red]not verified:[/] {len(unverified)} of {len(rows)} prompt(s): a page's bytes differ, or "
            "the stop policy cut the prefetch to nothing (see the note).",
            soft_wrap=False,
        )
    else:
        stdout.print(f"[bold green]verified:[/] every page fetched for {len(rows)} prompt(s) holds the bytes written.")
    cut = sum(1 for r in rows if (data.stop_policy in r.policies and r.policies[data.stop_policy].cut))
    stdout.print(
        f"{sum(r.fetched_pages for r in rows)} of {sum(r.hit_pages for r in rows)} hit pages fetched, "
        f"{sum(r.bytes for r in rows):,} bytes in {sum(r.seconds for r in rows) * 1e3:.1f} ms; "
        f"{cut} prompt(s) cut by {data.stop_policy}",
        soft_wrap=False,
    )
    # Problem rows first; the primary table fits 100 columns, timings and policies are the --all detail view.
    ordered = unverified + [r for r in rows if r.verified]
    shown, left_out = first_rows(ordered, show_all)
    if not shown:
        return
    table = Table()
    table.add_column("prompt", overflow="fold")
    for col in ("tokens", "local", "hit pages", "fetched"):
        table.add_column(col, justify="right")
    table.add_column("verified", no_wrap=True)
    table.add_column("note", overflow="fold")
    for r in shown:
        table.add_row(
            r.source,
            str(r.tokens),
            str(r.local_tokens),
            str(r.hit_pages),
            str(r.fetched_pages),
            "yes" if r.verified else "[bold red]NO[/]",
            r.reason,
        )
    stdout.print(table)
    print_left_out(left_out, "prompts")
    if not show_all:
        stdout.print("[dim]per-prompt bytes, timings and stop-policy cuts: use --all or --json[/]")
        return
    detail = Table(title="timings and stop policies")
    detail.add_column("prompt", overflow="fold")
    for col in ("bytes", "ms", "timeout budget s"):
        detail.add_column(col, justify="right", no_wrap=True)
    detail.add_column("cut by", overflow="fold")
    for r in shown:
        cut_by = ", ".join(p for p, v in r.policies.items() if v.cut) or "-"
        detail.add_row(r.source, f"{r.bytes:,}", f"{r.seconds * 1e3:.1f}", f"{r.budget_s:.3f}", cut_by)
    stdout.print(detail)


def prefetch(
    prompts: Annotated[
        str, typer.Argument(help="JSONL with input_ids (or text with --tokenizer); - for stdin.", metavar="PROMPTS")
    ],
    tokenizer: TokenizerOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    serve: ServeOption = "http://127.0.0.1:18080",
    sglang_url: SglangCompareUrlOption = None,
    pool: PoolOption = None,
    pool_preset: PoolPresetOption = None,
    timeout: TimeoutOption = 3.0,
    show_all: AllOption = False,
    json_output: JsonOption = False,
) -> None:
    """Ask a serve instance to prefetch each prompt from L3 into its host pool; Ctrl-C stops with what was done."""
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.prefetch import prefetch_prompts
        from hicache_ops.server.client import ServeClient
        from hicache_ops.tokens import Tokenizer, read_prompts

        items = read_prompts(prompts, Tokenizer(tokenizer) if tokenizer else None)
        if sglang_url is not None:
            from hicache_ops.sglang.server_info import read_server, serve_disagreements

            server = read_server(sglang_url, timeout=timeout)
        from hicache_ops.cli.warm import ProgressBar

        bar = ProgressBar(
            len(items), json_output, "prefetch", pages_of=lambda r: r.fetched_pages, bytes_of=lambda r: r.bytes
        )
        with interrupt.stop_on_signals(), ServeClient.open(serve, timeout_s=timeout) as client, bar as advance:
            report = prefetch_prompts(
                items,
                client,
                extra_key=extra_key,
                cache_salt=cache_salt,
                pool_texts=pool or (),
                pool_preset=pool_preset,
                on_progress=advance,
            )
        rows = report.rows
        disagreements = None
        if sglang_url is not None:
            disagreements = serve_disagreements(report.config, server)
            warn_serve_disagreements(disagreements)
        data = report.result(serve, disagreements)
        emit(data, json_output, lambda d: _render(d, show_all))
        if report.interrupted:
            stderr.print(
                f"[bold yellow]interrupted[/] ({report.interrupted}) after {len(rows)} of {len(items)} prompt(s)."
            )
            raise typer.Exit(interrupt.EXIT_CODE)
        if any(not r.verified for r in rows):
            raise typer.Exit(1)
