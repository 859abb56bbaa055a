"""`hicache watch`: live per-tier figures and verdicts from SGLang's and a Mooncake master's /metrics."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import INPUT, OUTPUT, JsonOption, MasterOption, TimeoutOption
from hicache_ops.cli.common.output import emit, reporting, stdout

EXAMPLES = examples(
    "hicache watch --sglang-url http://127.0.0.1:30000 --master 127.0.0.1:9003",
    "hicache watch --sglang-url http://10.0.0.1:30000 --sglang-url http://10.0.0.2:30000 --once --json",
)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _rate(fig) -> str:
    if not fig:
        return "-"
    return f"{fig['rate']:,.0f}/s" if fig.get("rate") is not None else f"{fig['total']:,.0f}"


def _view(data: dict) -> Group:
    parts: list = []
    if data["verdicts"]:
        for v in data["verdicts"]:
            colour = "red" if v["severity"] == "critical" else "yellow"
            parts.append(Text.from_markup(f"[bold {colour}]{v['kind']}[/] {v['where']}: {v['message']}"))
            parts.append(Text(f"  next: {v['next']}"))
    else:
        parts.append(Text.from_markup("[bold green]ok:[/] no verdict in the window."))
    table = Table(title=f"per instance (rates over {data['window_s']:g} s)")
    table.add_column("instance", overflow="fold")
    for col in ("prompt", "device", "host", "storage", "fetched", "to L3", "dropped", "load-back", "host pool"):
        table.add_column(col, justify="right", no_wrap=True)
    for inst in data["instances"]:
        if "tokens" not in inst:
            table.add_row(inst["url"], *["-"] * 9)
            continue
        t = inst["tokens"]
        pool = inst.get("host_pool")
        table.add_row(
            f"{inst['url']} ({inst['meanings']})",
            _rate(t["prompt"]),
            *(_pct(t[tier]["share"]) for tier in ("device", "host", "storage")),
            _rate(inst["prefetch"]["fetched"]),
            _rate(inst["backup"]["to_l3"]),
            _rate(inst["backup"]["dropped_before_l3"]),
            _rate(inst["load_back"]),
            _pct(pool["ratio"]) if pool else "-",
        )
    parts.append(table)
    master = data.get("master")
    if master and "keys" in master:
        parts.append(
            Text(
                f"master {master['url']}: {_pct(master['used_ratio'])} of {master['capacity_bytes']:,.0f} B used, "
                f"{master['keys']:,.0f} keys, puts {_rate(master['puts'])}, put failures "
                f"{_rate(master['put_failures'])}, evictions {_rate(master['evictions'])}"
            )
        )
    meanings = sorted({f"{i['meanings']} ({i['meanings_from']})" for i in data["instances"]})
    parts.append(Text(f"metric meanings applied: SGLang {'; '.join(meanings)} (docs/metrics.md)", style="dim"))
    return Group(*parts)


def _render(data: dict) -> None:
    stdout.print(_view(data))


def watch(
    sglang_url: Annotated[
        list[str],
        typer.Option(
            "--sglang-url", metavar="URL", help="An SGLang server to scrape (repeatable).", rich_help_panel=INPUT
        ),
    ],
    master: MasterOption = None,
    sglang_version: Annotated[
        str | None,
        typer.Option(
            "--sglang-version",
            metavar="VERSION",
            help="Metric meanings to apply when /server_info does not say (0.5.14 or 0.5.23).",
            rich_help_panel=INPUT,
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", metavar="SECONDS", help="Seconds between scrapes.", rich_help_panel=INPUT)
    ] = 2.0,
    window: Annotated[
        float,
        typer.Option(
            "--window", metavar="SECONDS", help="Rates are taken over this sliding window.", rich_help_panel=INPUT
        ),
    ] = 60.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Scrape twice, --interval apart, print one report and exit.", rich_help_panel=OUTPUT
        ),
    ] = False,
    timeout: TimeoutOption = 3.0,
    json_output: JsonOption = False,
) -> None:
    """Live per-tier hit rates, prefetch and backup outcomes, host pool and L3 figures, verdicts first.

    Ctrl-C stops and prints the last window as a summary. Exit 3 when a URL does not answer.
    """
    with reporting(json_output):
        from hicache_ops import interrupt
        from hicache_ops.commands.watch import Sampler, report
        from hicache_ops.errors import InputError
        from hicache_ops.results import json_data
        from hicache_ops.sglang.versions import validate_version

        if sglang_version is not None:
            validate_version(sglang_version)
        if not interval > 0:
            raise InputError(f"--interval {interval:g} must be positive.")
        sampler = Sampler(sglang_url, master, window=window, timeout=timeout)
        sampler.scrape(strict=True)  # the first round: an unreachable URL is exit 3
        if once:
            with interrupt.stop_on_signals():
                interrupt.wait(interval)
                if not interrupt.requested():
                    sampler.scrape(strict=True)
            emit(report(sampler, sglang_version), json_output, lambda r: _render(json_data(r)))
            return
        from rich.live import Live

        with interrupt.stop_on_signals():
            if json_output:
                while not interrupt.wait(interval):
                    sampler.scrape()
                    emit(report(sampler, sglang_version), True, lambda r: _render(json_data(r)))
            else:
                with Live(
                    _view(json_data(report(sampler, sglang_version))), console=stdout, auto_refresh=False
                ) as live:
                    while not interrupt.wait(interval):
                        sampler.scrape()
                        live.update(_view(json_data(report(sampler, sglang_version))), refresh=True)
            stopped = interrupt.reason()
        summary = report(sampler, sglang_version)
        summary.stopped = stopped
        if not json_output:
            stdout.print(f"stopped ({stopped}) after {sampler.rounds} scrape(s); the last window:")
        emit(summary, json_output, lambda r: _render(json_data(r)))
