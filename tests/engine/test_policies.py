"""The tiered cache's decisions (docs/controller.md), in accounting mode: same code as the real-bytes mode."""

from __future__ import annotations

import numpy as np
import pytest

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.errors import InputError
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.policy import TimeoutBudget

PS = 4


def make(l3=True, tp=1, latency=0.0, **kw) -> TieredCache:
    cfg = CacheConfig(**{"page_size": PS, "device_pages": 8, "host_pages": 17, "prefetch_threshold": 8, **kw})
    schemes = [ObjectKeyScheme(cfg.sglang_version, tp_rank=r, tp_size=tp) for r in range(tp)]
    return TieredCache(cfg, AccountingPlane(64), MemoryL3(schemes, 64, latency) if l3 else None)


def prompt(seed: int, n: int) -> np.ndarray:
    return np.arange(seed * 10_000, seed * 10_000 + n)


def breakdown(r):
    assert r.device_hit + r.host_hit + r.storage_hit + r.computed == r.prompt_tokens
    return (r.device_hit, r.host_hit, r.storage_hit, r.computed)


def test_breakdown_adds_up_and_device_hit_on_repeat():
    cache = make()
    assert breakdown(cache.prefill(prompt(1, 18))) == (0, 0, 0, 18)
    assert breakdown(cache.prefill(prompt(1, 18))) == (16, 0, 0, 2)  # trailing 2 tokens never cached


def test_match_is_capped_at_input_length_minus_one():
    cache = make()
    cache.prefill(prompt(1, 16))
    # A repeated page-aligned prompt recomputes its last page (docs/controller.md#match-cap).
    assert breakdown(cache.prefill(prompt(1, 16))) == (12, 0, 0, 4)


def test_write_through_backs_up_on_first_use():
    cache = make(write_policy="write_through")
    r = cache.prefill(prompt(1, 16))
    assert r.backed_up_pages == 4 and r.stored_pages == 4
    assert len(cache.l3.objects) == 8  # _k and _v per page


def test_write_through_selective_backs_up_on_second_hit():
    cache = make(write_policy="write_through_selective")
    assert cache.prefill(prompt(1, 16)).backed_up_pages == 0
    assert cache.prefill(prompt(1, 16)).backed_up_pages == 4


def test_write_back_backs_up_only_at_eviction():
    cache = make(write_policy="write_back")
    cache.prefill(prompt(1, 32))  # 8 pages: the whole device pool
    assert cache.stats.bytes_d2h == 0 and not cache.l3.objects
    cache.prefill(prompt(2, 16))  # evicts prompt 1's node, all 8 pages, backed up first
    assert cache.stats.write_back_backups == 8 and cache.stats.device_evicted_nodes == 1
    assert len(cache.l3.objects) == 16
    # It comes back from host (prompt 2 is written back in turn to make room).
    assert breakdown(cache.prefill(prompt(1, 33))) == (0, 32, 0, 1)
    assert cache.stats.write_back_backups == 12


def test_write_through_eviction_keeps_host_copy():
    cache = make(write_policy="write_through", l3=False)
    cache.prefill(prompt(1, 32))
    cache.prefill(prompt(2, 32))  # evicts all of prompt 1 from the device
    assert breakdown(cache.prefill(prompt(1, 33))) == (0, 32, 0, 1)


def test_load_back_threshold_recomputes_short_host_hits():
    cache = make(write_policy="write_through", l3=False, device_pages=2, host_pages=9)
    cache.prefill(prompt(1, 8))  # 2 pages = 8 tokens, backed up
    cache.prefill(prompt(2, 8))  # evicts them from the device
    r = cache.prefill(prompt(1, 8))
    assert breakdown(r) == (0, 0, 0, 8)  # 8 < load_back_threshold 10: recomputed, not loaded


