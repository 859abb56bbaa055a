"""`hicache bench replay`: a request trace through the tiered cache, hit rate per tier against the
unbounded ceiling and a published-style block LRU; `--sweep` one tier's capacity."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    HicacheRatioOption,
    JsonOption,
    PageSizeOption,
    PlotOption,
    PresetOption,
    QuietOption,
    SglangVersionOption,
    WritePolicy,
    WritePolicyOption,
    check_plot_path,
    value_of,
)
from hicache_ops.cli.common.output import emit, json_data, print_wrapped, reporting, stderr, stdout
from hicache_ops.errors import InputError
from hicache_ops.units import format_bytes

# The default write policy, a member of the option's choices.
WRITE_THROUGH = WritePolicy("write_through")

EXAMPLES = examples(
    "hicache bench replay trace.jsonl --l1-tokens 3000000 --l2-tokens 0 --l3 none",
    "hicache bench replay trace.jsonl --l2-tokens 0 --l3 none --sweep l1 375000:24000000:7 --plot l1-sweep.png",
    "hicache bench replay trace.jsonl --format tokens --page-size 16 --limit 1000 --json",
)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _tokens(n: int | None) -> str:
    if n is None:
        return "unbounded"
    if n >= 10**6:
        return f"{n / 1e6:.2f}M"
    if n >= 10**4:
        return f"{n / 1e3:.0f}K"
    return f"{n:,}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n, "binary")


def _bytes_cell(n: int | None) -> str:
    """Bytes to three significant digits, so the tier table fits 80 columns (--json has them exact)."""
    text = _bytes(n)
    number, _, unit = text.partition(" ")
    if unit in ("", "B"):
        return text
    value = float(number)
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {unit}"


def _render(data: dict[str, Any], stopped_by: str | None = None) -> None:
    from rich.table import Table

    if data["interrupted"]:  # the verdict first: what the figures below cover
        stopped_by = {"SIGINT": "Ctrl-C (SIGINT)", None: "the stop request"}.get(stopped_by, stopped_by)
        stdout.print(f"[bold yellow]interrupted:[/] the figures cover the requests replayed before {stopped_by}")

    t, cfg = data["trace"], data["config"]
    print_wrapped(
        f"{t['requests_replayed']:,} of {t['requests']:,} requests ({t['format']} format, {t['span_s']:.0f} s of "
        f"traffic), {t['prompt_tokens']:,} prompt tokens; page {cfg['page_size']}, {cfg['write_policy']}, "
        f"SGLang {cfg['sglang_version']}, bytes for {cfg['preset']} ({cfg['bytes_per_token']:,} B/token), "
        f"{cfg['mode']} mode",
    )
    if cfg.get("l3_eviction"):
        stdout.print(f"bounded L3 evicts as the {cfg['l3_eviction']}")
    if data.get("points"):
        _render_sweep(data)
    else:
        table = Table(
            title="hit rate per tier (cached / prompt tokens)", title_justify="left", show_edge=False, pad_edge=False
        )
        for name in ("tier", "tokens", "bytes", "cached", "hit", "evicted", "in", "out"):
            table.add_column(name, justify="left" if name == "tier" else "right", no_wrap=True)
        for tier, label in (("l1", "L1"), ("l2", "L2"), ("l3", "L3")):
            row = data["tiers"][tier]
            if row["capacity_tokens"] == 0:
                table.add_row(label, "none", "", "", "", "", "", "", style="dim")
                continue
            table.add_row(
                label,
                _tokens(row["capacity_tokens"]),
                _bytes_cell(row["capacity_bytes"]),
                _tokens(row["cached_tokens"]),
                _percent(row["hit_rate"]),
                f"{row['evictions']:,}",
                _bytes_cell(row["bytes_written"]),
                _bytes_cell(row["bytes_read"]),
            )
        stdout.print(table)
        print_wrapped(
            "L1 device, L2 host, L3 Mooncake; cached = prompt tokens the tier served, hit = cached / prompt tokens, "
            "evicted in pages, in/out = KV bytes moved into / out of the tier",
        )
    b = data["baseline"]
    ceiling = data["ceiling_hit_rate"]
    if not data.get("points"):
        print_wrapped(
            f"hit rate {_percent(data['hit_rate']).strip()} of prompt tokens = "
            f"{_percent(data['hit_rate_of_ceiling']).strip()} of the unbounded ceiling {_percent(ceiling).strip()} "
            "(SGLang pages, same requests)",
        )
        print_wrapped(
            f"prefilled tokens saved {data['prefilled_tokens_saved']:,}, still prefilled {data['prefilled_tokens']:,}",
        )
        capacity = _tokens(b["capacity_tokens"])
        ratio = b["hit_rate"] / b["unbounded_hit_rate"] if b["unbounded_hit_rate"] else 0.0
        print_wrapped(
            f"block LRU (published style) at {capacity} tokens: {_percent(b['hit_rate']).strip()} "
            f"= {100 * ratio:.0f}% of its unbounded {_percent(b['unbounded_hit_rate']).strip()}",
        )
    print_wrapped(
        f"time: {data['wall_s']:.1f} s ({data['replay_s']:.1f} s in the engine, {data['reference_s']:.1f} s for the "
        "ceiling and the block LRU)",
    )
    if data.get("plot"):
        stdout.print(f"plot: {data['plot']}")


def _render_sweep(data: dict[str, Any]) -> None:
    from rich.table import Table

    points = data["points"]
    tiers = [t for t in ("l1", "l2", "l3") if points[-1]["tiers"][t]["capacity_tokens"] != 0]
    table = Table(
        title=f"hit rate against {data['sweep'].upper()} capacity (cached / prompt tokens)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["capacity", "hit", "/ceiling"]
    if len(tiers) > 1:
        columns += [t.upper() for t in tiers]
    columns += ["LRU", "evicted", "time"]
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for p in points:
        row = [_tokens(p["capacity_tokens"]), _percent(p["hit_rate"]), _percent(p["hit_rate_of_ceiling"])]
        if len(tiers) > 1:
            row += [_percent(p["tiers"][t]["hit_rate"]) for t in tiers]
        row += [
            _percent(p["baseline_hit_rate"]),
            f"{p['tiers'][data['sweep']]['evictions']:,}",
            f"{p['elapsed_s']:.1f}s",
        ]
        table.add_row(*row)
    stdout.print(table)
    stdout.print(
        f"unbounded: {_percent(data['ceiling_hit_rate']).strip()} with SGLang's pages, "
        f"{_percent(data['baseline']['unbounded_hit_rate']).strip()} with the block LRU (LRU: at the same "
        f"capacity); {data['sweep'].upper()} evictions in pages",
    )


class _Progress:
    """Requests replayed, on stderr: rewritten in place on a terminal, a line every 5 s otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = time.monotonic()

    def __call__(self, done: int, total: int, elapsed: float, run: int, runs: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        finished = done == total
        if self.tty:
            if not finished and now - self.last < 0.2:
                return
        elif finished or now - self.last < 5.0:  # the 5 s run on across a sweep's short runs
            return
        self.last = now
        point = f"capacity {run}/{runs}: " if runs > 1 else ""
        line = f"{point}replayed {done:,}/{total:,} requests ({elapsed:.0f}s)"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if finished else ""))
            sys.stderr.flush()
        else:
            stderr.print(line)


