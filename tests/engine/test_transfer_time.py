"""Issue 22, divergence 6: modelled transfer time makes the stop policies bind
(docs/controller.md#transfer-time, #stop-policies, #timeout-budget).

A 200-page prompt (page size 4, 64 bytes a page) is in L3 only; the reader's L3 reads run at a
configured bandwidth, in SGLang's 128-page batches whose pages count when the batch ends
(managers/cache_controller.py `_page_transfer`, both versions). The first admission check comes
`admission_s` (0.05 s) after the issue.

- 0.5.23 at 8192 B/s: batch 1 ends at 1.0 s, batch 2 at 1.5625 s. `timeout`'s budget is
  1.0 + 0.25 x 800/1024 = 1.195 s from the first check that finds the read unfinished (0.05 s),
  so it runs out at 1.245 s with batch 1 in: 128 pages.
- 0.5.14 at 4096 B/s: batches end at 2.0 s and 3.125 s; the budget min(30, 2.0 + 0.1 x 800/1024)
  = 2.078 s runs from the issue: 128 pages.
- best_effort takes what has arrived at the first check (nothing); wait_complete waits for all.
Without a bandwidth (the default) every read is in at once and no policy cuts.
"""

from __future__ import annotations

import numpy as np
import pytest

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.engine.scheduler import Scheduler, WaveStats, run_wave
from hicache_ops.sglang.page_keys import ObjectKeyScheme

PS, PAGE_BYTES, PAGES = 4, 64, 200
PROMPT = np.arange(PAGES * PS + 1, dtype=np.int64) + 5000
BANDWIDTH = {"0.5.23": 8192.0, "0.5.14": 4096.0}
EXPECTED_PAGES = {"best_effort": 0, "timeout": 128, "wait_complete": PAGES}


def _reader(version: str, stop_policy: str, **cfg) -> TieredCache:
    l3 = MemoryL3([ObjectKeyScheme(version)], PAGE_BYTES)
    writer = TieredCache(
        CacheConfig(page_size=PS, device_pages=256, host_pages=400, sglang_version=version),
        AccountingPlane(PAGE_BYTES),
        l3,
    )
    writer.request(PROMPT, [1])
    base = dict(
        page_size=PS,
        device_pages=256,
        host_pages=400,
        sglang_version=version,
        stop_policy=stop_policy,
        l3_bandwidth_bytes_s=BANDWIDTH[version],
    )
    base.update(cfg)
    return TieredCache(CacheConfig(**base), AccountingPlane(PAGE_BYTES), l3)


@pytest.mark.parametrize("policy", sorted(EXPECTED_PAGES))
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_stop_policies_cut_a_slow_prefetch_under_the_scheduler_clock(version, policy):
    reader = _reader(version, policy)
    stats = WaveStats()
    (result,) = run_wave(reader, [(PROMPT, np.array([7]))], stats)
    pages = EXPECTED_PAGES[policy]
    assert result.prefetch.issued and result.prefetch.hit_pages == PAGES
    assert result.prefetch.completed_pages == pages
    assert result.storage_hit == pages * PS
    assert result.computed == (PAGES - pages) * PS + 1
    if pages < PAGES:
        assert f"{policy} stopped waiting after" in result.prefetch.reason
    else:
        assert result.prefetch.reason == ""
    assert reader.in_flight_tokens == 0 and reader.host.used == reader.occupancy()["pages_on_host"]


