"""Per-page checksums that do not depend on where or how a page is stored.

Definition (version 1). A page's bytes are read in canonical order: component (K then V; MLA has
one), layer, slot, head, then the head_dim row -- the page_first_direct order, which is also the
order of SGLang's L3 object bytes for that layout. Each row is cut into little-endian words of
w = 4 bytes (2 or 1 when the row length in bytes is not a multiple of 4); word w_i (i counts words
over the whole page from 0) is read as a signed integer and sign-extended to 64 bits. Then, mod 2**64,

    key_i = fmix64(i + KEY_SEED) | 1
    acc   = sum_i key_i * w_i
    sum   = fmix64(acc ^ (n_words * GOLDEN))

with fmix64 MurmurHash3's 64-bit finaliser. Every key is odd, so changing any single word (any
byte) always changes the checksum, and moving content to another position changes it with
probability ~1 - 2**-64. The sum is a plain sum over positions, so a GPU computes it in any memory
order; the same page gives the same value in L1, in L2 in every layout and in its L3 objects.

Values are returned as int64 tensors holding the uint64 bit pattern; ``checksum_hex`` formats them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeAlias

import numpy as np
import torch

from hicache_ops.errors import InputError
from hicache_ops.kernels.geometry import PageGeometry, host_canonical, host_is_mla, page_object_view, split_device
from hicache_ops.kernels.indexing import (
    DEFAULT_TILE,
    IndexSet,
    as_index,
    as_words,
    check_in_range,
    check_unit,
    pages_to_tokens,
)

CHECKSUM_VERSION = 1
KEY_SEED = 0x243F6A8885A308D3
GOLDEN = 0x9E3779B97F4A7C15
C1 = 0xFF51AFD7ED558CCD
C2 = 0xC4CEB9FE1A85EC53
MASK64 = (1 << 64) - 1

_TARGET_WORDS = 1 << 17


def _signed(x: int) -> int:
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def canonical_word_bytes(row_bytes: int) -> int:
    return 4 if row_bytes % 4 == 0 else 2 if row_bytes % 2 == 0 else 1


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def fmix64(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's fmix64 on int64 tensors holding uint64 bit patterns (wrapping arithmetic)."""
    x = x ^ _lsr(x, 33)
    x = x * _signed(C1)
    x = x ^ _lsr(x, 33)
    x = x * _signed(C2)
    return x ^ _lsr(x, 33)


def finalize(acc: torch.Tensor, n_words: int) -> torch.Tensor:
    return fmix64(acc ^ _signed(n_words * GOLDEN))


_KEYS: dict[tuple[int, str], torch.Tensor] = {}


def _keys(n_words: int, device: torch.device) -> torch.Tensor:
    k = (n_words, str(device))
    keys = _KEYS.get(k)
    if keys is None:  # safe from several threads: at worst two compute the same table
        i = torch.arange(n_words, dtype=torch.int64, device=device) + _signed(KEY_SEED)
        keys = fmix64(i) | 1
        if len(_KEYS) > 8:
            _KEYS.clear()
        _KEYS[k] = keys
    return keys


