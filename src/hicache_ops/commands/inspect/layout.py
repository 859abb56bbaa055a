"""`hicache inspect layout`: what SGLang builds for a model and its flags.

The start-up rewrites, one rank's host pool and the zero-copy metadata of chosen pages, and the
host pools of the side pools given (docs/side-pools.md#side-host-pools).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import ModelGeometry
from hicache_ops.sglang.host_pool import (
    DEFAULT_HICACHE_RATIO,
    DevicePoolLayout,
    HostPoolLayout,
    PageMeta,
    check_layout_for,
)
from hicache_ops.sglang.rewrites import Resolution, layout_warnings, resolve_layout
from hicache_ops.sglang.side_host_pool import SideHostPool, SidePageMeta, side_host_pools
from hicache_ops.sglang.side_pool_specs import PoolSpec

if TYPE_CHECKING:
    from hicache_ops.commands.inspect.results import LayoutResult
from hicache_ops.sglang.versions import NEWEST, V0_5_23, family, validate_version


def parse_pages(text: str | None) -> list[int] | None:
    """`0,2,5` -> [0, 2, 5]; None or blank -> None (the default pages)."""
    if text is None or not text.strip():
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise InputError(f"page {part!r} in --pages is not an integer.", hint="Pass pages like 0,2,5.") from None
        out.append(value)
    return out


@dataclass
class LayoutReport:
    requested_layout: str
    requested_io_backend: str
    resolution: Resolution
    pool: HostPoolLayout
    pages: list[PageMeta]
    device: DevicePoolLayout
    notes: list[str]
    warnings: list[str]
    side_pools: list[SideHostPool] = field(default_factory=list)
    side_pages: dict[str, list[SidePageMeta]] = field(default_factory=dict)

    def result(self) -> LayoutResult:
        from hicache_ops.commands.inspect.results import LayoutResult, SideLayoutPool

        body = {k: v for k, v in dict(self.pool.view()).items() if k not in ("layout", "sglang_version")}
        return LayoutResult(
            sglang_version=self.pool.sglang_version,
            layout=self.requested_layout,
            effective_layout=self.resolution.layout,
            requested_io_backend=self.requested_io_backend,
            io_backend=self.resolution.io_backend,
            mooncake=self.pool.mooncake,
            **body,
            device_pool=self.device.view(),
            pages=[p.view() for p in self.pages],
            pools=[
                SideLayoutPool(**dict(side.view()), pages=[m.view() for m in self.side_pages[side.name]])
                for side in self.side_pools
            ],
            rewrites=list(self.resolution.notes),
            notes=self.notes,
            warnings=self.warnings,
        )


def default_pages(page_num: int) -> list[int]:
    """The first two pages and the last one (the extra page SGLang adds)."""
    return sorted({p for p in (0, 1, page_num - 1) if 0 <= p < page_num})


def inspect_layout(
    geometry: ModelGeometry,
    *,
    layout: str = "page_first",
    io_backend: str = "kernel",
    page_size: int = 64,
    device_tokens: int = 65536,
    hicache_ratio: float | None = None,
    hicache_size_gb: float = 0,
    tp_size: int = 1,
    tp_lcm_size: int | None = None,
    pages: Sequence[int] | None = None,
    mooncake: bool = True,
    sglang_version: str = NEWEST,
    pools: Sequence[PoolSpec] = (),
) -> LayoutReport:
    """What SGLang builds for this model and these flags: the rewrites it applies, the host
    pool of one rank, the zero-copy metadata of the chosen pages, and the host pool of each
    side pool in `pools`.

    `hicache_ratio` None means SGLang's default (2.0). `pages` None: pages 0, 1 and the last
    (of each pool; given pages are shown where a pool has them).
    """
    validate_version(sglang_version)
    check_layout_for(layout, mla=geometry.mla)
    resolution = resolve_layout(layout, io_backend, mooncake, version=sglang_version)
    ratio = DEFAULT_HICACHE_RATIO if hicache_ratio is None else hicache_ratio
    pool = HostPoolLayout(
        geometry,
        resolution.layout,
        page_size,
        device_tokens,
        hicache_ratio=ratio,
        hicache_size_gb=hicache_size_gb,
        tp_size=tp_size,
        tp_lcm_size=tp_lcm_size,
        sglang_version=sglang_version,
        mooncake=mooncake,
    )
    chosen = default_pages(pool.page_num) if pages is None else list(pages)
    metas = pool.page_buffer_meta(chosen)
    notes = list(resolution.notes) + pool.notes()
    if hicache_size_gb > 0:
        notes.append(
            f"--hicache-size {hicache_size_gb} GB sets the pool: {hicache_size_gb} * 1e9 // "
            f"{pool.bytes_per_token} bytes per token, plus one page"
            + (" (--hicache-ratio is ignored)." if hicache_ratio is not None else ".")
        )
    elif hicache_ratio is None and family(sglang_version) == V0_5_23:
        notes.append(
            "SGLang 0.5.23 without --hicache-ratio or --hicache-size may lower the 2.0 ratio at "
            "start-up so all host pools fit 0.8 of the free host memory (after a 10 GiB reserve)."
        )
    warnings = layout_warnings(resolution.layout, resolution.io_backend, mla=geometry.mla) + pool.warnings()
    device = DevicePoolLayout(geometry, device_tokens, page_size, tp_size)
    side, skipped = side_host_pools(pools, pool)
    notes += skipped
    side_pages = {}
    for s in side:
        wanted = default_pages(s.page_num) if pages is None else [p for p in chosen if 0 <= p < s.page_num]
        side_pages[s.name] = s.page_buffer_meta(wanted)
    return LayoutReport(layout, io_backend, resolution, pool, metas, device, notes, warnings, side, side_pages)