def replay(
    trace: Annotated[
        str, typer.Argument(help="JSONL trace: mooncake lines (hash_ids) or tokens lines (input_ids).", metavar="TRACE")
    ],
    trace_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="mooncake or tokens (default: mooncake when the first line has hash_ids).",
            metavar="FORMAT",
            show_default=False,
        ),
    ] = None,
    l1_tokens: Annotated[int, typer.Option("--l1-tokens", help="Device (L1) pool in tokens.", metavar="N")] = 3_000_000,
    l2_tokens: Annotated[
        int | None,
        typer.Option(
            "--l2-tokens",
            help="Host (L2) pool in tokens, above L1; 0: no L2 (default: --hicache-ratio 2).",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    hicache_ratio: HicacheRatioOption = None,
    l3: Annotated[
        str,
        typer.Option(
            "--l3",
            help="The simulated L3's capacity: none, unbounded, or tokens (evicting as Mooncake's master).",
            metavar="CAPACITY",
        ),
    ] = "unbounded",
    page_size: PageSizeOption = 64,
    write_policy: WritePolicyOption = WRITE_THROUGH,
    preset: PresetOption = "llama-3.1-8b",
    sweep: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--sweep",
            metavar="TIER FROM:TO:STEPS",
            help="One run per capacity of tier l1, l2 or l3: STEPS log-spaced capacities in tokens.",
            show_default=False,
        ),
    ] = None,
    plot: PlotOption = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", help="Replay only the first N requests of the file.", metavar="N", show_default=False),
    ] = None,
    sglang_version: SglangVersionOption = None,
    quiet: QuietOption = False,
    json_output: JsonOption = False,
) -> None:
    """Replay a request trace through L1/L2/L3: hit rate per tier, the unbounded ceiling, a block LRU.

    --plot draws a --sweep: hit rate against the swept tier's capacity.
    """
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.bench.replay import DEFAULT_PRESET, TIERS, ReplaySpec, parse_l3
        from hicache_ops.commands.bench.replay_plot import plot_sweep
        from hicache_ops.commands.bench.replay_report import parse_sweep, run_report
        from hicache_ops.commands.bench.replay_trace import load_trace
        from hicache_ops.sglang.versions import default_version

        tier, sweep_range = sweep if sweep is not None else (None, None)
        if tier is not None and tier not in TIERS:
            raise InputError(f"--sweep tier {tier!r} must be l1, l2 or l3.", hint="e.g. --sweep l1 500000:20000000:8")
        if plot is not None and tier is None:
            raise InputError("--plot draws a sweep: add --sweep TIER FROM:TO:STEPS.")
        check_plot_path(plot)
        if limit is not None and limit < 1:
            raise InputError(f"--limit {limit} must be 1 or more.")
        spec = ReplaySpec(
            page_size=page_size,
            l1_tokens=l1_tokens,
            l2_tokens=l2_tokens,
            hicache_ratio=hicache_ratio,
            l3=parse_l3(l3),
            write_policy=str(value_of(write_policy)),
            sglang_version=value_of(sglang_version) or default_version(),
            preset=preset or DEFAULT_PRESET,
        )
        if tier is None:  # a sweep validates each of its configurations
            spec.validate()
        capacities = parse_sweep(sweep_range, page_size) if tier is not None and sweep_range is not None else None
        loaded = load_trace(trace, trace_format, limit)
        with interrupt.stop_on_signals():
            report = run_report(spec, loaded, sweep_tier=tier, capacities=capacities, progress=_Progress(not quiet))
            stopped_by = interrupt.reason() if interrupt.requested() else None  # cleared when the block ends
        result = report.result()
        if plot is not None:
            result.plot = plot_sweep(json_data(result), plot)
        emit(result, json_output, lambda r: _render(json_data(r), stopped_by))
        if report.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
