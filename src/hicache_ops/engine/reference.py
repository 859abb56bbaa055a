"""The reference prefill: a page's KV bytes as a deterministic function of its page key.

Element (kv, layer, slot, head, dim) of a page is a 64-bit mix of the page key's first 64 bits
and the element's index in the full-model canonical order (2, L, page_size, H_total, D) — MLA:
(L, page_size, 1, C) — truncated to the stored item size. A rank's page is its heads' slice of
that order, so every rank's bytes differ and every copy in every tier can be checked against a
fresh computation. Values are raw bit patterns (NaN patterns included): compare bytes, never floats.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from hicache_ops.sglang.geometry import ModelGeometry

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_UINT_BY_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: a bijective scramble of 64-bit words."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def reference_page(
    storage_key: str, geometry: ModelGeometry, page_size: int, tp_rank: int = 0, tp_size: int = 1
) -> np.ndarray:
    """One rank's page in canonical order as unsigned ints of the stored item size.

    MHA: shape (2, L, page_size, H_rank, D); MLA: (L, page_size, 1, C), the same on every rank.
    """
    seed = np.uint64(int(storage_key[:16], 16))
    L = geometry.layers
    with np.errstate(over="ignore"):
        if geometry.mla:
            C = geometry.kv_cache_dim
            idx = np.arange(L * page_size * C, dtype=np.uint64).reshape(L, page_size, 1, C)
        else:
            H_total, D = geometry.kv_heads, geometry.head_dim
            h_rank = geometry.heads_per_rank(tp_size)
            kv = np.arange(2, dtype=np.uint64).reshape(2, 1, 1, 1, 1)
            layer = np.arange(L, dtype=np.uint64).reshape(1, L, 1, 1, 1)
            slot = np.arange(page_size, dtype=np.uint64).reshape(1, 1, page_size, 1, 1)
            # With fewer KV heads than ranks, SGLang replicates heads: rank r holds head r*H//tp.
            first = (tp_rank * H_total) // tp_size if h_rank * tp_size > H_total else tp_rank * h_rank
            head = (np.arange(h_rank, dtype=np.uint64) + np.uint64(first)).reshape(1, 1, 1, h_rank, 1)
            dim = np.arange(D, dtype=np.uint64).reshape(1, 1, 1, 1, D)
            idx = (((kv * np.uint64(L) + layer) * np.uint64(page_size) + slot) * np.uint64(H_total) + head) * np.uint64(
                D
            ) + dim
        words = _mix(idx * _GOLDEN + seed)
    return words.astype(_UINT_BY_SIZE[geometry.itemsize])


def side_object_bytes(geometry: ModelGeometry) -> int:
    """The size of every side-pool object in the engine (docs/side-pools.md#side-objects-in-the-engine):
    one token's row of every layer, `layers * kv_cache_dim * itemsize`. The embedded models have no
    side host pools of their own, so a small fixed rule stands in for their layouts."""
    return geometry.layers * geometry.kv_cache_dim * geometry.itemsize


def reference_side_object(storage_key: str, suffix: str, size: int) -> np.ndarray:
    """A side-pool object's bytes as a deterministic function of its page key and its suffix (the
    suffix names the rank where the pool is per rank, so ranks differ where their objects do)."""
    seed = np.uint64(int(storage_key[:16], 16)) ^ np.uint64(
        int.from_bytes(hashlib.blake2b(suffix.encode(), digest_size=8).digest(), "little")
    )
    with np.errstate(over="ignore"):
        words = _mix(np.arange(-(-size // 8), dtype=np.uint64) * _GOLDEN + seed)
    return words.view(np.uint8)[:size]