def test_prefetch_from_l3_after_flush_and_threshold():
    cache = make(prefetch_threshold=12)
    cache.prefill(prompt(1, 17))
    cache.flush()
    r = cache.prefill(prompt(1, 17))
    assert breakdown(r) == (0, 0, 16, 1) and r.prefetch.issued
    cache.flush()
    r = cache.prefill(prompt(1, 8))  # 8 < 12: no prefetch
    assert breakdown(r) == (0, 0, 0, 8) and "below the prefetch threshold" in r.prefetch.reason


def test_prefetch_revoked_when_one_rank_misses():
    cache = make(tp=2)
    cache.prefill(prompt(1, 17))
    cache.flush()
    # Rank 1 lost every `_v` object: its contiguous hit is 0, the minimum over ranks.
    cache.l3.objects = {o for o in cache.l3.objects if not o.endswith("_1_v")}
    r = cache.prefill(prompt(1, 17))
    assert r.prefetch.rank_hits == [4, 0] and not r.prefetch.issued
    assert breakdown(r) == (0, 0, 0, 17)


def test_second_instance_shares_l3():
    a = make()
    b = TieredCache(a.config, AccountingPlane(64), a.l3)
    a.prefill(prompt(1, 17))
    assert breakdown(b.prefill(prompt(1, 17))) == (0, 0, 16, 1)


@pytest.mark.parametrize(
    "policy, version, expected_pages",
    [
        ("wait_complete", "0.5.23", 16),
        ("best_effort", "0.5.23", 5),  # admission at 0.05 s, one page per 0.01 s
        ("timeout", "0.5.23", 16),  # budget 1.0 + 0.25*64/1024 s covers 0.16 s
    ],
)
def test_stop_policies(policy, version, expected_pages):
    cache = make(latency=0.01, stop_policy=policy, sglang_version=version, device_pages=16, host_pages=33)
    cache.prefill(prompt(1, 65))
    cache.flush()
    r = cache.prefill(prompt(1, 65))
    assert r.prefetch.completed_pages == expected_pages
    assert r.storage_hit == expected_pages * PS


def test_timeout_budget_cuts_a_slow_prefetch():
    cache = make(latency=0.5, stop_policy="timeout", device_pages=16, host_pages=33)
    cache.prefill(prompt(1, 65))
    cache.flush()
    r = cache.prefill(prompt(1, 65))
    # 0.5.23: budget 1.0 + 0.25 * 64/1024 = 1.015625 s from the first admission check (0.05 s):
    # two pages (0.5 s, 1.0 s) arrive in time.
    assert r.prefetch.budget_s == pytest.approx(1.015625)
    assert r.prefetch.completed_pages == 2 and r.prefetch.timeout_would_cut


def test_timeout_budgets_per_version():
    # 0.5.14 counts the L3 hit and caps at the max; 0.5.23 counts the requested span, uncapped.
    assert TimeoutBudget().seconds("0.5.14", requested_tokens=8192, hit_tokens=1024) == pytest.approx(2.1)
    assert TimeoutBudget().seconds("0.5.14", requested_tokens=0, hit_tokens=10 * 2**20) == pytest.approx(30.0)
    assert TimeoutBudget().seconds("0.5.23", requested_tokens=1024, hit_tokens=0) == pytest.approx(1.25)
    assert TimeoutBudget().seconds("0.5.23", requested_tokens=10 * 2**20, hit_tokens=1024) == pytest.approx(
        1.0 + 0.25 * 10 * 1024
    )
    capped = TimeoutBudget(base=0.5, per_ki_token=0.0, maximum=0.2)
    assert capped.seconds("0.5.14", requested_tokens=4096, hit_tokens=4096) == pytest.approx(0.2)
    assert capped.seconds("0.5.23", requested_tokens=4096, hit_tokens=4096) == pytest.approx(0.5)


