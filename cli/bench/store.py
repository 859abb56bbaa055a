"""`hicache bench store`: our store client's batch put/get beside raw Mooncake, in one run."""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_ops.errors import InputError

from ..help import examples
from ..options import JsonOption, RepeatsOption
from ..output import emit, native_stderr_to_file, reporting, stdout

EXAMPLES = examples(
    "hicache bench store",
    "hicache bench store --case 64x4M --repeats 11 --json",
)


def _size(text: str) -> tuple[int, int]:
    """COUNTxBYTES with an optional K/M suffix on BYTES (KiB, MiB): 256x256K, 64x4M."""
    count_text, sep, size_text = text.lower().partition("x")
    mult = {"k": 1024, "m": 1024**2}.get(size_text[-1:], 1)
    if mult > 1:
        size_text = size_text[:-1]
    if not sep or not count_text.isdigit() or not size_text.isdigit():
        raise InputError(f"--case {text!r} is not COUNTxBYTES.", hint="Write it like 256x256K or 64x4M.")
    return int(count_text), int(size_text) * mult


def _render(data: dict) -> None:
    stdout.print(
        f"store client vs raw Mooncake, same process, median of {data['rounds']} interleaved rounds",
    )
    for case in data["cases"]:
        size = case["object_bytes"]
        label = f"{case['objects']} x {size // 1024**2} MiB" if size % 1024**2 == 0 else f"{case['objects']} x {size // 1024} KiB"
        stdout.print(
            f"  {label:<16} put  ours {case['put_ours_gbps']:6.2f} GB/s  raw {case['put_raw_gbps']:6.2f} GB/s  "
            f"ratio {case['put_ratio']:.3f}",
        )
        stdout.print(
            f"  {'':<16} get  ours {case['get_ours_gbps']:6.2f} GB/s  raw {case['get_raw_gbps']:6.2f} GB/s  "
            f"ratio {case['get_ratio']:.3f}",
        )
    verdict = "meets" if data["meets_goal"] else "misses"
    stdout.print(f"  lowest ratio {data['min_ratio']:.3f} ({verdict} the goal {data['goal']})")


def store(
    case: Annotated[
        list[str] | None,
        typer.Option("--case", help="COUNTxBYTES per batch, repeatable [default: 256x256K and 64x4M].",
                     metavar="COUNTxBYTES", show_default=False),
    ] = None,
    repeats: RepeatsOption = 21,
    json_output: JsonOption = False,
) -> None:
    """Our store client's batch put/get against raw batch_put_from / batch_get_into, in one process.

    The median of --repeats counts; the run starts a loopback master of its own.
    """
    with reporting(json_output):
        from hicache_ops.bench.store import DEFAULT_CASES, bench_store

        cases = [_size(c) for c in case] if case else list(DEFAULT_CASES)
        with native_stderr_to_file(None, "bench_store_mooncake.log"):
            data = bench_store(cases, rounds=repeats)
        emit(data, json_output, _render)