def _torch_acc(
    get: Callable[[int, int, int], torch.Tensor], n_pages: int, n_comp: int, like: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """acc (n_pages,) and n_words with torch. `get(c, start, stop)` returns component c of pages
    start..stop-1 as an (n, L, page_size, H, D) tensor (any strides, last dimension contiguous);
    `like` is one such tensor (for shape, dtype and device). Works through chunks of about
    _TARGET_WORDS words so the int64 temporaries stay in cache."""
    _, L, ps, H, D = like.shape
    row_bytes = D * like.element_size()
    word = canonical_word_bytes(row_bytes)
    dw = row_bytes // word
    comp_words = L * ps * H * dw
    keys = _keys(comp_words * n_comp, like.device).view(n_comp, L, ps, H, dw)
    pages_per_chunk = max(1, _TARGET_WORDS // comp_words)
    layers_per_chunk = L if pages_per_chunk > 1 else max(1, _TARGET_WORDS // (ps * H * dw))
    acc = torch.zeros(n_pages, dtype=torch.int64, device=like.device)
    for s in range(0, n_pages, pages_per_chunk):
        e = min(n_pages, s + pages_per_chunk)
        for c in range(n_comp):
            words = as_words(get(c, s, e), word)
            for l0 in range(0, L, layers_per_chunk):
                part = words[:, l0 : l0 + layers_per_chunk]
                part = part.to(torch.int64, memory_format=torch.contiguous_format)
                part.mul_(keys[c, l0 : l0 + layers_per_chunk])
                acc[s:e] += part.sum(dim=(1, 2, 3, 4))
    return acc, comp_words * n_comp


def _use_triton(backend: str, t: torch.Tensor) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}.")
    if backend == "triton":
        if t.device.type != "cuda" and not os.environ.get("TRITON_INTERPRET"):
            raise ValueError("backend 'triton' needs CUDA tensors (or TRITON_INTERPRET=1 on the CPU).")
        return True
    return backend == "auto" and t.device.type == "cuda"


def _triton_acc(components: list[torch.Tensor], tokens: torch.Tensor, **kw: int) -> tuple[torch.Tensor, int]:
    """acc and n_words as `_torch_acc` gives them, from the Triton kernel."""
    from hicache_ops.kernels import _triton

    first = components[0]
    word = canonical_word_bytes(first.shape[-1] * first.element_size())
    return _triton.keyed_word_sums(components, tokens, word=word, key_seed=KEY_SEED, c1=C1, c2=C2, **kw)


def _page_tokens(indices: IndexSet, page_size: int, unit: str) -> torch.Tensor:
    idx = as_index(indices, "indices")
    if check_unit(unit) == "page":
        return pages_to_tokens(idx, page_size)
    if idx.numel() % page_size:
        raise ValueError(f"{idx.numel()} token indices do not make whole pages of {page_size}.")
    return idx


def device_page_checksums(
    device: torch.Tensor | Sequence[torch.Tensor],
    indices: IndexSet,
    *,
    page_size: int,
    unit: str = "token",
    backend: str = "auto",
    tile: int = DEFAULT_TILE,
) -> torch.Tensor:
    """Checksums (int64, one per page) of pages of the layer-first device pool.

    indices: token indices, page_size per page in slot order (unit="token"), or device page numbers
    (unit="page": page q is tokens q*page_size ...).
    """
    comps, _ = split_device(device)
    tokens = _page_tokens(indices, page_size, unit)
    check_in_range(tokens, comps[0].shape[1], "device token indices")
    n = tokens.numel() // page_size
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=comps[0].device)
    if _use_triton(backend, comps[0]):
        return finalize(*_triton_acc(comps, tokens, page_size=page_size, src_page=1, tile=tile))
    tokens = tokens.to(comps[0].device)
    per_page = tokens.view(n, page_size)
    firsts = per_page[:, 0]
    runs = bool((per_page == firsts[:, None] + torch.arange(page_size, device=tokens.device)).all())
    starts = firsts.tolist() if runs else None

    def get(c: int, s: int, e: int) -> torch.Tensor:
        if starts is not None and e - s == 1:
            return comps[c][:, starts[s] : starts[s] + page_size].unsqueeze(0)
        rows = comps[c].index_select(1, tokens[s * page_size : e * page_size])
        return torch.unflatten(rows, 1, (e - s, page_size)).transpose(0, 1)

    acc, n_words = _torch_acc(get, n, len(comps), get(0, 0, 1))
    return finalize(acc, n_words)


def host_page_checksums(
    host: torch.Tensor,
    indices: IndexSet,
    *,
    layout: str,
    page_size: int,
    unit: str = "token",
    backend: str = "auto",
    tile: int = DEFAULT_TILE,
) -> torch.Tensor:
    """Checksums (int64, one per page) of pages of a host pool in `layout` (MHA or MLA, told apart by
    the buffer's rank). indices as in ``device_page_checksums``, in host token/page numbers."""
    canon = host_canonical(host, layout, mla=host_is_mla(host, layout), page_size=page_size)
    tokens = _page_tokens(indices, page_size, unit)
    check_in_range(tokens, canon[0].shape[1] * page_size, "host token indices")
    n = tokens.numel() // page_size
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=host.device)
    if _use_triton(backend, host):
        return finalize(*_triton_acc(canon, tokens, page_size=page_size, src_page=page_size, tile=tile))
    tokens = tokens.to(host.device)
    per_page = tokens.view(n, page_size)
    slots = torch.arange(page_size, device=host.device)
    first = per_page[:, 0]
    aligned = bool((first % page_size == 0).all()) and bool((per_page == first[:, None] + slots).all())
    page_ids = first // page_size
    page_list = page_ids.tolist() if aligned else None
    p_idx, s_idx = tokens // page_size, tokens % page_size

    def get(c: int, s: int, e: int) -> torch.Tensor:
        if page_list is not None:  # the pages are whole and aligned
            if e - s == 1:
                return canon[c][:, page_list[s]].unsqueeze(0)
            return canon[c].index_select(1, page_ids[s:e]).transpose(0, 1)
        sl = slice(s * page_size, e * page_size)
        return torch.unflatten(canon[c][:, p_idx[sl], s_idx[sl]], 1, (e - s, page_size)).transpose(0, 1)

    acc, n_words = _torch_acc(get, n, len(canon), get(0, 0, 1))
    return finalize(acc, n_words)


