"""Pool geometry and the canonical views every kernel works on (FACTS §3).

Every host layout, MHA or MLA, is presented as one strided view per K/V component of shape
``(L, page_num, page_size, H, D)`` -- the *canonical view* -- so that token ``t`` of layer ``l``,
head ``h`` is ``view[l, t // page_size, t % page_size, h]`` whatever the layout. The device pool
(layer-first, ``(L, tokens, H, D)`` per component) is used as it is. MLA is the one-component case
with ``H == 1`` and ``D == kv_cache_dim``.

The canonical *order* of a page's bytes -- component, layer, slot, head, then the row of D
elements -- is the order of these views, which is also the ``page_first_direct`` order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hicache_ops.sglang.host_pool import LAYOUTS, check_layout_for

MHA_HOST_DIMS = {
    "layer_first": "(2, L, size, H, D)",
    "page_first": "(2, size, L, H, D)",
    "page_first_direct": "(2, page_num, L, page_size, H, D)",
    "page_head": "(2, page_num, H, page_size, L, D)",
}
MLA_HOST_DIMS = {
    "layer_first": "(L, size, 1, C)",
    "page_first": "(size, L, 1, C)",
    "page_first_direct": "(page_num, L, page_size, 1, C)",
}


@dataclass(frozen=True)
class PageGeometry:
    """What one page of KV is: per component (K, V; MLA has one) L x page_size x H x D items."""

    num_layers: int
    page_size: int
    head_num: int
    head_dim: int
    dtype: torch.dtype
    mla: bool = False

    def __post_init__(self) -> None:
        if min(self.num_layers, self.page_size, self.head_num, self.head_dim) <= 0:
            raise ValueError(f"page geometry must be positive, got {self}")
        if self.mla and self.head_num != 1:
            raise ValueError(f"an MLA page has one head (latent row), got head_num={self.head_num}")

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
        return self.num_layers * self.page_size * self.head_num * self.row_bytes

    @property
    def page_bytes(self) -> int:
        return self.n_kv * self.component_bytes

    @property
    def token_bytes(self) -> int:
        """Bytes per token across all layers and components (SGLang's size_per_token)."""
        return self.n_kv * self.num_layers * self.head_num * self.row_bytes


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


def host_canonical(host: torch.Tensor, layout: str, *, mla: bool, page_size: int) -> list[torch.Tensor]:
    """One (L, page_num, page_size, H, D) view of `host` per component (no copy)."""
    check_layout_for(layout, mla=mla)
    dims = MLA_HOST_DIMS if mla else MHA_HOST_DIMS
    want = 4 if mla else 5
    if layout in ("page_first_direct", "page_head"):
        want += 1
    shape = tuple(host.shape)
    if host.dim() != want or (not mla and shape[0] != 2):
        raise ValueError(f"a {'MLA' if mla else 'MHA'} {layout} host pool is {dims[layout]}; got shape {shape}.")
    comps = [host] if mla else [host[0], host[1]]
    out = []
    for c in comps:
        if layout in ("layer_first", "page_first"):
            if layout == "page_first":
                c = c.transpose(0, 1)
            size = c.shape[1]
            if size % page_size:
                raise ValueError(f"host pool size {size} is not a multiple of page_size {page_size}.")
            c = c.unflatten(1, (size // page_size, page_size))
        elif layout == "page_first_direct":
            c = c.transpose(0, 1)
        else:  # page_head: (page_num, H, page_size, L, D)
            c = c.permute(3, 0, 2, 1, 4)
        if c.shape[2] != page_size:
            raise ValueError(f"the {layout} host pool has page size {c.shape[2]}, not {page_size}.")
        if c.stride(-1) != 1:
            raise ValueError("the host pool's last dimension (head_dim) must be contiguous.")
        out.append(c)
    return out


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


__all__ = ["LAYOUTS", "PageGeometry", "host_canonical", "host_token_view", "pool_geometry", "split_device"]
