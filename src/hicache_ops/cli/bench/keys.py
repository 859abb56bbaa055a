"""`hicache bench keys`: page-key throughput against SGLang's own get_hash_str."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import JsonOption, PageSizeOption, QuietOption, RepeatsOption
from hicache_ops.cli.common.output import emit, reporting, stderr, stdout
from hicache_ops.errors import InputError

if TYPE_CHECKING:
    from hicache_ops.commands.bench.key_throughput import KeyBenchResult

EXAMPLES = examples(
    "hicache bench keys",
    "hicache bench keys --tokens 1048576 --page-size 16 --json",
)


def _render(r: KeyBenchResult) -> None:
    _render_interrupted(r)  # the verdict first: what the medians below cover
    stdout.print(
        f"{r.tokens:,} tokens, page size {r.page_size}, median of {r.repeats} interleaved runs "
        f"(native loop: {'yes' if r.native else 'no'})",
    )
    stdout.print(f"  hicache      {r.ours_tokens_per_s / 1e6:8.1f} M tokens/s")
    if r.sglang_tokens_per_s is None:
        stdout.print(f"  sglang       not measured: {r.sglang_error}")
        return
    stdout.print(f"  sglang       {r.sglang_tokens_per_s / 1e6:8.1f} M tokens/s")
    stdout.print(f"  ratio        {r.ratio:8.2f}x  (hicache / sglang)")
    stdout.print("  same keys    yes (checked on every run)")


def _render_interrupted(r: KeyBenchResult) -> None:
    if r.interrupted:
        stdout.print(
            f"[bold yellow]interrupted after {r.repeats} of {r.repeats_requested} runs:[/] the medians cover those runs"
        )


class _Progress:
    """Runs done on stderr: the first and the last run, and at most one line a second between."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, done: int, total: int, ours_s: float, sglang_s: float | None) -> None:
        now = time.monotonic()
        if done not in (1, total) and now - self.last < 1.0:
            return
        self.last = now
        theirs = "" if sglang_s is None else f", sglang {sglang_s:.3f} s"
        stderr.print(f"run {done}/{total}: hicache {ours_s:.3f} s{theirs}")


def keys(
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens to hash per run.", metavar="N")] = 4_194_304,
    page_size: PageSizeOption = 64,
    repeats: RepeatsOption = 5,
    quiet: QuietOption = False,
    json_output: JsonOption = False,
) -> None:
    """Page-key throughput, ours beside SGLang's get_hash_str, in one run (exit 1 if the keys differ).

    Ctrl-C stops after the run in progress and reports the runs finished (exit 130).
    """
    with reporting(json_output):
        if tokens < page_size or page_size <= 0 or repeats <= 0:
            raise InputError("--tokens must hold at least one page, and --page-size and --repeats must be > 0.")
        from hicache_ops.mooncake.store_client import check_fits_in_memory

        # The ids as int64 twice (numpy and SGLang's array) and the keys of every page, on each side.
        check_fits_in_memory(tokens * 16 + (tokens // page_size) * 2 * 200, f"--tokens {tokens}")
        import logging

        # SGLang builds its hash extension through torch, whose import warns "No CUDA runtime is found"
        # on a CPU machine: noise on stderr for a benchmark that never uses CUDA.
        # SGLang's own extension loader says when it clears another process's stale build lock: noise too.
        for name in ("torch.utils.cpp_extension", "sglang.srt.utils.cpp_extension_loader"):
            logging.getLogger(name).setLevel(logging.ERROR)
        from hicache_ops import interrupt
        from hicache_ops.commands.bench.key_throughput import bench_page_keys

        with interrupt.stop_on_signals():
            result = bench_page_keys(
                tokens=tokens, page_size=page_size, repeats=repeats, progress=None if quiet else _Progress()
            )
        emit(result, json_output, _render)
        if result.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
