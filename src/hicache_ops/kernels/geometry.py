"""Pool geometry and the canonical views every kernel works on.

Every host layout, MHA or MLA, is presented as one strided view per K/V component of shape
``(L, page_num, page_size, H, D)`` -- the *canonical view* -- so that token ``t`` of layer ``l``,
head ``h`` is ``view[l, t // page_size, t % page_size, h]`` whatever the layout. The layouts' buffers
and the order that maps each onto this view come from one table, ``hicache_ops.sglang.host_pool``
(``MHA_HOST_BUFFERS`` / ``MLA_HOST_BUFFERS``; docs/host-pool.md#mha-buffer-shapes). The device pool
(layer-first, ``(L, tokens, H, D)`` per component) is used as it is. MLA is the one-component case
with ``H == 1`` and ``D == kv_cache_dim``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hicache_ops.errors import InputError
from hicache_ops.sglang.host_pool import (
    HEAD_DIM,
    HEADS_PER_RANK,
    LAYERS,
    MLA_HOST_BUFFERS,
    PAGE_SIZE,
    SIZE,
    host_buffer_dims,
)


@dataclass(frozen=True)
class PageGeometry:
    """What one page of KV on one rank is: per component (K, V; MLA has one) layers x page_size x
    heads_per_rank x head_dim items. Field names are ModelGeometry's and HostPoolLayout's."""

    layers: int
    page_size: int
    heads_per_rank: int
    head_dim: int
    dtype: torch.dtype
    mla: bool = False

    def __post_init__(self) -> None:
        if min(self.layers, self.page_size, self.heads_per_rank, self.head_dim) <= 0:
            raise ValueError(f"page geometry must be positive, got {self}")
        if self.mla and self.heads_per_rank != 1:
            raise ValueError(f"an MLA page has one head (latent row), got heads_per_rank={self.heads_per_rank}")

    @property
    def n_kv(self) -> int:
        return 1 if self.mla else 2

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def row_bytes(self) -> int:
        """Bytes of one (layer, token, head) row: the unit every layout keeps contiguous."""
        return self.head_dim * self.itemsize

    @property
    def component_bytes(self) -> int:
        """Bytes of one component (K or V, or the MLA latent) of one page: one L3 object."""
        return self.layers * self.page_size * self.heads_per_rank * self.row_bytes

    @property
    def bytes_per_page(self) -> int:
        return self.n_kv * self.component_bytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token across all layers and components (SGLang's size_per_token)."""
        return self.n_kv * self.layers * self.heads_per_rank * self.row_bytes


def split_device(device: torch.Tensor | Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], bool]:
    """The device pool as a list of (L, tokens, H, D) components and whether it is MLA.

    MHA: a pair ``(k, v)`` of (L, tokens, H, D) tensors, or one (2, L, tokens, H, D) tensor.
    MLA: one (L, tokens, 1, C) tensor.
    """
    if isinstance(device, torch.Tensor):
        if device.dim() == 4:
            if device.shape[2] != 1:
                raise ValueError(
                    f"a single 4-D device tensor is an MLA pool (L, tokens, 1, C); got shape {tuple(device.shape)}. "
                    "For MHA pass (k, v)."
                )
            return [device], True
        if device.dim() == 5 and device.shape[0] == 2:
            return [device[0], device[1]], False
        raise ValueError(
            f"device pool shape {tuple(device.shape)} is neither MLA (L, tokens, 1, C) nor MHA (2, L, tokens, H, D)."
        )
    parts = list(device)
    if len(parts) != 2 or not all(isinstance(p, torch.Tensor) for p in parts):
        raise ValueError("an MHA device pool is a pair (k, v) of (L, tokens, H, D) tensors.")
    k, v = parts
    if k.dim() != 4 or k.shape != v.shape or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(
            f"device k and v must be (L, tokens, H, D) tensors of one shape, dtype and device; got "
            f"{tuple(k.shape)} {k.dtype} {k.device} and {tuple(v.shape)} {v.dtype} {v.device}."
        )
    return [k, v], False