def test_namespaces_do_not_share_tree_nodes_but_0_5_14_shares_l3_keys():
    cache = make(sglang_version="0.5.14")
    cache.prefill(prompt(1, 17), extra_key="tenantA")
    assert breakdown(cache.prefill(prompt(1, 17), extra_key="tenantB")) == (0, 0, 16, 1)
    cache23 = make(sglang_version="0.5.23")
    cache23.prefill(prompt(1, 17), extra_key="tenantA")
    assert breakdown(cache23.prefill(prompt(1, 17), extra_key="tenantB")) == (0, 0, 0, 17)


def test_bad_requests():
    cache = make()
    with pytest.raises(InputError, match="empty"):
        cache.prefill([])
    with pytest.raises(CapacityError, match="device pool holds 8"):
        cache.prefill(prompt(1, 40))
    with pytest.raises(InputError, match="write policy"):
        CacheConfig(write_policy="write_sometimes")


def test_eviction_takes_whole_nodes_least_recently_used_first():
    cache = make(write_policy="write_through", l3=False, device_pages=8, host_pages=17)
    cache.prefill(prompt(1, 16))
    cache.prefill(prompt(2, 16))
    cache.prefill(prompt(3, 12))  # needs 3 pages: prompt 1's node (4 pages) leaves the device whole
    assert (cache.stats.device_evicted_nodes, cache.stats.device_evictions) == (1, 4)
    assert breakdown(cache.prefill(prompt(2, 17))) == (16, 0, 0, 1)
    assert breakdown(cache.prefill(prompt(1, 17))) == (0, 16, 0, 1)


def test_l3_is_written_once_and_never_healed():
    cache = make()
    cache.prefill(prompt(1, 17))
    assert len(cache.l3.objects) == 8
    cache.l3.objects.clear()  # the store lost them (an outage)
    cache.prefill(prompt(1, 17))  # hits the pages on the device; SGLang does not write them again
    assert not cache.l3.objects


@pytest.mark.parametrize("version, backed_up", [("0.5.14", 4), ("0.5.23", 0)])
def test_write_through_selective_counts_per_insert_in_0_5_14(version, backed_up):
    cache = make(write_policy="write_through_selective", sglang_version=version, l3=False)
    # One request: prefill inserts the prompt, finish inserts it again with the output.
    r = cache.request(prompt(1, 17), prompt(9, 2))
    assert r.backed_up_pages == backed_up


def test_host_eviction_takes_only_nodes_off_the_device():
    # 9 device pages: a prompt's allocation asks for a page more than its 4 (SGLang's demand).
    cache = make(write_policy="write_through", l3=False, device_pages=9, host_pages=9)
    cache.prefill(prompt(1, 16))
    cache.prefill(prompt(2, 16))  # both on device and host: 8 of 9 host pages
    cache.prefill(prompt(3, 16))  # prompt 1 leaves the device; its host copy is the one evicted
    assert cache.stats.host_evicted_nodes == 1
    keys2 = cache.keys_for(prompt(2, 16), None, None)[0]
    assert all(p.backed_up and p.device_page >= 0 for p in cache.tree.pages_of(keys2))
    assert breakdown(cache.prefill(prompt(1, 17))) == (0, 0, 0, 17)


def test_eviction_policies_per_version():
    assert CacheConfig(eviction_policy="lfu").eviction_policy == "lfu"
    with pytest.raises(InputError, match="does not model"):
        CacheConfig(eviction_policy="slru")
    with pytest.raises(InputError, match="has no radix eviction policy 'tlru'"):
        CacheConfig(eviction_policy="tlru", sglang_version="0.5.14")


def test_rate_limited_prefetch_names_rule_and_version():
    cache = make(sglang_version="0.5.14")
    cache.prefill(prompt(1, 17))
    cache.flush()
    cache.in_flight_tokens = 10**6
    r = cache.prefill(prompt(1, 17))
    assert not r.prefetch.issued
    assert "(0.5.14: 0.8 x (host - device)); 0.5.14 never retries" in r.prefetch.reason


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_keys_continue_a_known_prefix(version):
    cache = make(sglang_version=version)
    tokens = prompt(3, 30)
    whole = cache.keys_for(tokens, "tenant", None)
    head = cache.keys_for(tokens[:12], "tenant", None)
    assert cache.keys_for(tokens, "tenant", None, known=head) == whole


