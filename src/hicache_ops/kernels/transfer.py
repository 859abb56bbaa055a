"""Copy KV between the layer-first device pool (L1) and a host pool (L2) in any SGLang layout.

``backup`` moves device -> host, ``load`` moves host -> device. Both take same-length token index
sets (``unit="token"``) or page index sets (``unit="page"``: device page q is device tokens
q*page_size .. q*page_size+page_size-1, likewise host page p). Destination indices must be distinct.

Paths (``backend``):
- ``"cpu"``: both pools on the CPU. The index pairs are cut into runs that are consecutive on both
  sides (and, for page layouts, split at host page boundaries, whole pages kept together); each run
  is one strided copy per component, through numpy ``copyto`` over rows viewed as opaque items
  (page_head: through a cache-sized staging buffer) or torch ``copy_``, whichever measured faster
  for the layout (``CPU_COPIER``). Many short runs fall back to one gather/scatter pass.
- ``"torch"``: the same runs through ``copy_`` on any devices (torch stages strided cross-device
  copies itself); the reference path on a GPU, and the per-piece copy loop to beat there.
- ``"triton"``: one Triton kernel launch per component on CUDA tensors (the host pool pinned or on
  the GPU); on CPU tensors only with ``TRITON_INTERPRET=1``.
- ``"auto"``: ``"triton"`` when the device pool is on CUDA and the host pool is pinned or on CUDA,
  ``"cpu"`` when both are on the CPU, else ``"torch"``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import numpy as np
import torch

from hicache_ops.kernels.geometry import PageGeometry, host_token_view, pool_geometry
from hicache_ops.kernels.indexing import (
    DEFAULT_TILE,
    IndexSet,
    as_index,
    check_in_range,
    check_unit,
    pages_to_tokens,
)

BACKENDS = ("auto", "cpu", "torch", "triton")

# Which copier the CPU path uses per layout, chosen from repeated side-by-side runs (see
# kernels/README.md). numpy copies rows as opaque items (one memmove per contiguous stretch, little
# per-call overhead): best where pieces are long contiguous chunks (layer_first, page_first_direct).
# page_head's contiguous unit is one D-row (256 B for D=128 bf16), where torch's TensorIterator costs
# more per row than numpy; staging each page through a cache-sized buffer keeps the scattered side of
# that transposition in cache ("staged", a few % ahead of plain numpy). page_first's pieces are whole
# (H*D) token rows, where torch's copy_ came out ahead.
CPU_COPIER = {"layer_first": "numpy", "page_first": "torch", "page_first_direct": "numpy", "page_head": "staged"}
# "staged" copies go through a buffer of at most this many bytes (whole pages; at least one).
STAGE_BYTES = 2 << 20


@dataclass
class TransferPlan:
    """A validated transfer: geometry, the pools' component views and the token index pairs."""

    layout: str
    geometry: PageGeometry
    device: list[torch.Tensor]  # per component (L, tokens, H, D)
    host: list[torch.Tensor]  # per component canonical (L, page_num, page_size, H, D)
    device_tokens: torch.Tensor
    host_tokens: torch.Tensor


def plan_transfer(
    device: torch.Tensor | Sequence[torch.Tensor],
    host: torch.Tensor,
    device_indices: IndexSet,
    host_indices: IndexSet,
    *,
    layout: str,
    page_size: int,
    unit: str = "token",
    check_bounds: bool = True,
) -> TransferPlan:
    check_unit(unit)
    geom, dev, canon = pool_geometry(device, host, layout, page_size)
    d_idx = as_index(device_indices, "device_indices")
    h_idx = as_index(host_indices, "host_indices")
    if d_idx.numel() != h_idx.numel():
        raise ValueError(f"device_indices ({d_idx.numel()}) and host_indices ({h_idx.numel()}) differ in length.")
    if unit == "page":
        d_idx = pages_to_tokens(d_idx, page_size)
        h_idx = pages_to_tokens(h_idx, page_size)
    if check_bounds:
        check_in_range(d_idx, dev[0].shape[1], "device token indices")
        check_in_range(h_idx, canon[0].shape[1] * page_size, "host token indices")
    return TransferPlan(layout, geom, dev, canon, d_idx, h_idx)


