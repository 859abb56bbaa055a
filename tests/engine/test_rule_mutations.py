"""Engine behaviour that pins SGLang's constants (issue 22's mutations): the in-flight limit's
factor per version, the 0.5.23 retry budget, the prefetch host eviction size and LFU order.
The expected values are SGLang's as docs/controller.md states them (#in-flight-limit,
#host-eviction, #eviction-policies); each test fails when the engine's constant or rule drifts."""

from __future__ import annotations

import numpy as np
import pytest

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.engine.scheduler import WaveStats, run_wave
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import ObjectKeyScheme

PS = 4


def _prompt(k: int, pages: int = 16) -> np.ndarray:
    return np.arange(pages * PS + 1, dtype=np.int64) + 10_000 * (k + 1)


def _reader_with_stored(version: str, prompts: int, **cfg):
    l3 = MemoryL3([ObjectKeyScheme(version)], 64)
    writer = TieredCache(
        CacheConfig(page_size=PS, device_pages=64, host_pages=200, sglang_version=version), AccountingPlane(64), l3
    )
    for k in range(prompts):
        writer.request(_prompt(k), [1])
        writer.flush()
    base = dict(page_size=PS, device_pages=20, host_pages=100, prefetch_threshold=PS, sglang_version=version)
    base.update(cfg)
    return TieredCache(CacheConfig(**base), AccountingPlane(64), l3)


# 64-token prefetches. 0.5.14: limit 0.8 x (400 - 80) = 256 tokens: 4 go out (0, 64, 128, 192 in
# flight), the 5th finds 256 >= 256. 0.5.23: limit 0.5 x 400 = 200: also 4 (192 < 200), the 5th
# refused. A factor of 0.9 (0.5.14: 288) lets a 5th out; 0.45 (0.5.23: 180) refuses the 4th.
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_in_flight_limit_factor(version):
    reader = _reader_with_stored(version, 6)
    arrivals = [reader.arrive(_prompt(k), [1]) for k in range(6)]
    issued = [a.result.prefetch.issued for a in arrivals]
    assert issued == [True, True, True, True, False, False], issued
    assert reader.in_flight_tokens == 4 * 64


# The engine's counts on SGLang's constants (every 8 passes, at most 8 attempts), per decode
# length: (re-issues, re-issues that went out). 4 attempts change the first (10, 2), 4 passes the
# second (10, 4). Misses are re-queried too and the due step follows SGLang's pop_ready
# (tests/engine/test_miss_requery.py checks the steps against SGLang's StoragePrefetchRetries).
@pytest.mark.parametrize("decode, expected", [(200, (18, 2)), (30, (7, 4))])
def test_retry_budget_0_5_23(decode, expected):
    """Rate-limited prefetches of requests that wait (running requests decode `decode` tokens) are
    re-issued every 8 scheduler passes, at most 8 times (docs/controller.md#in-flight-limit)."""
    reader = _reader_with_stored("0.5.23", 8, device_pages=80, host_pages=100)
    stats = WaveStats()
    run_wave(reader, [(_prompt(k), np.arange(decode) + 7) for k in range(8)], stats)
    assert (stats.retried, stats.retried_issued) == expected


def test_prefetch_host_eviction_asks_for_the_whole_hit():
    """0.5.23 asks host eviction for the whole hit of a prefetch, only the shortfall of a backup;
    0.5.14 for the whole allocation in both cases (docs/controller.md#host-eviction)."""
    assert pol.host_eviction_pages("0.5.23", 8, 4, prefetch=True) == 8
    assert pol.host_eviction_pages("0.5.23", 8, 4, prefetch=False) == 4
    assert pol.host_eviction_pages("0.5.14", 8, 4, prefetch=False) == 8


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_lfu_keeps_the_hot_prompt(version):
    """A prompt served three times and a newer one served once; an unrelated prompt needs room:
    LFU evicts the newer, colder one (LRU would evict the hot one)."""
    cache = TieredCache(
        CacheConfig(page_size=PS, device_pages=12, host_pages=40, sglang_version=version, eviction_policy="lfu"),
        AccountingPlane(64),
    )
    # The cold prompt is as long as the other's allocation demand (its pages + a page, evicted
    # whole through 0.5.16), so taking it alone makes the room.
    hot, cold, other = _prompt(0, 4), _prompt(1, 6), _prompt(2, 4)
    for _ in range(3):
        cache.request(hot, [1])
    cache.request(cold, [1])
    cache.request(other, [1])
    assert cache.request(hot, [1]).device_hit == 16
