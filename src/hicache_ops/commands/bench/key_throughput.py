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
from typing import Literal

import numpy as np
from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.errors import CheckFailed
from hicache_ops.results import Result
from hicache_ops.sglang.page_keys import native_available, page_keys
from hicache_ops.sglang.versions import V0_5_23


class KeyBenchResult(Result):
    """`hicache bench keys --json`."""

    tokens: int = Field(description="tokens hashed per run (whole pages)")
    page_size: int = Field(description="tokens per page")
    repeats: int = Field(description="runs finished: the medians cover these")
    repeats_requested: int = Field(description="runs asked for (--repeats)")
    interrupted: bool = Field(description="a stop request ended the runs early")
    statistic: Literal["median"] = Field("median", description="how the runs are summarised")
    native: bool = Field(description="our native page-hash loop was used")
    ours_tokens_per_s: float = Field(description="hicache's page keys, tokens per second (median run)")
    sglang_tokens_per_s: float | None = Field(description="SGLang's get_hash_str, `null` when it could not run")
    ratio: float | None = Field(description="ours / SGLang's, `null` without SGLang")
    ours_seconds: list[float] = Field(description="each run's seconds, ours")
    sglang_seconds: list[float] | None = Field(description="each run's seconds, SGLang's")
    same_keys: bool | None = Field(
        description="both sides computed the same keys (only such a run is reported); `null` without SGLang"
    )
    sglang_error: str | None = Field(description="why SGLang's side did not run, else `null`")


# SGLang's get_hash_str as called here: (token ids, prior hash, page_size=...) -> one key per page.
_GetHashStr = Callable[..., list[str]]


def _sglang_get_hash_str() -> tuple[_GetHashStr | None, str | None]:
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


def _timed(fn: Callable[[], Sequence[str]]) -> tuple[float, Sequence[str]]:
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

    def ours() -> list[str]:
        return page_keys(ids, page_size, V0_5_23)

    def theirs() -> list[str]:
        assert get_hash_str is not None  # timed only when SGLang's side runs
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
        outputs: list[Sequence[str]] = []
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

    ours_rate = n / statistics.median(ours_seconds)
    sglang_rate = n / statistics.median(sglang_seconds) if get_hash_str is not None else None
    return KeyBenchResult(
        tokens=n,
        page_size=page_size,
        repeats=len(ours_seconds),
        repeats_requested=repeats,
        interrupted=interrupted,
        native=native_available(),
        ours_tokens_per_s=ours_rate,
        sglang_tokens_per_s=sglang_rate,
        ratio=None if sglang_rate is None else ours_rate / sglang_rate,
        ours_seconds=ours_seconds,
        sglang_seconds=sglang_seconds if get_hash_str is not None else None,
        same_keys=True if get_hash_str is not None else None,
        sglang_error=error,
    )
