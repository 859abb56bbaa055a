"""The tiered cache with real bytes: every copy in every tier checks against the reference KV."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache_ops.engine.builder import EngineSpec, build_bytes
from hicache_ops.sglang.geometry import ModelGeometry, preset

MLA = ModelGeometry.mla_model(layers=2, kv_lora_rank=16, qk_rope_head_dim=8)


def spec(**kw) -> EngineSpec:
    return EngineSpec(**{"page_size": 8, "device_tokens": 64, "hicache_ratio": 2.0, "prefetch_threshold": 8, **kw})


def run_cycle(cache):
    a, b = np.arange(60), np.arange(10_000, 10_064)
    cache.prefill(a)
    cache.prefill(b)  # evicts a from the device: its host copy must come back intact
    return cache.prefill(a)


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
@pytest.mark.parametrize("tp_size", [1, 2])
def test_mha_load_back_verifies_in_every_layout(layout, tp_size):
    cache = build_bytes(spec(layout=layout, tp_size=tp_size))
    r = run_cycle(cache)
    assert (r.device_hit, r.host_hit, r.computed) == (0, 56, 4)
    assert r.mismatched_pages == 0 and cache.stats.mismatched_pages == 0
    assert r.bytes_loaded_from_host == 7 * cache.plane.bytes_per_page * tp_size


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_mla_load_back_verifies(layout):
    cache = build_bytes(spec(geometry=MLA, layout=layout, tp_size=2))
    r = run_cycle(cache)
    assert r.host_hit == 56 and r.mismatched_pages == 0


def test_corrupted_host_page_is_counted_on_load_back():
    cache = build_bytes(spec())
    a = np.arange(60)
    cache.prefill(a)
    cache.prefill(np.arange(10_000, 10_064))
    page = cache.tree.pages_of(cache.keys_for(a, None, None)[0])[3]
    bits = cache.plane.ranks[0].host.view(torch.int16)  # flip one bit of one K element
    bits[0, page.host_page * 8, 0, 0, 0] ^= 1  # page_first: (2, tokens, L, H, D)
    r = cache.prefill(a)
    assert r.mismatched_pages == 1


def test_each_rank_holds_different_bytes():
    cache = build_bytes(spec(tp_size=2))
    cache.prefill(np.arange(16))
    k0, k1 = cache.plane.ranks[0].device_k, cache.plane.ranks[1].device_k
    assert not np.array_equal(k0.float().numpy(), k1.float().numpy())


def test_refuses_pools_larger_than_memory():
    from hicache_ops.errors import InputError

    huge = spec(geometry=preset("llama-3.1-70b"), device_tokens=4_000_000)
    with pytest.raises(InputError, match="GiB of host memory"):
        build_bytes(huge)


def test_a_corrupt_l3_page_is_counted_once(mooncake_master, mooncake_segment_owner):
    """Counted when it arrives from L3; its load-back finds the same bytes and must not count it again."""
    from hicache_ops.mooncake.store_client import StoreClient

    with StoreClient.connect(mooncake_master.rpc_address) as store:
        kw = {"model_name": "test/corrupt-once", "stop_policy": "wait_complete"}
        a = np.arange(70_000, 70_064)
        writer = build_bytes(spec(**kw), store)
        writer.prefill(a)  # write_through: every whole page reaches L3
        scheme = writer.l3.schemes[0]
        k_key = scheme.object_keys(writer.keys_for(a, None, None)[1][2])[0]
        data = bytearray(store.get(k_key))
        data[0] ^= 1
        store.put(k_key, bytes(data), upsert=True)
        reader = build_bytes(spec(**kw), store)
        r = reader.prefill(a)
        assert r.storage_hit >= 2 * 8 and r.prefetch.mismatched_pages == 1
        assert r.mismatched_pages == 1 and reader.stats.mismatched_pages == 1