def backup(
    device: torch.Tensor | Sequence[torch.Tensor],
    host: torch.Tensor,
    *,
    device_indices: IndexSet,
    host_indices: IndexSet,
    layout: str,
    page_size: int,
    unit: str = "token",
    backend: str = "auto",
    tile: int = DEFAULT_TILE,
    check_bounds: bool = True,
) -> None:
    """Copy the KV of `device_indices` (L1, layer-first) into `host_indices` of `host` (L2, `layout`).

    device: MHA ``(k, v)`` of (L, tokens, H, D) (or one (2, L, tokens, H, D) tensor); MLA one
    (L, tokens, 1, C) tensor. host: SGLang's host buffer for `layout` (docs/host-pool.md#mha-buffer-shapes,
    #mla-buffer-shapes). Asynchronous on
    CUDA (the current stream); synchronous on the CPU.
    """
    plan = plan_transfer(
        device,
        host,
        device_indices,
        host_indices,
        layout=layout,
        page_size=page_size,
        unit=unit,
        check_bounds=check_bounds,
    )
    _execute(plan, to_host=True, backend=backend, tile=tile)


def load(
    host: torch.Tensor,
    device: torch.Tensor | Sequence[torch.Tensor],
    *,
    host_indices: IndexSet,
    device_indices: IndexSet,
    layout: str,
    page_size: int,
    unit: str = "token",
    backend: str = "auto",
    tile: int = DEFAULT_TILE,
    check_bounds: bool = True,
) -> None:
    """Copy the KV of `host_indices` of `host` (L2, `layout`) into `device_indices` of the device pool."""
    plan = plan_transfer(
        device,
        host,
        device_indices,
        host_indices,
        layout=layout,
        page_size=page_size,
        unit=unit,
        check_bounds=check_bounds,
    )
    _execute(plan, to_host=False, backend=backend, tile=tile)


def resolve_backend(backend: str, dev: torch.Tensor, host: torch.Tensor) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    if backend != "auto":
        if backend == "cpu" and (dev.device.type != "cpu" or host.device.type != "cpu"):
            raise ValueError("backend 'cpu' needs both pools on the CPU.")
        if backend == "triton" and dev.device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
            raise ValueError("backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU).")
        return backend
    if dev.device.type == "cuda" and (host.device.type == "cuda" or host.is_pinned()):
        return "triton"
    if dev.device.type == "cpu" and host.device.type == "cpu":
        return "cpu"
    return "torch"


def _execute(plan: TransferPlan, *, to_host: bool, backend: str, tile: int) -> None:
    if plan.device_tokens.numel() == 0:
        return
    chosen = resolve_backend(backend, plan.device[0], plan.host[0])
    if chosen == "triton":
        from hicache_ops.kernels import _triton

        _triton.copy_tokens(
            plan.device, plan.host, plan.device_tokens, plan.host_tokens,
            geometry=plan.geometry, to_host=to_host, tile=tile,
        )  # fmt: skip
        return
    copier = CPU_COPIER[plan.layout] if chosen == "cpu" else "torch"
    copy_runs(plan, to_host=to_host, copier=copier)


# ---------------------------------------------------------------------------------------------
# The run-based path (CPU, and torch on any device)


def find_runs(device_tokens: torch.Tensor, host_tokens: torch.Tensor) -> list[tuple[int, int, int]]:
    """(device_start, host_start, length) of the maximal runs consecutive on both sides."""
    d = device_tokens.cpu()
    h = host_tokens.cpu()
    n = d.numel()
    if n == 0:
        return []
    brk = ((d[1:] - d[:-1]) != 1) | ((h[1:] - h[:-1]) != 1)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), brk.nonzero().flatten() + 1])
    ends = torch.cat([starts[1:], torch.tensor([n])])
    return list(zip(d[starts].tolist(), h[starts].tolist(), (ends - starts).tolist(), strict=True))


