"""`hicache bench store`: our store client's batch put/get beside raw Mooncake, in one run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import JsonOption, QuietOption, RepeatsOption
from hicache_ops.cli.common.output import emit, native_stderr_to_file, reporting, stderr, stdout
from hicache_ops.errors import InputError

if TYPE_CHECKING:
    from hicache_ops.commands.bench.store_throughput import StoreBenchResult

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


def _label(objects: int, size: int) -> str:
    return f"{objects} x {size // 1024**2} MiB" if size % 1024**2 == 0 else f"{objects} x {size // 1024} KiB"


def _render(data: StoreBenchResult) -> None:
    if data.interrupted:  # the verdict first: what the figures below cover
        measured = ", ".join(_label(c.objects, c.object_bytes) for c in data.cases)
        stdout.print(f"[bold yellow]interrupted after {measured}:[/] the figures cover the rounds finished")
    rounds = (
        f"the interleaved rounds finished of {data.rounds}" if data.interrupted else f"{data.rounds} interleaved rounds"
    )
    stdout.print(f"store client vs raw Mooncake, same process, median of {rounds}")
    for case in data.cases:
        label = _label(case.objects, case.object_bytes)
        for phase, first in (("put", label), ("get", "")):
            if getattr(case, f"{phase}_ratio") is None:
                stdout.print(f"  {first:<16} {phase}  not measured (interrupted)")
                continue
            done = case.rounds if phase == "put" else case.get_rounds
            partial = f"  ({done} rounds)" if done != data.rounds else ""
            ours, raw, ratio = (getattr(case, f"{phase}_{what}") for what in ("ours_gbps", "raw_gbps", "ratio"))
            stdout.print(
                f"  {first:<16} {phase}  ours {ours:6.2f} GB/s  raw {raw:6.2f} GB/s  ratio {ratio:.3f}{partial}",
            )
    verdict = "meets" if data.meets_goal else "misses"
    stdout.print(f"  lowest ratio {data.min_ratio:.3f} ({verdict} the goal {data.goal})")


class _Progress:
    """Rounds done on stderr: each phase's first and last round, and at most one line a second between."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, number: int, cases: int, objects: int, phase: str, done: int, rounds: int) -> None:
        now = time.monotonic()
        if done not in (1, rounds) and now - self.last < 1.0:
            return
        self.last = now
        stderr.print(f"case {number}/{cases} ({objects} objects): {phase} round {done}/{rounds}")


def store(
    case: Annotated[
        list[str] | None,
        typer.Option(
            "--case",
            help="COUNTxBYTES per batch, repeatable [default: 256x256K and 64x4M].",
            metavar="COUNTxBYTES",
            show_default=False,
        ),
    ] = None,
    repeats: RepeatsOption = 21,
    quiet: QuietOption = False,
    json_output: JsonOption = False,
) -> None:
    """Our store client's batch put/get against raw batch_put_from / batch_get_into, in one process.

    The median of --repeats counts; the run starts a loopback master of its own. Ctrl-C stops
    between rounds and reports the rounds finished (exit 130).
    """
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.bench.store_throughput import DEFAULT_CASES, bench_store

        cases = [_size(c) for c in case] if case else list(DEFAULT_CASES)
        with interrupt.stop_on_signals(), native_stderr_to_file(None, "bench_store_mooncake.log"):
            data = bench_store(cases, rounds=repeats, progress=None if quiet else _Progress())
        emit(data, json_output, _render)
        if data.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
