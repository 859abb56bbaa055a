"""`hicache bench store`: our StoreClient's batch put/get beside raw Mooncake calls, in one process.

An embedded master and one segment-owning client; the same registered buffers, the same batch
shapes (default 256 x 256 KiB and 64 x 4 MiB), rounds interleaved (ours then raw, raw then ours,
...) so both sides see the same machine. Puts write fresh keys each round (Mooncake's put does
not overwrite) and the round's keys are removed afterwards, untimed. Ratio = our throughput /
raw throughput from the median round of each side; the goal is >= 0.95.
A stop request (Ctrl-C, hicache_ops/interrupt.py) ends the run between rounds: the figures then
cover the rounds finished so far (a case may have puts and no gets), marked interrupted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.errors import CheckFailed, SettingError
from hicache_ops.results import Result

DEFAULT_CASES: tuple[tuple[int, int], ...] = ((256, 256 * 1024), (64, 4 * 1024 * 1024))
GOAL = 0.95

# (case number, cases, objects, phase "put" or "get", timed rounds done, rounds)
RoundProgress = Callable[[int, int, int, str, int, int], None]


@dataclass
class CaseResult:
    count: int
    size: int
    put_ours_s: list[float] = field(default_factory=list)
    put_raw_s: list[float] = field(default_factory=list)
    get_ours_s: list[float] = field(default_factory=list)
    get_raw_s: list[float] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.count * self.size

    def _gbps(self, times: list[float]) -> float | None:
        """None for a phase an interrupt left without a timed round."""
        return self.nbytes / statistics.median(times) / 1e9 if times else None

    def result(self) -> StoreCase:
        put_ours, put_raw = self._gbps(self.put_ours_s), self._gbps(self.put_raw_s)
        get_ours, get_raw = self._gbps(self.get_ours_s), self._gbps(self.get_raw_s)
        return StoreCase(
            objects=self.count,
            object_bytes=self.size,
            batch_bytes=self.nbytes,
            rounds=len(self.put_ours_s),
            get_rounds=len(self.get_ours_s),
            put_ours_gbps=put_ours,
            put_raw_gbps=put_raw,
            put_ratio=put_ours / put_raw if put_ours is not None and put_raw is not None else None,
            get_ours_gbps=get_ours,
            get_raw_gbps=get_raw,
            get_ratio=get_ours / get_raw if get_ours is not None and get_raw is not None else None,
        )


class StoreCase(Result):
    objects: int = Field(description="objects per batch")
    object_bytes: int = Field(description="bytes per object")
    batch_bytes: int = Field(description="bytes per batch")
    rounds: int = Field(description="timed put rounds finished")
    get_rounds: int = Field(description="timed get rounds finished")
    put_ours_gbps: float | None = Field(description="our batch_put_from, GB/s (median round)")
    put_raw_gbps: float | None = Field(description="raw MooncakeDistributedStore.batch_put_from, GB/s")
    put_ratio: float | None = Field(description="ours / raw for puts; `null` when no put round finished")
    get_ours_gbps: float | None = Field(description="our batch_get_into, GB/s (median round)")
    get_raw_gbps: float | None = Field(description="raw batch_get_into, GB/s")
    get_ratio: float | None = Field(description="ours / raw for gets; `null` when no get round finished")


class StoreBenchResult(Result):
    """`hicache bench store --json`."""

    rounds: int = Field(description="timed rounds asked for per case and phase (--repeats)")
    segment_bytes: int = Field(description="bytes of the segment the client mounted")
    cases: list[StoreCase] = Field(description="one entry per case measured")
    min_ratio: float = Field(description="the lowest ratio over every case and phase")
    goal: float = Field(description="the ratio a run should reach")
    meets_goal: bool = Field(description="min_ratio >= goal")
    interrupted: bool = Field(description="a stop request ended the rounds early")


def bench_store(
    cases: Sequence[tuple[int, int]] = DEFAULT_CASES, *, rounds: int = 21, progress: RoundProgress | None = None
) -> StoreBenchResult:
    """Measure every (objects, bytes per object) case, with ratios.
    `progress` hears of each timed round."""
    import numpy as np

    from hicache_ops.mooncake.master import EmbeddedMaster
    from hicache_ops.mooncake.store_client import StoreClient, check_fits_in_memory

    if rounds < 1 or not cases or any(c < 1 or s < 1 for c, s in cases):
        raise SettingError("repeats", "and every case's object count and size must be >= 1.")
    largest = max(c * s for c, s in cases)
    # Room for one round of both sides plus the get set, with head-room under the eviction watermark.
    segment = max(64 << 20, 4 * largest)
    check_fits_in_memory(segment + 2 * largest, f"--case {largest // 2**20} MiB per batch (segment and buffers)")
    results: list[CaseResult] = []
    interrupted = False
    with EmbeddedMaster() as master:
        client = StoreClient.connect(master.rpc_address, segment_size=segment)
        try:
            raw = client.raw
            src = np.random.default_rng(0).integers(0, 256, size=largest, dtype=np.uint8)
            dst = np.zeros(largest, dtype=np.uint8)
            client.register_buffer(src.ctypes.data, src.nbytes)
            client.register_buffer(dst.ctypes.data, dst.nbytes)
            for number, (count, size) in enumerate(cases, 1):
                if interrupt.requested():
                    interrupted = True
                    break
                res = CaseResult(count, size)
                results.append(res)
                ptrs = [src.ctypes.data + i * size for i in range(count)]
                outs = [dst.ctypes.data + i * size for i in range(count)]
                sizes = [size] * count
                tag = f"hicache-bench/{count}x{size}/"
                # Puts: fresh keys per round and side; one untimed warm-up round.
                for r in range(rounds + 1):
                    if interrupt.requested():
                        break
                    ours_keys = [f"{tag}put/ours/{r}/{i}" for i in range(count)]
                    raw_keys = [f"{tag}put/raw/{r}/{i}" for i in range(count)]
                    put_sides = [("ours", ours_keys), ("raw", raw_keys)]
                    if r % 2:
                        put_sides.reverse()
                    for side, keys in put_sides:
                        t0 = time.perf_counter()
                        codes = (
                            client.batch_put_from(keys, ptrs, sizes)
                            if side == "ours"
                            else raw.batch_put_from(keys, ptrs, sizes)
                        )
                        elapsed = time.perf_counter() - t0
                        if any(c != 0 for c in codes):
                            raise CheckFailed(f"bench put ({side}) failed: codes {sorted(set(codes))}.")
                        if r:
                            (res.put_ours_s if side == "ours" else res.put_raw_s).append(elapsed)
                    client.remove_prefix(f"{tag}put/", force=True)
                    if r and progress is not None:
                        progress(number, len(cases), count, "put", r, rounds)
                if interrupt.requested():
                    interrupted = True
                    break
                # Gets: one set of objects, read by both sides in turn.
                get_keys = [f"{tag}get/{i}" for i in range(count)]
                codes = client.batch_put_from(get_keys, ptrs, sizes)
                if any(c != 0 for c in codes):
                    raise CheckFailed(f"bench get set-up failed: codes {sorted(set(codes))}.")
                for r in range(rounds + 1):
                    if interrupt.requested():
                        interrupted = True
                        break
                    get_sides = ["ours", "raw"] if r % 2 == 0 else ["raw", "ours"]
                    for side in get_sides:
                        dst[: count * size] = 0
                        t0 = time.perf_counter()
                        got = (
                            client.batch_get_into(get_keys, outs, sizes)
                            if side == "ours"
                            else raw.batch_get_into(get_keys, outs, sizes)
                        )
                        elapsed = time.perf_counter() - t0
                        if any(g != size for g in got):
                            raise CheckFailed(f"bench get ({side}) failed: results {sorted(set(got))[:4]}.")
                        if r:
                            (res.get_ours_s if side == "ours" else res.get_raw_s).append(elapsed)
                    if r and progress is not None:
                        progress(number, len(cases), count, "get", r, rounds)
                if interrupted:
                    break
                if not np.array_equal(dst[: count * size], src[: count * size]):
                    raise CheckFailed("bench get read back other bytes than were written.")
                client.remove_prefix(f"{tag}get/", force=True)
        finally:
            client.close()
    cases_json = [r.result() for r in results if r.put_ours_s]
    if not cases_json:  # stopped before any timed round: no figure to report
        raise interrupt.Interrupted(
            f"bench store stopped on {interrupt.reason()} before its first timed round ended: nothing was measured."
        )
    ratios = [r for c in cases_json for r in (c.put_ratio, c.get_ratio) if r is not None]
    worst = min(ratios)
    return StoreBenchResult(
        rounds=rounds,
        segment_bytes=segment,
        cases=cases_json,
        min_ratio=worst,
        goal=GOAL,
        meets_goal=worst >= GOAL,
        interrupted=interrupted,
    )
