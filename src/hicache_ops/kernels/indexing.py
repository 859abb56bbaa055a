"""What the transfer, checksum and Triton modules share: index sets, bounds, words and tiles.

Index sets are 1-D int64 tensors of token numbers; page p of a pool is its tokens
p*page_size .. p*page_size+page_size-1, on either side. Rows are moved and hashed as
integer words, so no float value is ever interpreted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

UNITS = ("token", "page")
# Tokens per Triton program (a power of two).
DEFAULT_TILE = 16
WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}

# An index set as callers give one: a tensor, a numpy array, a range or any iterable of ints.
IndexSet: TypeAlias = torch.Tensor | npt.NDArray[Any] | Iterable[int]


def as_index(x: IndexSet, name: str) -> torch.Tensor:
    """A 1-D int64 tensor from a tensor, numpy array, range or sequence of ints."""
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    else:
        t = torch.as_tensor(list(x) if not isinstance(x, range) else x, dtype=torch.int64)
    if t.dim() != 1:
        t = t.reshape(-1)
    if t.dtype != torch.int64:
        if t.is_floating_point() or t.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got {t.dtype}.")
        t = t.to(torch.int64)
    return t


def check_unit(unit: str) -> str:
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}.")
    return unit


def pages_to_tokens(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    slots = torch.arange(page_size, dtype=torch.int64, device=pages.device)
    return (pages[:, None] * page_size + slots).reshape(-1)


def check_in_range(idx: torch.Tensor, limit: int, name: str) -> None:
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= limit:
        raise IndexError(f"{name} must lie in [0, {limit}); got values from {lo} to {hi}.")


def as_words(t: torch.Tensor, word: int) -> torch.Tensor:
    """`t`'s bytes as signed integers of `word` bytes (its last dimension must hold whole words)."""
    return t.view(torch.uint8).view(WORD_DTYPES[word])


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def check_tile(tile: int) -> int:
    if tile <= 0 or tile & (tile - 1):
        raise ValueError(f"tile must be a positive power of two, got {tile}.")
    return tile


__all__ = [
    "DEFAULT_TILE",
    "UNITS",
    "WORD_DTYPES",
    "as_index",
    "as_words",
    "check_in_range",
    "check_tile",
    "check_unit",
    "next_pow2",
    "pages_to_tokens",
]
