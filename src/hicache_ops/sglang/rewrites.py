"""The layout / IO-backend rewrites SGLang applies at start-up, per version.

0.5.14 rewrites in `server_args.py`, 0.5.23 in `arg_groups/hicache_hook.py`; the rules are
written down in docs/rewrites.md.
"""

from __future__ import annotations

from typing import NamedTuple

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import positive_int
from hicache_ops.sglang.host_pool import LAYOUTS
from hicache_ops.sglang.versions import NEWEST, V0_5_14, V0_5_23, family, validate_version

# The IO backends between device and host on CUDA/ROCm (kernel_ascend is Ascend-only).
IO_BACKENDS: tuple[str, ...] = ("kernel", "direct")


def check_io_backend(io_backend: str) -> str:
    """Return `io_backend` if it is one this toolkit models, else raise an InputError."""
    if io_backend not in IO_BACKENDS:
        raise InputError(f"io backend {io_backend!r} is unknown.", hint=f"Use one of: {', '.join(IO_BACKENDS)}.")
    return io_backend


class Resolution(NamedTuple):
    """What SGLang runs with after its start-up rewrites; unpacks as (layout, io_backend, notes)."""

    layout: str
    io_backend: str
    notes: list[str]


def resolve_layout(
    layout: str,
    io_backend: str,
    mooncake: bool,
    *,
    version: str = NEWEST,
    rocm: bool = False,
    dcp_size: int = 1,
) -> Resolution:
    """The (layout, io_backend) SGLang ends up with, and one note per rewrite, in its order.

    1. page_first_direct with the kernel backend switches the backend to direct.
    2. page_first with the direct backend switches the layout to page_first_direct.
    3. 0.5.14 on ROCm only: page_first with the kernel backend falls back to layer_first.
    4. A Mooncake L3 cannot use layer_first: it becomes page_first (kernel) or
       page_first_direct (direct). 0.5.23 skips this when dcp_size > 1 (MLA pages then go to
       Mooncake as multi-buffer objects).
    Nothing else is rewritten: page_head with direct IO starts and then fails at the first
    transfer (see `layout_warnings`).
    """
    validate_version(version)
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is unknown.", hint=f"Use one of: {', '.join(LAYOUTS)}.")
    check_io_backend(io_backend)
    positive_int("dcp-size", dcp_size)
    notes: list[str] = []
    if layout == "page_first_direct" and io_backend == "kernel":
        io_backend = "direct"
        notes.append("io backend kernel -> direct: the kernel backend cannot move page_first_direct pages.")
    if layout == "page_first" and io_backend == "direct":
        layout = "page_first_direct"
        notes.append("layout page_first -> page_first_direct: the direct backend needs whole pages contiguous.")
    if family(version) == V0_5_14 and rocm and layout == "page_first" and io_backend == "kernel":
        layout = "layer_first"
        notes.append("layout page_first -> layer_first: SGLang 0.5.14 on ROCm has no page_first kernel write-back.")
    skip_for_dcp = family(version) == V0_5_23 and dcp_size > 1
    if mooncake and layout == "layer_first" and not skip_for_dcp:
        layout = "page_first_direct" if io_backend == "direct" else "page_first"
        notes.append(
            f"layout layer_first -> {layout}: the Mooncake backend does not take layer_first "
            f"(kept io backend {io_backend})."
        )
    return Resolution(layout, io_backend, notes)


def layout_warnings(layout: str, io_backend: str, *, mla: bool) -> list[str]:
    """Combinations SGLang accepts at start-up but cannot run (after `resolve_layout`)."""
    out = []
    if mla and layout == "page_head":
        out.append("MLA models have no page_head host layout: SGLang fails building the host pool.")
    if layout == "page_head" and io_backend == "direct":
        out.append(
            "page_head with the direct io backend is not rewritten at start-up, but the direct "
            "backend cannot move page_head pages: the first host transfer fails; use --io-backend kernel."
        )
    return out