# A piece of a run: ("tok", d0, h0, n), ("pages", d0, page0, n_pages) or ("slot", d0, page, slot0, n).
_Piece = tuple[Literal["tok", "pages"], int, int, int] | tuple[Literal["slot"], int, int, int, int]


def _pieces(run: tuple[int, int, int], page_size: int, paged: bool, max_pages: int = 1 << 62) -> Iterator[_Piece]:
    """Cut one run into pieces a single strided copy can move (at most `max_pages` pages' worth).

    Yields ("tok", d0, h0, n) for layouts whose pages follow each other in memory, and for the others
    ("slot", d0, page, slot0, n) within one page or ("pages", d0, page0, n_pages) for whole pages.
    """
    d0, h0, n = run
    if not paged:
        most = max_pages * page_size
        while n:
            step = min(n, most)
            yield ("tok", d0, h0, step)
            d0, h0, n = d0 + step, h0 + step, n - step
        return
    while n:
        page, slot = divmod(h0, page_size)
        if slot == 0 and n >= page_size:
            whole = min(n // page_size, max_pages)
            yield ("pages", d0, page, whole)
            step = whole * page_size
        else:
            step = min(n, page_size - slot)
            yield ("slot", d0, page, slot, step)
        d0, h0, n = d0 + step, h0 + step, n - step


def _numpy_rows(t: torch.Tensor, row_bytes: int) -> np.ndarray:
    """`t` (last dim contiguous) as a numpy array whose items are opaque rows of its last dimension."""
    a = t.view(torch.uint8).numpy()
    return a.view(np.dtype((np.void, row_bytes)))[..., 0]


_stage = threading.local()


def _staged_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst <- src through a per-thread staging buffer: first a copy in src's memory order (both sides
    sequential), then one in dst's order (numpy iterates in the destination's order), so the scattered
    side of a transposition is read from cache rather than DRAM."""
    order = sorted(range(src.ndim), key=lambda i: -abs(src.strides[i]))
    buf = getattr(_stage, "buf", None)
    if buf is None or buf.dtype != src.dtype or buf.size < src.size:
        buf = _stage.buf = np.empty(src.size, dtype=src.dtype)
    stage = buf[: src.size].reshape([src.shape[i] for i in order])
    np.copyto(stage, src.transpose(order), casting="no")
    np.copyto(dst, stage.transpose(sorted(range(src.ndim), key=lambda i: order[i])), casting="no")


def copy_runs(
    plan: TransferPlan, *, to_host: bool, copier: str = "torch", runs: list[tuple[int, int, int]] | None = None
) -> None:
    """Move the plan's tokens run by run (see module docstring); falls back to one gather/scatter pass
    when the runs are so short that per-run overhead would cost more than that pass.

    copier: "torch" (copy_ on views), "numpy" (np.copyto on the same views, rows as opaque items;
    CPU tensors only) or "staged" (numpy, through a staging buffer)."""
    geom = plan.geometry
    if runs is None:
        runs = find_runs(plan.device_tokens, plan.host_tokens)
    n_tok = plan.device_tokens.numel()
    # ~5 us of Python per run and component against a ~0.5 GB/s gather/scatter of the same bytes.
    if len(runs) > 16 and len(runs) * geom.n_kv * 5e-6 > n_tok * geom.bytes_per_token / 0.5e9:
        copy_gather(plan, to_host=to_host)
        return
    ps = geom.page_size
    token_views = [host_token_view(c) for c in plan.host]
    paged = token_views[0] is None
    on_cpu = plan.device[0].device.type == "cpu" and plan.host[0].device.type == "cpu"
    max_pages = 1 << 62
    if copier in ("numpy", "staged") and on_cpu:
        devs, hosts, toks = plan.device, plan.host, token_views
        row = geom.row_bytes
        D = geom.head_dim
        if all(t.stride(-2) == D for t in (*devs, *hosts)):  # whole (H*D) rows are contiguous
            devs = [t.flatten(-2) for t in devs]
            hosts = [t.flatten(-2) for t in hosts]
            toks = [None if t is None else t.flatten(-2) for t in toks]
            row *= geom.heads_per_rank
        np_devs = [_numpy_rows(d, row) for d in devs]
        np_hosts = [_numpy_rows(c, row) for c in hosts]
        np_toks = [None if tv is None else _numpy_rows(tv, row) for tv in toks]

        def np_split(a: np.ndarray, n: int) -> np.ndarray:  # (L, n*ps, H) -> (L, n, ps, H), a view
            return a.reshape(a.shape[0], n, ps, *a.shape[2:])

        np_move: Callable[[np.ndarray, np.ndarray], None]
        if copier == "staged":
            np_move = _staged_copy
            max_pages = max(1, STAGE_BYTES // (geom.component_bytes or 1))
        else:

            def np_move(dst: np.ndarray, src: np.ndarray) -> None:
                np.copyto(dst, src, casting="no")

        pools_np = _Pools(np_devs, np_hosts, np_toks, np_split, np_move)
        _move_pieces(pools_np, runs, ps, paged, max_pages, geom.n_kv, to_host=to_host)
        return

    def split(a: torch.Tensor, n: int) -> torch.Tensor:
        return torch.unflatten(a, 1, (n, ps))

    def move(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    pools = _Pools(plan.device, plan.host, token_views, split, move)
    _move_pieces(pools, runs, ps, paged, max_pages, geom.n_kv, to_host=to_host)


# The run-based path's arrays: torch tensors, or numpy arrays of opaque rows over the same memory.
_Rows = TypeVar("_Rows", np.ndarray, torch.Tensor)


@dataclass
class _Pools(Generic[_Rows]):
    """Per-component views of both pools, and how to cut and copy them, for one kind of array."""

    device: list[_Rows]  # (L, tokens, ...)
    host: list[_Rows]  # canonical (L, page_num, page_size, ...)
    host_tokens: list[_Rows | None]  # (L, size, ...) where host pages follow each other in memory
    split: Callable[[_Rows, int], _Rows]  # (L, n*ps, ...) -> (L, n, ps, ...), a view
    move: Callable[[_Rows, _Rows], None]  # dst <- src


def _move_pieces(
    pools: _Pools[_Rows],
    runs: list[tuple[int, int, int]],
    ps: int,
    paged: bool,
    max_pages: int,
    n_kv: int,
    *,
    to_host: bool,
) -> None:
    for run in runs:
        for piece in _pieces(run, ps, paged, max_pages):
            for c in range(n_kv):
                dev, host, tok = pools.device[c], pools.host[c], pools.host_tokens[c]
                if piece[0] == "tok":
                    _, d0, h0, n = piece
                    assert tok is not None  # "tok" pieces only come for pools with a token view
                    dv, hv = dev[:, d0 : d0 + n], tok[:, h0 : h0 + n]
                elif piece[0] == "pages":
                    _, d0, p0, n = piece
                    dv, hv = pools.split(dev[:, d0 : d0 + n * ps], n), host[:, p0 : p0 + n]
                else:
                    _, d0, p, s0, n = piece
                    dv, hv = dev[:, d0 : d0 + n], host[:, p, s0 : s0 + n]
                if to_host:
                    pools.move(hv, dv)
                else:
                    pools.move(dv, hv)


def copy_gather(plan: TransferPlan, *, to_host: bool) -> None:
    """One gather and one scatter per component with advanced indexing (any devices)."""
    ps = plan.geometry.page_size
    for dev, host in zip(plan.device, plan.host, strict=True):
        d = plan.device_tokens.to(dev.device)
        h = plan.host_tokens.to(host.device)
        p, s = h // ps, h % ps
        if to_host:
            host[:, p, s] = dev.index_select(1, d).to(host.device)
        else:
            dev.index_copy_(1, d, host[:, p, s].to(dev.device))


__all__ = [
    "BACKENDS",
    "CPU_COPIER",
    "TransferPlan",
    "backup",
    "copy_gather",
    "copy_runs",
    "find_runs",
    "load",
    "plan_transfer",
    "resolve_backend",
]
