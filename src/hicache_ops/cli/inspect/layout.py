"""`hicache inspect layout`: the host pool (L2) SGLang builds, and what each page sends to Mooncake;
with --pool / --pool-preset, the side pools' host pools too."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    DEPLOYMENT,
    OUTPUT,
    DeviceTokensOption,
    DtypeOption,
    HeadDimOption,
    HicacheRatioOption,
    HicacheSizeOption,
    HostLayout,
    IoBackend,
    IoBackendOption,
    JsonOption,
    LayersOption,
    LayoutOption,
    MlaOption,
    PageSizeOption,
    PoolOption,
    PoolPresetOption,
    PresetOption,
    SglangVersionOption,
    TpLcmSizeOption,
    TpSizeOption,
    value_of,
)
from hicache_ops.cli.common.output import emit, json_data, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import sglang_url_option
from hicache_ops.commands.inspect.layout import LayoutReport, inspect_layout, parse_pages
from hicache_ops.sglang.geometry import resolve_geometry
from hicache_ops.sglang.versions import default_version, validate_version
from hicache_ops.units import format_bytes

EXAMPLES = examples(
    "hicache inspect layout --preset llama-3.1-8b --tp-size 2 --hicache-size 40",
    "hicache inspect layout --preset deepseek-v3 --hicache-mem-layout page_first --hicache-io-backend direct",
    "hicache inspect layout --pool-preset qwen3-next --pool mamba:tokens=512 --pages 0,1 --json",
)


def _si(n: int) -> str:
    # SGLang's --hicache-size counts decimal GB, so pool sizes read in the same units.
    return format_bytes(n, "decimal")


def _shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _render(report: LayoutReport) -> None:
    data = json_data(report.result())
    pool = report.pool
    geo = pool.geometry
    if geo.mla:
        model = f"MLA, {geo.layers} layers, latent {geo.kv_lora_rank}+{geo.qk_rope_head_dim}"
    else:
        model = f"MHA, {geo.layers} layers, {geo.kv_heads} KV heads x {geo.head_dim}"
    name = f"{geo.name}: " if geo.name else ""
    stdout.print(
        f"[bold]{name}{model}, {geo.dtype}[/] (stored as {geo.stored_dtype})  "
        f"SGLang {pool.sglang_version}  tp-size {pool.tp_size} "
        + ("(latent rows replicated on every rank)" if geo.mla else f"({pool.heads_per_rank} KV heads per rank)"),
    )
    layout_line = f"layout {data['layout']}"
    if data["effective_layout"] != data["layout"]:
        layout_line += f" -> [bold]{data['effective_layout']}[/]"
    io_line = f"io backend {data['requested_io_backend']}"
    if data["io_backend"] != data["requested_io_backend"]:
        io_line += f" -> [bold]{data['io_backend']}[/]"
    l3 = "Mooncake L3" if pool.mooncake else "no Mooncake L3"
    stdout.print(f"{layout_line}   {io_line}   {l3}")
    for rewrite in report.resolution.notes:
        stdout.print(f"  [cyan]SGLang rewrites:[/] {rewrite}")

    sizing = (
        f"--hicache-size {pool.hicache_size_gb} GB"
        if pool.hicache_size_gb > 0
        else f"{pool.device_tokens} device tokens x ratio {pool.hicache_ratio}"
    )
    stdout.print(
        f"host pool: {pool.size} tokens = {pool.page_num} pages of {pool.page_size} (from {sizing}, plus one page)\n"
        f"  {pool.bytes_per_token} B/token, {_si(pool.bytes_per_page)}/page, "
        f"[bold]{_si(pool.host_bytes)}[/] per rank ({pool.host_bytes} B)",
    )
    dev = report.device
    stdout.print(
        f"device pool (L1, layer-first): {'KV' if geo.mla else 'K'} {_shape(dev.k_shape)}"
        + (f", V {_shape(dev.v_shape)}" if dev.v_shape else "")
        + f" ({dev.device_tokens} tokens + 1 padding page), {_si(dev.nbytes)}",
    )

    buffers = Table(title="host buffers", title_justify="left")
    for col in ("name", "shape", "dtype", "size", "bytes"):
        buffers.add_column(col, justify="right" if col in ("size", "bytes") else "left")
    for buf in pool.buffers:
        buffers.add_row(buf.name, _shape(buf.shape), buf.dtype, _si(buf.nbytes), str(buf.nbytes))
        for part, offset, nbytes in buf.parts:
            buffers.add_row(f"  {part}", f"at +{offset}", "", _si(nbytes), str(nbytes))
    stdout.print(buffers)

    if pool.mooncake:
        zero_copy = "yes" if pool.mooncake_zero_copy else "[red]no[/]"
        stdout.print(
            f"Mooncake zero-copy: {zero_copy}; {pool.objects_per_page} byte range(s) -> "
            f"{pool.mooncake_objects_per_page} object(s) per page",
        )
    pages = Table(title="page buffer metadata (offsets from the buffer start)", title_justify="left")
    for col in ("page", "#", "part", "buffer", "offset", "size"):
        pages.add_column(col, justify="right" if col in ("page", "#", "offset", "size") else "left")
    for meta in report.pages:
        for i, obj in enumerate(meta.objects):
            part = obj.part
            if obj.layer is not None:
                part += f" layer {obj.layer}"
            if obj.heads is not None:
                part += f" heads {obj.heads[0]}..{obj.heads[1] - 1} (split {obj.split})"
            pages.add_row(str(meta.index) if i == 0 else "", str(i), part, obj.buffer, str(obj.offset), str(obj.size))
    stdout.print(pages)
    for side in report.side_pools:
        _render_side(side, report.side_pages[side.name])
    for note in report.notes:
        if note not in report.resolution.notes:
            stderr.print(f"[yellow]note:[/] {note}")
    for warning in report.warnings:
        stderr.print(f"[bold yellow]warning:[/] {warning}")


def _dims(value) -> str:
    """A shape as 32x128x128; several as 8192x3 + 1024x3; anything else as is."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return " + ".join(_dims(v) for v in value)
    if isinstance(value, list):
        return "x".join(str(d) for d in value)
    return str(value)


