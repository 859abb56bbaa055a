"""`hicache inspect store`: health, segments and SGLang key groups of a Mooncake master."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.markup import escape

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import INPUT, OUTPUT, JsonOption, MasterOption, TimeoutOption
from hicache_ops.cli.common.output import emit, json_data, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import SglangLayoutUrlOption
from hicache_ops.units import format_bytes

EXAMPLES = examples(
    "hicache inspect store --master 10.0.0.5:9003 --prefix Qwen-Qwen3-8B_ --limit 50",
    "MOONCAKE_MASTER=10.0.0.5:50051 hicache inspect store --json",
    "hicache inspect store --master 10.0.0.5:9003 --sglang-url http://10.0.0.5:30000",
)


def default_master() -> str:
    """HOST:METRICS_PORT from MOONCAKE_MASTER (host only) and MOONCAKE_MASTER_METRICS_PORT."""
    from hicache_ops.mooncake.net import format_host_port, parse_host_port

    port = os.environ.get("MOONCAKE_MASTER_METRICS_PORT", "9003")
    host = "127.0.0.1"
    if os.environ.get("MOONCAKE_MASTER"):
        host, _ = parse_host_port(os.environ["MOONCAKE_MASTER"], what="MOONCAKE_MASTER", default_port=0)
    return format_host_port(host, int(port)) if port.isdigit() else f"{host}:{port}"


def _binary(n: float) -> str:
    # Mooncake sizes segments in binary units (global_segment_size in MiB).
    return format_bytes(n, "binary")


def _render(data: dict[str, Any]) -> None:
    health = data["health"]
    state = "ready" if data["ready"] else "NOT READY"
    stdout.print(
        f"[bold]master[/] {data['master']}  {state}  role {health.get('role', '?')}  "
        f"state {health.get('ha_state', '?')}",
    )
    segs = data["segments"]
    pct = 100.0 * data["used_bytes"] / data["capacity_bytes"] if data["capacity_bytes"] else 0.0
    stdout.print(
        f"[bold]segments[/] {len(segs)}  capacity {_binary(data['capacity_bytes'])}  "
        f"used {_binary(data['used_bytes'])} ({pct:.1f}%)",
    )
    for seg in segs:
        stdout.print(
            f"    {seg['name']}  {seg['protocol']}  {seg['status']}  {_binary(seg['size_bytes'])}  "
            f"used {_binary(seg['used_bytes'])} ({seg['usage_percent']:.1f}%)  TE {seg['te_endpoint']} "
            + (
                "[green]reachable[/]"
                if not seg["endpoint_problem"]
                else f"[bold red]{seg['endpoint_problem'].upper()}[/]"
            ),
        )
        if seg["endpoint_note"]:
            stdout.print(f"      [red]{seg['endpoint_note']}[/]")
    if not segs:
        stdout.print("    (none mounted: no client holds data for this master)")
    scope = f"  matching {data['prefix_filter']!r}: {data['matched_keys']}" if data["prefix_filter"] else ""
    stdout.print(
        f"[bold]keys[/] {data['key_count']}{scope}  SGLang warm-up {data['warmup_keys']}  "
        f"namespace markers {data['namespace_marker_keys']}  other {data['other_keys']}  "
        f"prefix groups {data['group_count']}",
    )
    for ns in data["namespaces"]:
        named = "  ".join(f"{name} {ns[name]!r}" for name in ("extra_key", "cache_salt") if ns[name] is not None)
        stdout.print(f"[bold]namespace[/] {escape(named)}", highlight=False)
    for group in data["groups"]:
        suffixes = ", ".join(f"{s} {n}" for s, n in group["suffixes"].items())
        stdout.print(
            f"[bold]prefix[/] {group['prefix'] or '(none)'}  {group['kind']}  {group['pages']} pages  "
            f"{group['objects']} objects  complete {group['complete_pages']}/{group['pages']}"
            + (f"  K/V incomplete {group['kv_incomplete_pages']}" if group["kv_incomplete_pages"] else "")
            + (f"  DCP {group['dcp']['dcp_size']} of tp {group['dcp']['tp_size']}" if group["dcp"] else ""),
        )
        stdout.print(f"    suffixes {suffixes}")
        for row in group["incomplete"]:
            stdout.print(
                f"    [yellow]incomplete[/] {row['page_key']}  has {' '.join(row['present'])}  "
                f"missing {' '.join(row['missing'])}",
            )
        for pool in group["pools"]:
            stdout.print(
                f"    [bold]pool[/] {pool['pool']}  {pool['pages']} pages  complete "
                f"{pool['complete_pages']}/{pool['pages']}  "
                f"KV pages without it {pool['kv_pages_without_pool']}  without KV {pool['pages_without_kv']}  "
                f"suffixes {', '.join(pool['suffixes'])}",
                highlight=False,
            )
            for row in pool["incomplete"]:
                stdout.print(
                    f"        [yellow]incomplete[/] {row['page_key']}  has {' '.join(row['present'])}  "
                    f"missing {' '.join(row['missing'])}",
                    highlight=False,
                )
    if "server_pools" in data:
        _render_server_pools(data)
    if data["unified_scheme_keys"]:
        stderr.print(
            f"[yellow]note:[/] {data['unified_scheme_keys']} key(s) follow SGLang's unified key scheme "
            "({page_key}_ukv…_L{start}-{end}); no SGLang 0.5.23 flag writes them (docs/keys.md#unified-key-scheme).",
        )
    for key in data["other_key_samples"]:
        stdout.print(f"[dim]other[/] {key}")
    if data["truncated"]:
        stderr.print(f"[dim]note:[/] lists cut at --limit {data['limit']}; counts are complete.")


def _render_server_pools(data: dict[str, Any]) -> None:
    if data["server_pools"] is None:
        stderr.print(f"[yellow]note:[/] {data['l3_layout_note']}", highlight=False)
        return
    served = data["server_pools"]
    stdout.print(f"[bold]pools[/] from the server's L3 layout, key prefix {served['key_prefix'] or '(none)'}")
    for pool in served["pools"]:
        window = f" (last {pool['trailing_pages']} page(s))" if pool["trailing_pages"] else ""
        without = f"  KV pages without it {pool['kv_pages_without_pool']}" if "kv_pages_without_pool" in pool else ""
        stdout.print(
            f"    [bold]pool[/] {pool['pool']}  {pool['hit_policy']}{window}  {pool['pages']} pages  "
            f"complete {pool['complete_pages']}/{pool['pages']}{without}  suffixes {', '.join(pool['suffixes'])}",
            highlight=False,
        )
        for row in pool["incomplete"]:
            stdout.print(f"        [yellow]incomplete[/] {row['page_key']}  missing {' '.join(row['missing'])}")


def store(
    master: MasterOption = None,
    prefix: Annotated[
        str | None,
        typer.Option(
            "--prefix",
            help="Only keys starting with this (e.g. 'Qwen-Qwen3-0.6B_').",
            metavar="PREFIX",
            show_default=False,
            rich_help_panel=INPUT,
        ),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            help="Longest list shown (groups, pages, keys); counts stay exact.",
            metavar="N",
            rich_help_panel=OUTPUT,
        ),
    ] = 20,
    sglang_url: SglangLayoutUrlOption = None,
    timeout: TimeoutOption = 3.0,
    json_output: JsonOption = False,
) -> None:
    """Health, segments and keys of a Mooncake master, grouped the way SGLang names objects.

    Without --master: MOONCAKE_MASTER's host with MOONCAKE_MASTER_METRICS_PORT (9003), else
    127.0.0.1:9003. With --sglang-url, each pool of the server's L3 layout is checked too.
    """
    with reporting(json_output):
        from hicache_ops.commands.inspect.store_listing import inspect_store

        data = inspect_store(
            master or default_master(), prefix=prefix, limit=limit, timeout=timeout, sglang_url=sglang_url
        )
        emit(data, json_output, lambda result: _render(json_data(result)))
