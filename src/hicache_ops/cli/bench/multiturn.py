"""`hicache bench multiturn`: the multi-turn workload (docs/workloads.md) against the embedded tiered
cache, L1 / L1+L2 / L1+L2+L3 side by side, each configuration's hit rate by round beside the ceiling."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    HicacheRatioOption,
    JsonOption,
    L3BandwidthOption,
    OptionalServeOption,
    PageSizeOption,
    PlotOption,
    PresetOption,
    QuietOption,
    SglangVersionOption,
    TimeoutOption,
    WritePolicy,
    WritePolicyOption,
    check_plot_path,
    l3_bandwidth_bytes_s,
    value_of,
)
from hicache_ops.cli.common.output import emit, json_data, reporting, stderr, stdout
from hicache_ops.errors import InputError

# The default write policy, a member of the option's choices.
WRITE_THROUGH = WritePolicy("write_through")

EXAMPLES = examples(
    "hicache bench multiturn --accounting-only --hicache-write-policy write_back --json",
    "hicache bench multiturn --serve http://127.0.0.1:18080 --clients 4 --rounds 5 --new-tokens 256 --concurrency 4",
    "hicache bench multiturn --clients 8 --rounds 12 --new-tokens 1024 --plot hit-rate.png",
)


def _percent(x: float | None) -> str:
    return "    -" if x is None else f"{100 * x:5.1f}%"


def _tokens(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 10**6:
        return f"{n / 1e6:.1f}M"
    if n >= 10**4:
        return f"{n / 1e3:.0f}K"
    return f"{n:,}"


def _over_http(spec, url: str, timeout: float, quiet: bool, json_output: bool) -> None:
    from hicache_ops import interrupt
    from hicache_ops.commands.bench.multiturn_http import run_over_http
    from hicache_ops.sglang.server_info import read_server

    if not timeout > 0:
        raise InputError(f"--timeout {timeout:g} must be positive.")
    page_size = read_server(url, timeout=timeout).logical_page_size

    def progress(r: int, rounds: int) -> None:
        if not quiet:
            stderr.print(f"round {r + 1}/{rounds} done")

    with interrupt.stop_on_signals():
        data = run_over_http(spec, url, page_size=page_size, timeout=timeout, progress=progress)
    emit(data, json_output, lambda r: _render_http(json_data(r)))
    if data.interrupted:
        raise typer.Exit(130)


def _render_http(data: dict) -> None:
    from rich.table import Table

    w = data["workload"]
    stdout.print(
        f"{data['url']}: {w['clients']} clients x {w['rounds']} rounds x ({w['new_tokens']:,} new + "
        f"{w['output_tokens']} output) tokens, concurrency {w['concurrency']}, server page {w['page_size']}"
    )
    table = Table(title="prompt-token hit rate by round (meta_info), beside the ceiling", title_justify="left",
                  show_edge=False, pad_edge=False)  # fmt: skip
    for name in ("round", "ceiling", "paged ceiling", "hit rate", "device", "host", "storage"):
        table.add_column(name, justify="right")
    for e in data["rounds"]:
        table.add_row(str(e["round"]), _percent(e["ceiling"]), _percent(e["ceiling_paged"]), _percent(e["hit_rate"]),
                      f"{e['device_hit']:,}", f"{e['host_hit']:,}", f"{e['storage_hit']:,}")  # fmt: skip
    stdout.print(table)
    stdout.print(
        f"total hit rate {_percent(data['total']['hit_rate'])} of {data['total']['prompt_tokens']:,} prompt tokens"
    )


def _render(data: dict) -> None:
    from rich.table import Table

    w, pools = data["workload"], data["pools"]
    configs = list(data["configurations"])
    labels = {name: data["configurations"][name]["label"] for name in configs}
    if data["interrupted"]:  # the verdict first: what the figures below cover
        from hicache_ops.commands.bench.multiturn_workload import CONFIGS, LABELS

        done = ", ".join(
            f"{LABELS[n]} {data['configurations'][n]['rounds_done']}/{w['rounds']}"
            if n in data["configurations"]
            else f"{LABELS[n]} not run"
            for n in CONFIGS
        )
        stdout.print(f"[bold yellow]interrupted after rounds {done}:[/] the figures cover the rounds finished")
    stdout.print(
        f"{w['clients']} clients x {w['rounds']} rounds x ({w['new_tokens']:,} new + {w['output_tokens']} output) "
        f"tokens, page {w['page_size']}, seed {w['seed']}, {data['mode']} mode",
    )
    stdout.print(
        f"L1 {pools['device_tokens']:,} tokens ({pools['l1_rounds']:.2f} rounds of every history), "
        f"L2 {pools['host_tokens']:,} tokens (ratio {pools['hicache_ratio']:g}, {pools['write_policy']}), "
        "L3 unbounded",
    )
    table = Table(
        title="prompt-token hit rate by round, and prefilled (computed) prompt tokens",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("round", justify="right")
    table.add_column("ceiling", justify="right")
    for name in configs:
        table.add_column(labels[name], justify="right")
    table.add_column("prefilled " + " / ".join(labels[name] for name in configs), justify="right", style="dim")
    cliffs = data["cliffs"]
    for entry in data["rounds"]:
        r = entry["round"]
        cells = [str(r), _percent(entry["ceiling"])]
        for name in configs:
            text = _percent(entry[name])
            if cliffs[name]["leaves_ceiling"] == r and entry[name] is not None:
                text = f"[bold red]{text}[/]"
            cells.append(text)
        cells.append(" / ".join(_tokens(entry["prefilled_tokens"][name]) for name in configs))
        table.add_row(*cells)
    stdout.print(table)
    stdout.print(
        "ceiling = h_max(r) = history / (history + new question); a cache of whole pages reaches the "
        "history floored to pages (the gap of a few tenths in early rounds).",
    )

    prefilled = data["prefilled_tokens"]
    base = prefilled.get("l1")
    totalled = data["rounds_totalled"]
    over = f" (rounds 0-{totalled - 1}, which every configuration finished)" if data["interrupted"] else ""
    stdout.print(f"prompt tokens{over}: {_tokens(data['prompt_tokens'])}; prefilled (computed) tokens:")
    for name in configs:
        ratio = f"  ({base / prefilled[name]:.1f}x fewer than L1)" if base and name != "l1" and prefilled[name] else ""
        stdout.print(f"  {labels[name]:<9} {_tokens(prefilled[name]):>7}{ratio}")
    stdout.print(
        f"  {'ceiling':<9} {_tokens(prefilled['ceiling']):>7}  (the new questions and each history's partial last "
        "page)",
    )
    stdout.print("cliffs (first round below the ceiling; predicted from the pool sizes):")
    for name in configs:
        c = cliffs[name]
        done = data["configurations"][name]["rounds_done"]
        never = "never" if done == w["rounds"] else f"not in its {done} rounds"
        seen = never if c["leaves_ceiling"] is None else f"round {c['leaves_ceiling']}"
        predicted = "none" if c["predicted"] is None else f"round {c['predicted']}"
        zero = f", zero from round {c['zero_from']}" if c["zero_from"] is not None else ""
        stdout.print(f"  {labels[name]:<9} {seen}{zero}  (predicted: {predicted})")
    if data["workload"].get("concurrency"):
        for name in configs:
            conf = data["configurations"][name]
            pf, waves = conf["prefetches"], conf["waves"]
            if conf["l3"]:
                stdout.print(
                    f"{labels[name]} at concurrency {data['workload']['concurrency']}: prefetches issued "
                    f"{pf['issued']:,}, "
                    f"refused by the in-flight limit {pf['rate_limited']:,} ({data['in_flight_rule']}), "
                    f"0.5.23 retries {waves.get('retried', 0):,} ({waves.get('retried_issued', 0):,} went out) "
                    f"and re-queries after a match shrank {waves.get('requeried', 0):,}; "
                    f"most in flight {_tokens(waves.get('max_in_flight_tokens', 0))} tokens",
                )
    times = ", ".join(
        f"{labels[n]} {data['configurations'][n]['elapsed_s']:.1f}s ({data['configurations'][n]['cpu_s']:.1f}s CPU)"
        for n in configs
    )
    stdout.print(f"wall {data['wall_s']:.1f}s over {data['workers']} process(es): {times}")
    if data.get("plot"):
        stdout.print(f"plot: {data['plot']}")


class _Progress:
    """Rounds done per configuration on stderr: rewritten in place on a terminal (5 times a
    second at most), one line every 5 seconds otherwise, and a last line when all are done."""

    def __init__(self, enabled: bool, configs: int = 3):
        self.enabled = enabled
        self.configs = configs
        self.tty = sys.stderr.isatty()
        self.done: dict[str, int] = {}
        self.t0 = self.last = time.monotonic()

    def __call__(self, name: str, r: int, rounds: int) -> None:
        if not self.enabled:
            return
        self.done[name] = r + 1
        now = time.monotonic()
        finished = len(self.done) == self.configs and all(v == rounds for v in self.done.values())
        if not finished and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        from hicache_ops.commands.bench.multiturn_workload import CONFIGS, LABELS

        parts = "  ".join(f"{LABELS[n]} {self.done[n]}/{rounds}" for n in CONFIGS if n in self.done)
        line = f"rounds done: {parts}  ({now - self.t0:.0f}s)"
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if finished else ""))
            sys.stderr.flush()
        else:
            stderr.print(line)


def multiturn(
    clients: Annotated[
        int, typer.Option("--clients", help="Conversations, each with its own history.", metavar="N")
    ] = 48,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Turns per conversation (a barrier between rounds).", metavar="N")
    ] = 60,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="New question tokens per turn.", metavar="N")] = 4096,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Answer tokens per turn.", metavar="N")] = 16,
    page_size: PageSizeOption = 64,
    l1_tokens: Annotated[
        int | None, typer.Option("--l1-tokens", help="Device (L1) pool in tokens.", metavar="N", show_default=False)
    ] = None,
    l1_rounds: Annotated[
        float | None,
        typer.Option(
            "--l1-rounds",
            help="Device (L1) pool as rounds of every client's history (default 18: the L1 cliff where published "
            "runs show it).",
            metavar="ROUNDS",
            show_default=False,
        ),
    ] = None,
    hicache_ratio: HicacheRatioOption = 2.0,
    write_policy: WritePolicyOption = WRITE_THROUGH,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random token ids.", metavar="N")] = 20260626,
    accounting_only: Annotated[
        bool,
        typer.Option(
            "--accounting-only",
            help="Count bytes instead of moving them (same tree, eviction and policies): the published scale.",
        ),
    ] = False,
    preset: PresetOption = "tiny",
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Processes for the three configurations (default: 3 in accounting mode with two CPUs or more, else "
            "1).",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    plot: PlotOption = None,
    sglang_version: SglangVersionOption = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            help="Clients whose requests arrive together (48: a whole round at once, as SGLang's bench_multiturn.py "
            "sends them); SGLang's admission, in-flight prefetch limit and retries then apply. Default: one request "
            "at a time (the published simulation).",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    l3_bandwidth_gbps: L3BandwidthOption = None,
    serve: OptionalServeOption = None,
    timeout: TimeoutOption = 60.0,
    quiet: QuietOption = False,
    json_output: JsonOption = False,
) -> None:
    """Multi-turn hit rate of L1, L1+L2 and L1+L2+L3 side by side, with the ceiling h_max(r).

    --serve URL replays the workload over SGLang's /generate instead (a `hicache serve` or a real SGLang):
    hit rates per round from meta_info beside the ceilings (docs/serve-api.md#clients).
    --plot draws the hit rate of each configuration by round. Ctrl-C stops each configuration after
    its round in progress and reports the rounds finished (exit 130).
    """
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.bench.multiturn import run_multiturn
        from hicache_ops.commands.bench.multiturn_plot import plot_hit_rates
        from hicache_ops.commands.bench.multiturn_workload import MultiturnSpec
        from hicache_ops.sglang.versions import default_version

        if workers is not None and workers < 1:
            raise InputError(f"--workers {workers} must be 1 or more.")
        check_plot_path(plot)
        spec = MultiturnSpec(
            clients=clients,
            rounds=rounds,
            new_tokens=new_tokens,
            output_tokens=output_tokens,
            page_size=page_size,
            l1_tokens=l1_tokens,
            l1_rounds=l1_rounds,
            hicache_ratio=2.0 if hicache_ratio is None else hicache_ratio,
            write_policy=str(value_of(write_policy)),
            seed=seed,
            accounting_only=accounting_only,
            sglang_version=value_of(sglang_version) or default_version(),
            preset=preset or "tiny",
            concurrency=concurrency,
            l3_bandwidth_bytes_s=l3_bandwidth_bytes_s(l3_bandwidth_gbps),
        ).validate()
        if serve is not None:
            if l3_bandwidth_gbps is not None:
                raise InputError(
                    "--l3-bandwidth-gbps models the embedded engine's L3; with --serve the serve's own L3 answers."
                )
            _over_http(spec, serve, timeout, quiet, json_output)
            return
        from hicache_ops.cli.common.output import native_stderr_to_file

        # Each configuration's Mooncake client logs through glog on fd 2: to a log kept only on failure.
        with interrupt.stop_on_signals(), native_stderr_to_file(None, "bench_multiturn_mooncake.log"):
            result = run_multiturn(spec, progress=_Progress(not quiet), workers=workers)
        data = result.result()
        if plot is not None:
            data.plot = plot_hit_rates(result, plot)
        emit(data, json_output, lambda r: _render(json_data(r)))
        if result.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