@pytest.mark.parametrize("policy", sorted(EXPECTED_PAGES))
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_stop_policies_cut_a_slow_prefetch_of_a_lone_request(version, policy):
    result = _reader(version, policy).request(PROMPT, [7])
    assert result.storage_hit == EXPECTED_PAGES[policy] * PS


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_scheduler_clock_moves_to_the_cut(version):
    """timeout: the request waits (skipped, nothing else runs) until its budget runs out; the
    clock then stands just past it, not at the read's end."""
    reader = _reader(version, "timeout")
    scheduler = Scheduler(reader)
    arrival = scheduler.submit(PROMPT, [7])
    while not scheduler.idle:
        scheduler.step()
    hold_end = 1.0 + 0.25 * 800 / 1024 + 0.05 if version == "0.5.23" else 2.0 + 0.1 * 800 / 1024
    assert hold_end < arrival.result.prefetch.deadline_s + 0.05 + 1e-6
    assert arrival.result.prefetch.deadline_s < (1.5625 if version == "0.5.23" else 3.125)
    assert arrival.result.prefetch.timeout_would_cut


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_without_a_bandwidth_no_policy_cuts(version):
    for policy in EXPECTED_PAGES:
        reader = _reader(version, policy, l3_bandwidth_bytes_s=None)
        (result,) = run_wave(reader, [(PROMPT, np.array([7]))])
        assert result.storage_hit == PAGES * PS


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_a_per_batch_latency_alone_makes_best_effort_cut(version):
    """No bandwidth limit, 0.5 s a batch (the `--inject-l3-latency-ms` kind of delay)."""
    reader = _reader(version, "best_effort", l3_bandwidth_bytes_s=None, l3_latency_s=0.5)
    (result,) = run_wave(reader, [(PROMPT, np.array([7]))])
    assert result.storage_hit == 0
    reader = _reader(version, "wait_complete", l3_bandwidth_bytes_s=None, l3_latency_s=0.5)
    (result,) = run_wave(reader, [(PROMPT, np.array([7]))])
    assert result.storage_hit == PAGES * PS


def test_best_effort_takes_what_arrived_while_the_request_queued():
    """The admission loop asks a request's prefetch to stop before it checks device room
    (get_new_batch_prefill), and stops at the first request the device cannot hold. A request
    behind such a head is not asked until the head is admitted: by then (the first request
    decodes 100 passes of 0.02 s) its whole read is in (0.5.23, 8192 B/s: 1.5625 s). A request
    asked on the pass it cannot be admitted keeps what had arrived then: nothing."""
    reader = _reader("0.5.23", "best_effort", device_pages=260)
    first = np.arange(40 * PS + 1, dtype=np.int64) + 900_000  # 66 device pages with its output
    big = np.arange(195 * PS + 1, dtype=np.int64) + 800_000  # 197: not beside the first
    results = run_wave(reader, [(first, np.arange(100) + 7), (big, np.array([7])), (PROMPT, np.array([7]))])
    assert [r.storage_hit for r in results] == [0, 0, PAGES * PS]
    reader = _reader("0.5.23", "best_effort", device_pages=260)
    results = run_wave(reader, [(first, np.arange(100) + 7), (PROMPT, np.array([7]))])
    assert [r.storage_hit for r in results] == [0, 0]


# -- L3 write visibility ---------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_an_l3_write_is_visible_when_it_ends(version):
    """Instances A, B and C share an L3 at 256 B/s. A computes an 8-page prompt at its first pass
    (0.05 s); its write_through host copy is acknowledged then and the L3 write of 512 bytes ends
    at 2.05 s. B's request for the prompt arriving at 1.0 s misses (B's own write of it ends after
    3 s); C's at 2.1 s finds the 8 pages (and waits the 2 s their read takes)."""
    l3 = MemoryL3([ObjectKeyScheme(version)], PAGE_BYTES)
    cfg = dict(
        page_size=PS,
        device_pages=64,
        host_pages=128,
        prefetch_threshold=PS,
        sglang_version=version,
        l3_bandwidth_bytes_s=256.0,
        stop_policy="wait_complete",
    )
    a = Scheduler(TieredCache(CacheConfig(**cfg), AccountingPlane(PAGE_BYTES), l3))
    prompt = np.arange(8 * PS + 1, dtype=np.int64) + 70_000
    a.submit(prompt, [7])

    def reader_at(when: float):
        while a.clock < when:
            a.step()
        cache = TieredCache(CacheConfig(**cfg), AccountingPlane(PAGE_BYTES), l3)
        cache.advance_clock(a.clock)
        scheduler = Scheduler(cache)
        arrival = scheduler.submit(prompt, [7])
        while not scheduler.idle:
            scheduler.step()
        return arrival

    early = reader_at(1.0)
    assert a.cache.stats.l3_objects_written == 0
    late = reader_at(2.1)
    assert early.result.storage_hit == 0 and early.result.prefetch.reason == "no page of the suffix is in L3"
    assert late.result.storage_hit == 8 * PS
    assert a.cache.stats.l3_objects_written == 16