def host_is_mla(host: torch.Tensor, layout: str) -> bool:
    """Whether `host` is an MLA buffer of `layout`, told by its rank (MHA's has the K/V dim more)."""
    buf = MLA_HOST_BUFFERS.get(layout)
    return buf is not None and host.dim() == len(buf.dims)


def host_canonical(host: torch.Tensor, layout: str, *, mla: bool, page_size: int) -> list[torch.Tensor]:
    """One (L, page_num, page_size, H, D) view of `host` per component (no copy)."""
    buf = host_buffer_dims(layout, mla=mla)
    shape = tuple(host.shape)
    if host.dim() != len(buf.dims) or (not mla and shape[0] != 2):
        raise ValueError(f"a {'MLA' if mla else 'MHA'} {layout} host pool is {buf.describe()}; got shape {shape}.")
    comps = [host] if mla else [host[0], host[1]]
    out = []
    for c in comps:
        if SIZE in buf.component_dims:
            at = buf.component_dims.index(SIZE)
            size = c.shape[at]
            if size % page_size:
                raise ValueError(f"host pool size {size} is not a multiple of page_size {page_size}.")
            c = torch.unflatten(c, at, (size // page_size, page_size))
        c = c.permute(buf.canonical_order)
        if c.shape[2] != page_size:
            raise ValueError(f"the {layout} host pool has page size {c.shape[2]}, not {page_size}.")
        if c.stride(-1) != 1:
            raise ValueError("the host pool's last dimension (head_dim) must be contiguous.")
        out.append(c)
    return out


def page_object_view(layout: str, geometry: PageGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """How to read one component of one page from its L3 object bytes (as SGLang's zero-copy path
    sends it from a `layout` host pool): the shape to view the bytes as (rows as row_bytes bytes)
    and the permutation that turns it into a canonical (L, page_size, H, row_bytes) page."""
    buf = host_buffer_dims(layout, mla=geometry.mla)
    if buf.page_object_dims is None:
        raise InputError(
            f"a {layout} host pool has no one-object-per-page L3 form (SGLang stores it per layer).",
            hint="Use page_first, page_first_direct or page_head.",
        )
    g = geometry
    sizes = {LAYERS: g.layers, PAGE_SIZE: g.page_size, HEADS_PER_RANK: g.heads_per_rank, HEAD_DIM: g.row_bytes}
    return tuple(sizes[d] for d in buf.page_object_dims), buf.page_object_order


def host_token_view(canon: torch.Tensor) -> torch.Tensor | None:
    """(L, size, H, D) view of a canonical view when pages follow each other in memory (layer_first,
    page_first), else None."""
    if canon.stride(1) == canon.shape[2] * canon.stride(2):
        return canon.flatten(1, 2)
    return None


def pool_geometry(
    device: torch.Tensor | Sequence[torch.Tensor], host: torch.Tensor, layout: str, page_size: int
) -> tuple[PageGeometry, list[torch.Tensor], list[torch.Tensor]]:
    """Validate a device/host pool pair; return the page geometry, device components and host views."""
    dev, mla = split_device(device)
    canon = host_canonical(host, layout, mla=mla, page_size=page_size)
    L, _, H, D = dev[0].shape
    cL, _, _, cH, cD = canon[0].shape
    if (L, H, D) != (cL, cH, cD) or host.dtype != dev[0].dtype:
        raise ValueError(
            f"device pool (L={L}, H={H}, D={D}, {dev[0].dtype}) and {layout} host pool "
            f"(L={cL}, H={cH}, D={cD}, {host.dtype}) do not hold the same model."
        )
    for d in dev:
        if d.stride(-1) != 1:
            raise ValueError("the device pool's last dimension (head_dim) must be contiguous.")
    return PageGeometry(L, page_size, H, D, host.dtype, mla), dev, canon


__all__ = [
    "PageGeometry",
    "host_canonical",
    "host_is_mla",
    "host_token_view",
    "page_object_view",
    "pool_geometry",
    "split_device",
]
