"""Triton kernels: the token copy between the device pool and any host layout, and the page checksum.

Both kernels address every pool through the same five strides of its canonical view
(layer, page, slot, head, word): token t sits at page t // PS, slot t % PS, where PS is the host
pool's page size, or 1 for the device pool (there the "page" stride is the token stride). One
kernel therefore serves every layout, both directions, MHA and MLA; a launch moves one component
(K, V, or the MLA latent). Rows are moved as the widest integer word that divides the row and
every stride, so no float value is ever interpreted. The checksum kernel computes the keyed word
sum that kernels/checksum.py defines; that module owns the constants and passes them in.

Imported lazily (only when the Triton path runs), so importing hicache_ops.kernels needs no Triton.
On the CPU the kernels run under TRITON_INTERPRET=1, which must be set before Triton is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hicache_ops.kernels.geometry import PageGeometry
from hicache_ops.kernels.indexing import as_words, check_tile, next_pow2


@triton.jit
def _copy_kernel(
    src,
    dst,
    src_idx,
    dst_idx,
    n_tokens,
    s_l,
    s_p,
    s_s,
    s_h,
    d_l,
    d_p,
    d_s,
    d_h,
    SRC_PS: tl.constexpr,
    DST_PS: tl.constexpr,
    H: tl.constexpr,
    DW: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < n_tokens
    si = tl.load(src_idx + t, mask=tmask, other=0).to(tl.int64)
    di = tl.load(dst_idx + t, mask=tmask, other=0).to(tl.int64)
    src_row = layer * s_l + (si // SRC_PS) * s_p + (si % SRC_PS) * s_s
    dst_row = layer * d_l + (di // DST_PS) * d_p + (di % DST_PS) * d_s
    for h in tl.static_range(H):
        for d0 in tl.static_range(0, DW, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            m = tmask[:, None] & (d < DW)[None, :]
            x = tl.load(src + (src_row + h * s_h)[:, None] + d[None, :], mask=m)
            tl.store(dst + (dst_row + h * d_h)[:, None] + d[None, :], x, mask=m)


@triton.jit
def _fmix64(x, C1: tl.constexpr, C2: tl.constexpr):
    x ^= x >> 33
    x *= C1
    x ^= x >> 33
    x *= C2
    x ^= x >> 33
    return x


@triton.jit
def _checksum_kernel(
    src,
    tok_idx,
    out,
    out_row_stride,
    word_base,
    s_l,
    s_p,
    s_s,
    s_h,
    PAGE: tl.constexpr,
    SRC_PS: tl.constexpr,
    H: tl.constexpr,
    DW: tl.constexpr,
    N_TILES: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    KEY_SEED: tl.constexpr,
    C1: tl.constexpr,
    C2: tl.constexpr,
):
    pid = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    page = pid // N_TILES
    tile = pid % N_TILES
    s = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    smask = s < PAGE
    t = tl.load(tok_idx + page * PAGE + s, mask=smask, other=0).to(tl.int64)
    row = layer * s_l + (t // SRC_PS) * s_p + (t % SRC_PS) * s_s
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.uint64)
    for h in tl.static_range(H):
        for d0 in tl.static_range(0, DW, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            m = smask[:, None] & (d < DW)[None, :]
            w = tl.load(src + (row + h * s_h)[:, None] + d[None, :], mask=m, other=0)
            w = w.to(tl.int64).to(tl.uint64, bitcast=True)
            i = word_base + ((layer * PAGE + s) * H + h) * DW
            i = (i[:, None] + d[None, :]).to(tl.uint64, bitcast=True)
            key = _fmix64(i + KEY_SEED, C1, C2) | 1
            acc += w * key
    total = tl.sum(tl.sum(acc, axis=1), axis=0)
    tl.store(out + page * out_row_stride + layer * N_TILES + tile, total.to(tl.int64, bitcast=True))


def _word_bytes(*tensors: torch.Tensor, row_bytes: int) -> int:
    """Widest word dividing the row, every stride and every base address."""
    for w in (8, 4, 2, 1):
        if row_bytes % w:
            continue
        ok = True
        for t in tensors:
            isz = t.element_size()
            if t.data_ptr() % w or any((st * isz) % w for st in t.stride()[:-1]):
                ok = False
                break
        if ok:
            return w
    return 1


def copy_tokens(
    device: list[torch.Tensor],
    host: list[torch.Tensor],
    device_tokens: torch.Tensor,
    host_tokens: torch.Tensor,
    *,
    geometry: PageGeometry,
    to_host: bool,
    tile: int,
) -> None:
    """Copy token rows between device components (L, N, H, D) and canonical host views
    (L, P, page_size, H, D). One launch per component: grid (token tiles, layers)."""
    tile = check_tile(tile)
    geom = geometry
    target = device[0].device
    d_idx = device_tokens.to(target)
    h_idx = host_tokens.to(target)
    n = d_idx.numel()
    for dev, hst in zip(device, host, strict=True):
        word = _word_bytes(dev, hst, row_bytes=geom.row_bytes)
        dw = geom.row_bytes // word
        dv = as_words(dev, word)  # (L, N, H, DW)
        hv = as_words(hst, word)  # (L, P, PS, H, DW)
        dev_strides = (dv.stride(0), dv.stride(1), 0, dv.stride(2))
        host_strides = (hv.stride(0), hv.stride(1), hv.stride(2), hv.stride(3))
        heads, row = geom.heads_per_rank, dw
        if dv.stride(2) == dw and hv.stride(3) == dw:  # heads follow each other: one wide row
            heads, row = 1, geom.heads_per_rank * dw
        block_d = min(next_pow2(row), max(16, 4096 // (word * tile)))
        if to_host:
            src, dst, si, di, ss, ds, sps, dps = dv, hv, d_idx, h_idx, dev_strides, host_strides, 1, geom.page_size
        else:
            src, dst, si, di, ss, ds, sps, dps = hv, dv, h_idx, d_idx, host_strides, dev_strides, geom.page_size, 1
        grid = (triton.cdiv(n, tile), geom.layers)
        _copy_kernel[grid](
            src, dst, si, di, n, *ss, *ds,
            SRC_PS=sps, DST_PS=dps, H=heads, DW=row, BLOCK_T=tile, BLOCK_D=block_d,
        )  # fmt: skip


def keyed_word_sums(
    components: list[torch.Tensor],
    tokens: torch.Tensor,
    *,
    page_size: int,
    src_page: int,
    word: int,
    tile: int,
    key_seed: int,
    c1: int,
    c2: int,
) -> tuple[torch.Tensor, int]:
    """Per page whose tokens are `tokens` (n_pages * page_size, page by page): the sum mod 2**64 of
    key_i * w_i over the page's `word`-byte words w_i in canonical order, with
    key_i = fmix64(i + key_seed) | 1 (fmix64's multipliers c1, c2); and the words per page.

    components: per component either a device pool (L, N, H, D) (`src_page` 1) or a canonical host
    view (L, P, page_size, H, D) (`src_page` = page_size).
    """
    tile = check_tile(min(tile, next_pow2(page_size)))
    first = components[0]
    L, H, D = first.shape[0], first.shape[-2], first.shape[-1]
    dw = D * first.element_size() // word
    n_pages = tokens.numel() // page_size
    n_tiles = triton.cdiv(page_size, tile)
    idx = tokens.to(first.device)
    out = torch.empty((n_pages, len(components) * L * n_tiles), dtype=torch.int64, device=first.device)
    comp_words = L * page_size * H * dw
    for c, comp in enumerate(components):
        v = as_words(comp, word)
        if src_page == 1:
            strides = (v.stride(0), v.stride(1), 0, v.stride(2))
        else:
            strides = (v.stride(0), v.stride(1), v.stride(2), v.stride(3))
        heads, row = H, dw
        if strides[3] == dw:
            heads, row = 1, H * dw
        block_d = min(next_pow2(row), max(16, 4096 // (8 * tile)))
        grid = (n_pages * n_tiles, L)
        _checksum_kernel[grid](
            v, idx, out[:, c * L * n_tiles :], out.stride(0), c * comp_words, *strides,
            PAGE=page_size, SRC_PS=src_page, H=heads, DW=row, N_TILES=n_tiles, BLOCK_T=tile, BLOCK_D=block_d,
            KEY_SEED=key_seed, C1=c1, C2=c2,
        )  # fmt: skip
    return out.sum(dim=1), len(components) * comp_words
