"""`hicache bench keys`: page-key throughput against SGLang's own get_hash_str."""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_ops.errors import InputError

from ..help import examples
from ..options import JsonOption, PageSizeOption, RepeatsOption
from ..output import emit, reporting, stdout

EXAMPLES = examples(
    "hicache bench keys",
    "hicache bench keys --tokens 1048576 --page-size 16 --json",
)


def _render(data: dict) -> None:
    stdout.print(
        f"{data['tokens']:,} tokens, page size {data['page_size']}, median of {data['repeats']} interleaved runs "
        f"(native loop: {'yes' if data['native'] else 'no'})",
    )
    stdout.print(f"  hicache      {data['ours_tokens_per_s'] / 1e6:8.1f} M tokens/s")
    if data["sglang_tokens_per_s"] is None:
        stdout.print(f"  sglang       not measured: {data['sglang_error']}")
        return
    stdout.print(f"  sglang       {data['sglang_tokens_per_s'] / 1e6:8.1f} M tokens/s")
    stdout.print(f"  ratio        {data['ratio']:8.2f}x  (hicache / sglang)")
    stdout.print("  same keys    yes (checked on every run)")


def keys(
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens to hash per run.", metavar="N")] = 4_194_304,
    page_size: PageSizeOption = 64,
    repeats: RepeatsOption = 5,
    json_output: JsonOption = False,
) -> None:
    """Page-key throughput, ours beside SGLang's get_hash_str, in one run (exit 1 if the keys differ)."""
    with reporting(json_output):
        if tokens < page_size or page_size <= 0 or repeats <= 0:
            raise InputError("--tokens must hold at least one page, and --page-size and --repeats must be > 0.")
        from hicache_ops.bench.keys import bench_page_keys

        result = bench_page_keys(tokens=tokens, page_size=page_size, repeats=repeats)
        emit(result.to_json(), json_output, _render)
