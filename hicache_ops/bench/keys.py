"""Page-key throughput, ours beside SGLang's own get_hash_str, measured in one run.

Both sides hash the same token ids (a uint32-valued int array, whole pages) and must return
the same keys; each side is timed `repeats` times, interleaved, and the best run counts so a
noisy neighbour on a shared machine hurts both alike.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass

import numpy as np

from ..sglang.keys import native_available, page_keys
from ..sglang.versions import V0_5_23


@dataclass
class KeyBenchResult:
    tokens: int
    page_size: int
    repeats: int
    ours_tokens_per_s: float
    sglang_tokens_per_s: float | None
    sglang_error: str | None
    native: bool
    same_keys: bool | None

    @property
    def ratio(self) -> float | None:
        if self.sglang_tokens_per_s is None:
            return None
        return self.ours_tokens_per_s / self.sglang_tokens_per_s

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens,
            "page_size": self.page_size,
            "repeats": self.repeats,
            "native": self.native,
            "ours_tokens_per_s": self.ours_tokens_per_s,
            "sglang_tokens_per_s": self.sglang_tokens_per_s,
            "ratio": self.ratio,
            "same_keys": self.same_keys,
            "sglang_error": self.sglang_error,
        }


def _sglang_get_hash_str():
    """SGLang 0.5.23's own function, or the reason it cannot run here."""
    try:
        from sglang.srt.mem_cache.utils import get_hash_str
    except Exception as exc:  # not installed, or its imports fail on this host
        return None, f"sglang is not importable: {type(exc).__name__}: {exc}"
    return get_hash_str, None


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def bench_page_keys(tokens: int = 4_194_304, page_size: int = 64, repeats: int = 5, seed: int = 0) -> KeyBenchResult:
    n = (tokens // page_size) * page_size
    ids = np.random.default_rng(seed).integers(0, 150_000, size=n, dtype=np.int64)
    # SGLang takes an array.array of int64 without a Python-level conversion: its fastest input.
    ids_array = array("q", ids.tobytes())

    get_hash_str, error = _sglang_get_hash_str()
    theirs_keys = None
    theirs_best = float("inf")
    if get_hash_str is not None:
        try:
            get_hash_str(ids_array[: page_size * 2], None, page_size=page_size)  # builds the extension
        except Exception as exc:
            get_hash_str, error = None, f"SGLang's native hash failed: {type(exc).__name__}: {exc}"

    ours_best = float("inf")
    ours_keys = None
    for _ in range(repeats):  # interleaved, best of each
        t, ours_keys = _best(lambda: page_keys(ids, page_size, V0_5_23), 1)
        ours_best = min(ours_best, t)
        if get_hash_str is not None:
            t, theirs_keys = _best(lambda: get_hash_str(ids_array, None, page_size=page_size), 1)
            theirs_best = min(theirs_best, t)

    return KeyBenchResult(
        tokens=n,
        page_size=page_size,
        repeats=repeats,
        ours_tokens_per_s=n / ours_best,
        sglang_tokens_per_s=(n / theirs_best) if get_hash_str is not None else None,
        sglang_error=error,
        native=native_available(),
        same_keys=(list(theirs_keys) == ours_keys) if theirs_keys is not None else None,
    )
