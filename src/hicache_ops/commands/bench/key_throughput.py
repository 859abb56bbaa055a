"""Page-key throughput, ours beside SGLang's own get_hash_str, measured in one run.

Both sides hash the same token ids (a uint32-valued int array, whole pages). The runs are
interleaved (ours, SGLang's, ours, ...; the first side alternates) so a noisy neighbour on a
shared machine hurts both alike, and each side's median run counts. A throughput figure means
nothing unless both sides computed the same keys: a difference is refused (CheckFailed).
A stop request (Ctrl-C, hicache_ops/interrupt.py) ends the loop between runs: the medians then
cover the runs finished so far, and the result says it was interrupted.
"""

from __future__ import annotations

import statistics
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hicache_ops import interrupt
from hicache_ops.errors import CheckFailed
from hicache_ops.sglang.page_keys import native_available, page_keys
from hicache_ops.sglang.versions import V0_5_23


@dataclass
class KeyBenchResult:
    tokens: int
    page_size: int
    repeats: int  # runs requested; the medians cover len(ours_seconds) of them
    ours_seconds: list[float]
    sglang_seconds: list[float] | None
    sglang_error: str | None
    native: bool
    interrupted: bool = False

    @property
    def runs_done(self) -> int:
        return len(self.ours_seconds)

    @property
    def ours_tokens_per_s(self) -> float:
        return self.tokens / statistics.median(self.ours_seconds)

    @property
    def sglang_tokens_per_s(self) -> float | None:
        if self.sglang_seconds is None:
            return None
        return self.tokens / statistics.median(self.sglang_seconds)

    @property
    def ratio(self) -> float | None:
        theirs = self.sglang_tokens_per_s
        return None if theirs is None else self.ours_tokens_per_s / theirs

    def to_json(self) -> dict:
        return {
            "tokens": self.tokens,
            "page_size": self.page_size,
            "repeats": self.runs_done,
            "repeats_requested": self.repeats,
            "interrupted": self.interrupted,
            "statistic": "median",
            "native": self.native,
            "ours_tokens_per_s": self.ours_tokens_per_s,
            "sglang_tokens_per_s": self.sglang_tokens_per_s,
            "ratio": self.ratio,
            "ours_seconds": self.ours_seconds,
            "sglang_seconds": self.sglang_seconds,
            # Only a run whose keys matched is reported (see require_same_keys).
            "same_keys": True if self.sglang_seconds is not None else None,
            "sglang_error": self.sglang_error,
        }


def _sglang_get_hash_str():
    """SGLang 0.5.23's own function, or the reason it cannot run here."""
    try:
        from sglang.srt.mem_cache.utils import get_hash_str
    except Exception as exc:  # not installed, or its imports fail on this host
        return None, f"sglang is not importable: {type(exc).__name__}: {exc}"
    return get_hash_str, None


def require_same_keys(ours: Sequence[str], theirs: Sequence[str]) -> None:
    """Raise CheckFailed naming the first page where the two key lists differ."""
    theirs = list(theirs)
    if list(ours) == theirs:
        return
    for index, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        if mine != other:
            raise CheckFailed(
                f"hicache and SGLang computed different keys from page {index} on "
                f"({mine[:16]}… vs {other[:16]}…); the timings would compare different work, so none is reported."
            )
    raise CheckFailed(
        f"hicache computed {len(ours)} page keys and SGLang {len(theirs)}; "
        "the timings would compare different work, so none is reported."
    )


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


RunProgress = Callable[[int, int, float, float | None], None]  # (runs done, runs, ours s, sglang s)


def bench_page_keys(
    tokens: int = 4_194_304, page_size: int = 64, repeats: int = 5, seed: int = 0, progress: RunProgress | None = None
) -> KeyBenchResult:
    """Time both sides `repeats` times; a stop request ends the loop after the run in progress."""
    n = (tokens // page_size) * page_size
    ids = np.random.default_rng(seed).integers(0, 150_000, size=n, dtype=np.int64)
    # SGLang takes an array.array of int64 without a Python-level conversion: its fastest input.
    ids_array = array("q", ids.tobytes())

    get_hash_str, error = _sglang_get_hash_str()
    if get_hash_str is not None:
        try:
            get_hash_str(ids_array[: page_size * 2], None, page_size=page_size)  # builds the extension
        except Exception as exc:
            get_hash_str, error = None, f"SGLang's native hash failed: {type(exc).__name__}: {exc}"

    def ours():
        return page_keys(ids, page_size, V0_5_23)

    def theirs():
        return get_hash_str(ids_array, None, page_size=page_size)

    ours_seconds: list[float] = []
    sglang_seconds: list[float] = []
    interrupted = False
    for run in range(repeats):
        if interrupt.requested():
            interrupted = True
            break
        sides = [(ours, ours_seconds)]
        if get_hash_str is not None:
            sides.append((theirs, sglang_seconds))
        if run % 2:
            sides.reverse()
        outputs = []
        for fn, seconds in sides:
            elapsed, keys = _timed(fn)
            seconds.append(elapsed)
            outputs.append(keys)
        if len(outputs) == 2:
            require_same_keys(*outputs)
        if progress is not None:
            progress(run + 1, repeats, ours_seconds[-1], sglang_seconds[-1] if sglang_seconds else None)
    if not ours_seconds:  # stopped before the first run ended: no figure to report
        raise interrupt.Interrupted(
            f"bench keys stopped on {interrupt.reason()} before its first run ended: nothing was measured."
        )

    return KeyBenchResult(
        tokens=n,
        page_size=page_size,
        repeats=repeats,
        ours_seconds=ours_seconds,
        sglang_seconds=sglang_seconds if get_hash_str is not None else None,
        sglang_error=error,
        native=native_available(),
        interrupted=interrupted,
    )