def _render_side(side, pages) -> None:
    shapes = ", ".join(f"{k.replace('_', ' ')} {_dims(v)}" for k, v in side.shapes.items())
    device = f" from {side.device_slots} device slots" if side.device_slots is not None else ""
    stdout.print(
        f"\n[bold]side pool {side.name}[/] ({side.sglang_class}, {side.layout}): {shapes}\n"
        f"  {side.size} slots = {side.page_num} pages of {side.page_size}{device}; "
        f"{side.bytes_per_slot} B/slot, {_si(side.bytes_per_page)}/page, [bold]{_si(side.host_bytes)}[/] per rank",
    )
    buffers = Table(title=f"{side.name} host buffers", title_justify="left")
    for col in ("name", "shape", "dtype", "size", "bytes"):
        buffers.add_column(col, justify="right" if col in ("size", "bytes") else "left")
    for buf in side.buffers:
        buffers.add_row(buf.name, _shape(buf.shape), buf.dtype, _si(buf.nbytes), str(buf.nbytes))
    stdout.print(buffers)
    if not side.zero_copy:
        stdout.print(f"  no page metadata: SGLang's {side.sglang_class} has none for {side.layout}")
    else:
        table = Table(
            title=f"{side.name} page buffer metadata (object suffix, offsets from the buffer start)",
            title_justify="left",
        )
        for col in ("page", "#", "suffix", "part", "buffer", "offset", "size"):
            table.add_column(col, justify="right" if col in ("page", "#", "offset", "size") else "left")
        for meta in pages:
            for i, obj in enumerate(meta.objects):
                part = obj.range.part + (f" layer {obj.range.layer}" if obj.range.layer is not None else "")
                table.add_row(
                    str(meta.index) if i == 0 else "",
                    str(i),
                    obj.suffix,
                    part,
                    obj.range.buffer,
                    str(obj.range.offset),
                    str(obj.range.size),
                )
        stdout.print(table)
    for note in side.notes:
        stderr.print(f"[yellow]note ({side.name}):[/] {note}")
    for warning in side.warnings:
        stderr.print(f"[bold yellow]warning ({side.name}):[/] {warning}")


