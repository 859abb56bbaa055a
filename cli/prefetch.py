"""`hicache prefetch`: pull prompts from L3 into a serve instance's host pool, with per-policy verdicts."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .help import examples
from .options import CacheSaltOption, ExtraKeyOption, JsonOption, ServeOption, TimeoutOption, TokenizerOption
from .output import emit, reporting, stderr, stdout
from .sglang_url import SglangCompareUrlOption, warn_serve_disagreements

EXAMPLES = examples(
    "hicache prefetch prompts.jsonl --serve http://127.0.0.1:18080",
    "hicache prefetch prompts.jsonl --extra-key tenant-a --json",
)


def _render(data: dict) -> None:
    table = Table(title=f"prefetch through {data['serve']}")
    for col in ("prompt", "tokens", "local", "hit pages", "fetched", "bytes", "ms", "timeout budget s", "cut by", "verified", "note"):
        table.add_column(col)
    for r in data["prompts"]:
        cut = ", ".join(p for p, v in r["policies"].items() if v["cut"]) or "-"
        table.add_row(r["source"], str(r["tokens"]), str(r["local_tokens"]), str(r["hit_pages"]), str(r["fetched_pages"]),
                      f"{r['bytes']:,}", f"{r['seconds'] * 1e3:.1f}", f"{r['budget_s']:.3f}", cut,
                      "yes" if r["verified"] else "[bold red]NO[/]", r["reason"])
    stdout.print(table)


def prefetch(
    prompts: Annotated[
        str, typer.Argument(help="JSONL with input_ids (or text with --tokenizer); - for stdin.", metavar="PROMPTS")
    ],
    tokenizer: TokenizerOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    serve: ServeOption = "http://127.0.0.1:18080",
    sglang_url: SglangCompareUrlOption = None,
    timeout: TimeoutOption = 3.0,
    json_output: JsonOption = False,
) -> None:
    """Ask a serve instance to prefetch each prompt from L3 into its host pool; Ctrl-C stops with what was done."""
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.prefetch import prefetch_prompts
        from hicache_ops.server.client import ServeClient
        from hicache_ops.tokens import Tokenizer, read_prompts

        items = read_prompts(prompts, Tokenizer(tokenizer) if tokenizer else None)
        if sglang_url is not None:
            from hicache_ops.sglang.server_info import read_server, serve_disagreements

            server = read_server(sglang_url, timeout=timeout)
        with interrupt.stop_on_signals(), ServeClient.open(serve, timeout_s=timeout) as client:
            report = prefetch_prompts(items, client, extra_key=extra_key, cache_salt=cache_salt)
        rows = report.rows
        data = {"serve": serve, "stop_policy": report.config["stop_policy"], "interrupted": report.interrupted,
                "prompts": [r.to_json() for r in rows]}
        if sglang_url is not None:
            data["server_disagreements"] = serve_disagreements(report.config, server)
            warn_serve_disagreements(data["server_disagreements"])
        emit(data, json_output, _render)
        if report.interrupted:
            stderr.print(f"[bold yellow]interrupted[/] ({report.interrupted}) after {len(rows)} of {len(items)} prompt(s).")
            raise typer.Exit(interrupt.EXIT_CODE)
        if any(not r.verified for r in rows):
            raise typer.Exit(1)
