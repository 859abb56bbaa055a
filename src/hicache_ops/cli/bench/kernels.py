"""`hicache bench kernels`: KV transfer and checksum speed as ratios against plain copies, one run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    Device,
    DeviceOption,
    HeadDimOption,
    HostLayout,
    JsonOption,
    LayersOption,
    PageSizeOption,
    RepeatsOption,
)
from hicache_ops.cli.common.output import emit, json_data, reporting, stdout
from hicache_ops.errors import InputError
from hicache_ops.sglang.host_pool import LAYOUTS

if TYPE_CHECKING:
    from hicache_ops.commands.bench.kernels import KernelBenchResult

EXAMPLES = examples(
    "hicache bench kernels",
    "hicache bench kernels --device cuda --attention mha --layout page_first --layout page_head",
    "hicache bench kernels --tokens 4096 --repeats 3 --json",
)


def _render(result: KernelBenchResult) -> None:
    data = json_data(result)
    g = data["geometry"]
    where = "1 CPU thread" if data["platform"] == "cpu" else data["device_name"]
    stdout.print(
        f"{data['tokens']:,} tokens in pages of {data['page_size']} on {where}; L={g['layers']} H={g['heads']} "
        f"D={g['head_dim']} (MLA C={g['kv_cache_dim']}) {g['dtype']}; best of {data['repeats']}, interleaved",
    )
    for kind, base in data["baselines"].items():
        mb = data["bytes_moved"][kind] / 1e6
        if "contiguous_s" in base:
            stdout.print(
                f"  {kind}: {mb:.1f} MB per transfer; baseline contiguous copy {base['contiguous_gb_per_s']:.2f} GB/s",
            )
        else:
            stdout.print(
                f"  {kind}: {mb:.1f} MB per transfer; baseline memcpy D2H {base['memcpy_backup_gb_per_s']:.1f} GB/s, "
                f"H2D {base['memcpy_load_gb_per_s']:.1f} GB/s",
            )
    base_name = "contiguous copy" if data["platform"] == "cpu" else "one memcpy"
    stdout.print(f"  {'kind':<4} {'layout':<18} {'dir':<6} {'GB/s':>7}  {'vs ' + base_name:>18}")
    for c in data["cases"]:
        mark = ""
        if c["target"] is not None:
            mark = f"  [green]>= {c['target']:.2f}[/]" if c["meets_target"] else f"  [red]below {c['target']:.2f}[/]"
        extra = ""
        if c["ratio_vs_page_loop"] is not None:
            ok = c["meets_page_loop_target"]
            color = "green" if ok else ("red" if ok is False else "default")
            extra += f"  vs page loop [{color}]{c['ratio_vs_page_loop']:.2f}x[/]"
        if c["ratio_vs_chunk_loop"] is not None:
            extra += f"  vs chunk loop {c['ratio_vs_chunk_loop']:.2f}x"
        if c["ratio_vs_sglang"] is not None:
            extra += f"  vs sgl-kernel {c['ratio_vs_sglang']:.2f}x"
        stdout.print(
            f"  {c['attention']:<4} {c['layout']:<18} {c['direction']:<6} {c['gb_per_s']:7.2f}  "
            f"{c['ratio']:17.2f}x{mark}{extra}",
        )
    for s in data["checksums"]:
        stdout.print(f"  {s['attention']:<4} checksum {s['where']:<17} {s['gb_per_s']:7.2f}  {s['ratio']:17.2f}x")
    stdout.print(f"  copies verified by checksum: {data['verified']}")
    for note in data["notes"]:
        stdout.print(f"  [dim]{note}[/]")


def kernels(
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens per transfer (whole pages).", metavar="N")] = 1024,
    layers: LayersOption = 32,
    heads: Annotated[int, typer.Option("--heads", help="KV heads per rank (MHA).", metavar="N")] = 8,
    head_dim: HeadDimOption = 128,
    kv_cache_dim: Annotated[
        int, typer.Option("--kv-cache-dim", help="MLA row: kv_lora_rank + qk_rope_head_dim.", metavar="N")
    ] = 576,
    page_size: PageSizeOption = 16,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Tensor dtype: bfloat16, float16, float32 or uint8 (fp8).", metavar="DTYPE")
    ] = "bfloat16",
    attention: Annotated[str, typer.Option("--attention", help="mha, mla or both.", metavar="KIND")] = "both",
    layout: Annotated[
        list[HostLayout] | None,
        typer.Option(
            "--layout",
            help=f"Host layouts to measure (repeatable): {', '.join(LAYOUTS)} [default: all].",
            metavar="LAYOUT",
            show_default=False,
        ),
    ] = None,
    device: DeviceOption = Device.auto,
    repeats: RepeatsOption = 5,
    json_output: JsonOption = False,
) -> None:
    """Transfer kernels per layout and direction, as ratios against plain copies measured in one run.

    The geometry is one rank's slice (--heads per rank); the best of --repeats counts.
    """
    with reporting(json_output):
        if (
            layers is None
            or head_dim is None
            or tokens < page_size
            or page_size <= 0
            or repeats <= 0
            or min(layers, heads, head_dim, kv_cache_dim) <= 0
        ):
            raise InputError(
                "--tokens must hold at least one page, and --page-size, --repeats and the geometry must be > 0."
            )
        if dtype not in ("bfloat16", "float16", "float32", "uint8"):
            raise InputError(f"--dtype {dtype!r} is unknown.", hint="Use bfloat16, float16, float32 or uint8.")
        if attention not in ("mha", "mla", "both"):
            raise InputError(f"--attention {attention!r} is unknown.", hint="Use mha, mla or both.")
        from hicache_ops.mooncake.store_client import check_fits_in_memory

        # At least the device pool (2x the tokens) and one host pool (1.25x) of the larger attention kind.
        itemsize = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1}[dtype]
        row = max(2 * heads * head_dim if attention != "mla" else 0, kv_cache_dim if attention != "mha" else 0)
        check_fits_in_memory(int(tokens * 3.25 * layers * row * itemsize), f"--tokens {tokens} at this geometry")
        from hicache_ops.commands.bench.kernels import bench_kernels  # imports torch: only when the command runs

        try:
            result = bench_kernels(
                tokens=tokens,
                layers=layers,
                heads=heads,
                head_dim=head_dim,
                kv_cache_dim=kv_cache_dim,
                page_size=page_size,
                dtype=dtype,
                repeats=repeats,
                attention=attention,
                device=device.value,
                layouts=tuple(lay.value for lay in layout) if layout else None,
            )
        except RuntimeError as exc:
            if "CUDA is not available" in str(exc):
                raise InputError(str(exc), hint="Drop --device cuda, or run on a machine with a GPU.") from None
            raise
        emit(result, json_output, _render)