@sglang_url_option(
    "sglang_version",
    "page_size",
    "device_tokens",
    "hicache_ratio",
    "hicache_size",
    "io_backend",
    "tp_size",
    "tp_lcm_size",
    "mooncake",
    "layout",
)
def layout(
    preset: PresetOption = None,
    layers: LayersOption = None,
    heads: Annotated[
        int | None,
        typer.Option(
            "--heads",
            help="KV heads in total (before TP).",
            metavar="N",
            show_default=False,
            rich_help_panel=DEPLOYMENT,
        ),
    ] = None,
    head_dim: HeadDimOption = None,
    dtype: DtypeOption = None,
    mla: MlaOption = False,
    kv_lora_rank: Annotated[
        int | None,
        typer.Option(
            "--kv-lora-rank", help="MLA latent rank.", metavar="N", show_default=False, rich_help_panel=DEPLOYMENT
        ),
    ] = None,
    qk_rope_head_dim: Annotated[
        int | None,
        typer.Option(
            "--qk-rope-head-dim",
            help="MLA rope head size.",
            metavar="N",
            show_default=False,
            rich_help_panel=DEPLOYMENT,
        ),
    ] = None,
    page_size: PageSizeOption = 64,
    device_tokens: DeviceTokensOption = 65536,
    hicache_ratio: HicacheRatioOption = None,
    hicache_size: HicacheSizeOption = 0,
    layout: LayoutOption = HostLayout.page_first,
    io_backend: IoBackendOption = IoBackend.kernel,
    tp_size: TpSizeOption = 1,
    tp_lcm_size: TpLcmSizeOption = None,
    mooncake: Annotated[
        bool,
        typer.Option(
            "--mooncake/--no-mooncake", help="Whether the L3 storage backend is Mooncake.", rich_help_panel=DEPLOYMENT
        ),
    ] = True,
    sglang_version: SglangVersionOption = None,
    pool: PoolOption = None,
    pool_preset: PoolPresetOption = None,
    pages: Annotated[
        str | None,
        typer.Option(
            "--pages",
            help="Host pages to show, comma separated (default: 0, 1 and the last).",
            metavar="LIST",
            show_default=False,
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """The host KV pool SGLang builds (shapes, sizes, rewrites) and each page's Mooncake byte ranges;
    with --pool / --pool-preset, each side pool's host pool as well."""
    with reporting(json_output):
        from hicache_ops.sglang.side_pool_specs import combine_pools
        from hicache_ops.sglang.side_pool_specs import preset as pool_preset_named

        version = validate_version(value_of(sglang_version) or default_version())
        preset_pools = []
        if pool_preset is not None:
            chosen = pool_preset_named(pool_preset, version)
            preset_pools = chosen.specs(page_size)
            # The preset's KV geometry when none is given; an MLA preset makes the KV pool MLA.
            if (
                preset is None
                and not any(v is not None for v in (layers, heads, head_dim, kv_lora_rank, qk_rope_head_dim))
                and not mla
            ):
                preset = chosen.geometry
            mla = mla or (chosen.mla and preset is None)
        pools = combine_pools(preset_pools, pool or [])
        geometry = resolve_geometry(
            preset_name=preset,
            layers=layers,
            kv_heads=heads,
            head_dim=head_dim,
            dtype=dtype,
            mla=mla,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
        )
        report = inspect_layout(
            geometry,
            layout=layout.value,
            io_backend=io_backend.value,
            page_size=page_size,
            device_tokens=device_tokens,
            hicache_ratio=hicache_ratio,
            hicache_size_gb=hicache_size,
            tp_size=tp_size,
            tp_lcm_size=tp_lcm_size,
            pages=parse_pages(pages),
            mooncake=mooncake,
            sglang_version=version,
            pools=pools,
        )
        emit(report.result(), json_output, lambda _: _render(report))
