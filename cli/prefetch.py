"""`hicache prefetch`: pull prompts from L3 into a serve instance's host pool, with per-policy verdicts."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .options import CacheSaltOption, ExtraKeyOption, JsonOption, TokenizerOption
from .output import emit, reporting, stdout
from .sglang_url import SglangCompareUrlOption, SglangTimeoutOption, warn_serve_disagreements


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
    prompts: Annotated[str, typer.Argument(help="JSONL with input_ids (or text with --tokenizer); - for stdin.")],
    tokenizer: TokenizerOption = None,
    serve: Annotated[str, typer.Option("--serve", help="The hicache serve instance.")] = "http://127.0.0.1:18080",
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    sglang_url: SglangCompareUrlOption = None,
    sglang_timeout: SglangTimeoutOption = 5.0,
    json_output: JsonOption = False,
) -> None:
    """Ask a serve instance to prefetch each prompt from L3 into its host pool."""
    with reporting(json_output):
        from hicache_ops.prefetch import prefetch_prompts
        from hicache_ops.server.client import ServeClient
        from hicache_ops.tokens import Tokenizer, read_prompts

        items = read_prompts(prompts, Tokenizer(tokenizer) if tokenizer else None)
        if sglang_url is not None:
            from hicache_ops.sglang.server_info import read_server, serve_disagreements

            server = read_server(sglang_url, timeout=sglang_timeout)
        with ServeClient(serve, timeout_s=300) as client:
            config, rows = prefetch_prompts(items, client, extra_key=extra_key, cache_salt=cache_salt)
        data = {"serve": serve, "stop_policy": config["stop_policy"], "prompts": [r.to_json() for r in rows]}
        if sglang_url is not None:
            data["server_disagreements"] = serve_disagreements(config, server)
            warn_serve_disagreements(data["server_disagreements"])
        emit(data, json_output, _render)
        if any(not r.verified for r in rows):
            raise typer.Exit(1)