def canonical_page_checksums(pages: torch.Tensor) -> torch.Tensor:
    """Checksums of pages given in canonical order, shape (n, components, L, page_size, H, D)
    (MHA: components 2; MLA: components 1 and H 1). Computed with torch on the tensor's device."""
    if pages.dim() != 6:
        raise ValueError(f"canonical pages are (n, components, L, page_size, H, D); got shape {tuple(pages.shape)}.")
    if pages.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=pages.device)
    if pages.stride(-1) != 1:
        pages = pages.contiguous()
    acc, n_words = _torch_acc(lambda c, s, e: pages[s:e, c], pages.shape[0], pages.shape[1], pages[:1, 0])
    return finalize(acc, n_words)


# One L3 object's bytes as storage_page_checksum takes them.
PageObject: TypeAlias = torch.Tensor | bytes | bytearray | memoryview


def _object_tensor(obj: PageObject, nbytes: int) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().reshape(-1).view(torch.uint8) if obj.is_contiguous() else obj.contiguous().view(torch.uint8)
    else:
        t = torch.from_numpy(np.frombuffer(obj, dtype=np.uint8).copy())
    t = t.reshape(-1)
    if t.numel() != nbytes:
        raise InputError(f"an L3 object of this page geometry holds {nbytes} bytes; got {t.numel()}.")
    return t


def storage_page_checksum(objects: Sequence[PageObject], *, layout: str, geometry: PageGeometry) -> int:
    """Checksum of one page from its L3 object bytes (as SGLang's zero-copy path writes them from a host
    pool in `layout`): MHA ``[k_bytes, v_bytes]``, MLA ``[kv_bytes]``; each a bytes-like object or a
    tensor. Returns the checksum as an unsigned int."""
    g = geometry
    shape, order = page_object_view(layout, g)
    objs = list(objects)
    if len(objs) != g.n_kv:
        raise InputError(f"a {'MLA' if g.mla else 'MHA'} page has {g.n_kv} L3 object(s); got {len(objs)}.")
    comps = [_object_tensor(obj, g.component_bytes).view(shape).permute(order).unsqueeze(0) for obj in objs]
    acc, n_words = _torch_acc(lambda c, s, e: comps[c], 1, len(comps), comps[0])
    return int(finalize(acc, n_words)[0]) & MASK64


def checksum_hex(values: torch.Tensor | Sequence[int]) -> list[str]:
    """16-digit lowercase hex of each checksum (the uint64 value)."""
    vals = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    return [f"{int(v) & MASK64:016x}" for v in vals]


__all__ = [
    "CHECKSUM_VERSION",
    "canonical_page_checksums",
    "checksum_hex",
    "device_page_checksums",
    "host_page_checksums",
    "storage_page_checksum",
]
