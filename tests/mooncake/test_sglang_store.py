"""The real client proof: SGLang's own MooncakeStore writes pages into the embedded master; hicache
finds every object under its exact name and reports the same contiguous prefix as SGLang.

No mocks: SGLang 0.5.23's MooncakeStore over real host pools (CPU, pin_memory=False), built the
way its cache controller builds them (HiCacheStorageConfig with the Mooncake extra-config), page
keys from SGLang's own get_storage_hash_str, a real mooncake_master on loopback.
"""

from __future__ import annotations

import json
import random
import warnings
from array import array

import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.store_listing import inspect_store
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.results import json_data

PAGE = 16
PAGES = 8
TP = 2
# A model name of this module's own: the session master is shared, and
# test_sglang_store_shapes.py writes other shapes under the Qwen/Qwen3-0.6B prefix.
MODEL = "hicache-tests/sglang-store"
PREFIX = "hicache-tests-sglang-store_"


def sglang_storage_keys(tokens, extra_key=None):
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    whole = len(tokens) - len(tokens) % PAGE
    key = RadixKey(array("q", tokens[:whole]), extra_key=extra_key)
    return list(get_storage_hash_str(key, None, page_size=PAGE))


@pytest.fixture(scope="module")
def sglang_ranks(mooncake_master):
    """One SGLang MooncakeStore per attention-TP rank, each over its own CPU host pool."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    extra_config = {
        "master_server_address": mooncake_master.rpc_address,
        "metadata_server": mooncake_master.metadata_server,
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 64 << 20,
        "local_hostname": "127.0.0.1",
    }
    ranks = []
    try:
        for tp_rank in range(TP):
            device = MHATokenToKVPool(
                256,
                PAGE,
                torch.float16,
                head_num=2,
                head_dim=8,
                layer_num=2,
                device="cpu",
                enable_memory_saver=False,
                start_layer=0,
                end_layer=2,
            )
            info = device.get_device_pool_infos()[0].buffer_info
            host = MHATokenToKVPoolHost(
                info,
                2.0,
                0,
                PAGE,
                "page_first",
                pin_memory=False,
                device="cpu",
                device_capacity_tokens=device.size,
                start_layer=0,
                end_layer=2,
            )
            config = HiCacheStorageConfig(
                tp_rank=tp_rank,
                tp_size=TP,
                pp_rank=0,
                pp_size=1,
                attn_cp_rank=0,
                attn_cp_size=1,
                is_mla_model=False,
                enable_storage_metrics=False,
                is_page_first_layout=True,
                model_name=MODEL,
                extra_config=dict(extra_config),
            )
            store = MooncakeStore(config, host)
            store.register_mem_pool_host(host)
            host.kv_buffer.view(torch.uint8).random_(0, 255)
            ranks.append((store, host))
        yield ranks
    finally:
        for store, _ in ranks:
            store.store.close()  # SGLang's close() is a no-op; its objects leave with the segment


def write_prompt(ranks, keys):
    import torch

    indices = torch.arange(0, len(keys) * PAGE)
    for store, _ in ranks:
        assert store.batch_set_v1(keys, indices) == [True] * len(keys)


def inspect_keys(master, tokens, *extra):
    args = [
        "inspect",
        "keys",
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        str(PAGE),
        "--sglang-version",
        "0.5.23",
        "--model-name",
        MODEL,
        "--tp-size",
        str(TP),
        "--master",
        master.metrics_address,
        "--json",
        *extra,
    ]
    result = hicache(args)
    return result.exit_code, json.loads(result.stdout)


def test_hicache_finds_what_sglang_wrote(mooncake_master, sglang_ranks):
    base = random.randrange(10**6, 10**9)
    tokens = list(range(base, base + PAGES * PAGE + 5))
    keys = sglang_storage_keys(tokens)
    write_prompt(sglang_ranks, keys)
    assert [store.batch_exists(keys) for store, _ in sglang_ranks] == [PAGES] * TP

    code, data = inspect_keys(mooncake_master, tokens)
    assert code == 0, data
    assert [p["page_key"] for p in data["pages"]] == keys
    assert data["contiguous_pages"] == PAGES and data["first_missing"] is None
    assert all(all(p["present"]) for p in data["pages"])
    # Every object SGLang wrote for this prompt, under exactly the names hicache expects.
    with AdminClient(mooncake_master.metrics_address) as admin:
        written = {k for k in admin.get_all_keys() if k.startswith(PREFIX) and any(pk in k for pk in keys)}
    expected = {k for p in data["pages"] for k in p["object_keys"]}
    assert written == expected and len(expected) == PAGES * TP * 2

    # inspect store groups them by SGLang's prefix, K/V-complete, and counts SGLang's warm-up keys.
    store_view = json_data(inspect_store(mooncake_master.metrics_address, prefix=PREFIX, limit=1000))
    group = store_view["groups"][0]
    assert group["prefix"] == PREFIX and group["kind"] == "mha"
    assert {"_0_k", "_0_v", "_1_k", "_1_v"} <= set(group["suffixes"])
    assert set(keys) <= set(group["page_keys"])
    assert inspect_store(mooncake_master.metrics_address).warmup_keys >= TP

    # Remove one `_v` object of one rank: SGLang's batch_exists and hicache agree on the prefix.
    victim = f"{PREFIX}{keys[5]}_1_v"
    with StoreClient.connect(mooncake_master.rpc_address) as short:
        assert short.remove_keys([victim], prefix=PREFIX, force=True) == [0]
    theirs = [store.batch_exists(keys) for store, _ in sglang_ranks]
    assert theirs == [PAGES, 5]
    code, data = inspect_keys(mooncake_master, tokens)
    assert code == 1
    assert data["contiguous_pages"] == min(theirs) == 5  # the all-ranks MIN, as SGLang's controller takes
    assert data["first_missing"] == victim
    assert data["pages"][5]["present"] == [True, True, True, False]
    assert [d["kind"] for d in data["diagnosis"]] == ["incomplete_page", "gap"]

    # Per rank, too: rank 0 alone is complete, rank 1 alone stops where SGLang's rank 1 does.
    for tp_rank, sglang_count in enumerate(theirs):
        code, data = inspect_keys(mooncake_master, tokens, "--tp-rank", str(tp_rank))
        assert data["contiguous_pages"] == sglang_count and code == (0 if sglang_count == PAGES else 1)


def test_namespaced_prompt(mooncake_master, sglang_ranks):
    base = random.randrange(10**6, 10**9)
    tokens = list(range(base, base + PAGES * PAGE))
    keys = sglang_storage_keys(tokens, extra_key="tenantA")
    write_prompt(sglang_ranks, keys)
    code, data = inspect_keys(mooncake_master, tokens, "--extra-key", "tenantA")
    assert code == 0 and data["contiguous_pages"] == PAGES and [p["page_key"] for p in data["pages"]] == keys
    # Without the namespace nothing matches, and the diagnosis points at it.
    code, data = inspect_keys(mooncake_master, tokens, "--try-extra-key", "tenantA")
    assert code == 1 and data["contiguous_pages"] == 0
    found = next(d for d in data["diagnosis"] if d["kind"] == "other_namespace")
    assert found["namespace"] == "extra_key='tenantA', cache_salt=None" and found["contiguous_pages"] == PAGES
