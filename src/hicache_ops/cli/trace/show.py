"""`hicache trace show`: summarise a tap recording (registered on the `trace` group)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import JsonOption
from hicache_ops.cli.common.output import emit, json_data, reporting, stdout
from hicache_ops.commands.trace.show import show as show_summary

EXAMPLES = examples(
    "hicache trace show /tmp/hicache-tap.jsonl",
    "hicache trace show hicache-tap.tp0.jsonl hicache-tap.tp1.jsonl --json",
)

QUERY_ROWS = 20


def _fmt(x) -> str:
    return "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def _method_table(title: str, methods: dict) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("method", no_wrap=True, min_width=15)
    for col in ("calls", "errors", "pages", "bytes", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, m in methods.items():
        lat = m["latency_ms"]
        table.add_row(
            name,
            str(m["calls"]),
            str(m["errors"]),
            str(m["pages"]),
            str(m["bytes"]),
            _fmt(lat["p50"]),
            _fmt(lat["p90"]),
            _fmt(lat["p99"]),
            _fmt(lat["max"]),
        )
    return table


def _render(s: dict) -> None:
    src = s["source"]
    when = ""
    if src["first_ts"] is not None:
        start = datetime.fromtimestamp(src["first_ts"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        when = f"  from {start} over {src['span_s']} s"
    stdout.print(
        f"[bold]{src['records']}[/] records, {src['storage_calls']} storage calls, "
        f"ranks {', '.join(src['ranks']) or '-'}, pids {', '.join(map(str, src['pids'])) or '-'}{when}",
    )
    for o in src["opens"]:
        state = f"[red]failed: {o['error']}[/]" if o.get("error") else "opened"
        stdout.print(
            f"  {o['rank']} pid {o['pid']}: {state}  model {o.get('model_name') or '-'}  "
            f"key prefix {o.get('key_prefix') or '(none)'}  master {o.get('master') or '-'}"
        )
    if s["methods"]:
        stdout.print(_method_table("calls per method (latency in ms)", s["methods"]))
    if len(s["ranks"]) > 1:
        for label, methods in s["ranks"].items():
            stdout.print(_method_table(f"rank {label} (latency in ms)", methods))

    q = s["queries"]
    if q["count"]:
        stdout.print(
            f"[bold]storage-hit prefix[/] {q['count']} queries: {q['full_hits']} full, {q['partial_hits']} partial, "
            f"{q['misses']} miss; {q['pages_hit']}/{q['pages_asked']} pages hit (ratio {_fmt(q['hit_ratio'])})",
        )
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("seq", "rank", "hit/asked", "first page key"):
            table.add_column(col)
        rows = q["per_query"]
        for item in rows[-QUERY_ROWS:]:
            table.add_row(
                str(item["seq"]), item["rank"], f"{item['hit_pages']}/{item['pages']}", (item["first_key"] or "-")[:16]
            )
        if len(rows) > QUERY_ROWS:
            stdout.print(f"  (last {QUERY_ROWS} of {len(rows)}; --json lists them all)")
        stdout.print(table)

    f = s["failures"]
    if f["count"]:
        stdout.print(
            f"[bold red]failures[/] {f['count']}: " + ", ".join(f"{k} {n}" for k, n in sorted(f["by_kind"].items()))
        )
        for item in f["list"][:QUERY_ROWS]:
            where = f"{item['rank']} seq {item['seq']} {item['method']}"
            if item["kind"] == "raised":
                stdout.print(f"  {where}: raised {item['detail']}")
            else:
                stdout.print(
                    f"  {where}: {item['failed_pages']}/{item['pages']} pages failed, first at "
                    f"{item['first_failed_index']} ({(item['first_failed_key'] or '-')[:16]}): {item['detail']}",
                )
    else:
        stdout.print("[green]failures[/] none")

    k = s["keys"]
    p = k["pages"]
    stdout.print(f"[bold]keys[/] {k['verdict']}")
    stdout.print(
        f"  pages written {p['written']}, read ok {p['read_ok']} (of them written here {p['read_ok_written_here']}), "
        f"read failed {p['read_failed']}, read but never written here {p['read_never_written']}, "
        f"written never read {p['written_never_read']}",
    )
    for key in p["lists"]["read_never_written"]:
        stdout.print(f"    read, never written: {key}")
    for key in p["lists"]["read_failed_after_write"]:
        stdout.print(f"    [red]written, then read failed:[/] {key}")
    o = k["objects"]
    if o is not None:
        stdout.print(
            f"  objects put {o['put']}, already present at set {o['present_at_set']}, got {o['get_ok']} "
            f"(put here {o['get_ok_put_here']}), get failed {o['get_failed']} "
            f"(put here {o['get_failed_put_here']}; codes {o['get_failed_codes'] or '-'})",
        )


def show(
    files: Annotated[
        list[str],
        typer.Argument(
            help="Tap recording(s): one per rank, as `hicache tap` names them.", metavar="FILE", show_default=False
        ),
    ],
    json_output: JsonOption = False,
) -> None:
    """Summarise a tap recording: calls, hit prefixes, failures, keys written vs read, latencies."""
    with reporting(json_output):
        emit(show_summary(files), json_output, lambda summary: _render(json_data(summary)))