def test_the_cache_remembers_the_namespaces_its_requests_used_first_seen_first_and_bounded():
    cache = make()
    cache.prefill(prompt(4, 32))
    cache.prefill(prompt(4, 32), extra_key="tenant-a")
    cache.prefill(prompt(5, 32), cache_salt="")  # "" is no salt: the root namespace
    cache.prefill(prompt(5, 32), cache_salt="s1")
    assert list(cache.namespaces) == [("tenant-a", None), (None, "s1")]
    for i in range(40):
        cache.keys_for(prompt(6, 16), f"k{i}", None)
    assert len(cache.namespaces) == 32 and list(cache.namespaces)[:2] == [("tenant-a", None), (None, "s1")]


# -- the concurrency model (engine/scheduler.py) ----------------------------------------------


def _wave_after_flush(version: str):
    """Three prompts in L3 only arrive together; the device runs one request at a time and the
    host pool makes the in-flight limit one prefetch (0.5.14: 0.8 x (32 - 24) x 4 = 25 tokens;
    0.5.23: 0.5 x 32 x 4 = 64 tokens, each prefetch requests 64)."""
    from hicache_ops.engine.scheduler import WaveStats, run_wave

    cache = make(sglang_version=version, device_pages=24, host_pages=32, prefetch_threshold=4)
    prompts = [prompt(10 + c, 65) for c in range(3)]
    for p in prompts:
        cache.request(p, prompt(90, 1))
    cache.flush()
    stats = WaveStats()
    results = run_wave(cache, [(p, prompt(90, 10)) for p in prompts], stats)  # 10 decode passes each
    return cache, results, stats


def test_concurrent_arrivals_over_the_limit_are_skipped_for_good_in_0_5_14():
    cache, results, stats = _wave_after_flush("0.5.14")
    assert [r.storage_hit for r in results] == [64, 0, 0]
    assert all("(0.5.14: 0.8 x (host - device)); 0.5.14 never retries" in r.prefetch.reason for r in results[1:])
    assert stats.retried == 0 and stats.max_running == 1


def test_concurrent_arrivals_over_the_limit_are_retried_in_0_5_23():
    cache, results, stats = _wave_after_flush("0.5.23")
    # The second request heads the queue while the first runs: it is never held for a retry and
    # runs without L3. The third is re-issued 8 passes after its refusal, the limit has cleared
    # by then (the first prefetch landed at admission), and it lands when the third is admitted.
    assert [r.storage_hit for r in results] == [64, 0, 64]
    assert (stats.retried, stats.retried_issued) == (1, 1)


def test_requests_hold_device_kv_while_running():
    from hicache_ops.engine.scheduler import WaveStats, run_wave

    cache = make(device_pages=8, host_pages=17, l3=False)
    stats = WaveStats()
    # Each request needs 4 prompt pages + its output's: two cannot run at once on 8 pages.
    results = run_wave(cache, [(prompt(1, 16), prompt(9, 2)), (prompt(2, 16), prompt(9, 2))], stats)
    assert [breakdown(r) for r in results] == [(0, 0, 0, 16), (0, 0, 0, 16)]
    assert stats.max_running == 1 and cache.tree.protected_pages == 0


def test_buffer_only_host_mode_is_refused_by_name():
    from hicache_ops.engine.builder import EngineSpec

    spec = EngineSpec(host_memory_mode="buffer_only", sglang_version="0.5.23")
    with pytest.raises(InputError, match="buffer_only host memory mode"):
        spec.cache_config(spec.host_layout(mooncake=True))
