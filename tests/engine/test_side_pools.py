"""The engine's side pools: which objects a backup writes (one Mamba state per node, every page of an
all_pages pool), and the loadable prefix its L3 tiers answer, against SGLang's own
`MooncakeStore.batch_exists_v2` (0.5.14 in a child process, 0.5.23 in this process) on the real
master that holds the engine's objects, and against the inspect layer's key rule.

The writer stores a 12-page prompt in two requests (6 pages, then all 12), so the tree holds two
nodes and the Mamba pool has objects at pages 5 and 11 only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hicache_ops.commands.inspect.key_listing import expected_keys
from hicache_ops.engine.builder import EngineSpec, build_accounting, build_bytes
from hicache_ops.errors import InputError
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.sglang.geometry import preset
from hicache_ops.sglang.side_pool_specs import side_pools_for
from sglang_0_5_14 import run_0_5_14

PAGE = 16
HALF, PAGES = 6, 12


def tokens(base: int) -> list[int]:
    return list(range(base, base + PAGES * PAGE + 8))


def spec_for(version: str, pool_preset: str, geometry: str = "tiny", tp_size: int = 1) -> EngineSpec:
    geo = preset(geometry)
    return EngineSpec(
        geometry=geo,
        page_size=PAGE,
        device_tokens=1024,
        prefetch_threshold=64,
        stop_policy="wait_complete",
        sglang_version=version,
        model_name=None,
        tp_size=tp_size,
        side_pools=side_pools_for(None, pool_preset, version, geo.mla, PAGE),
    )


def write_two_nodes(cache, prompt: list[int]) -> list[str]:
    cache.prefill(prompt[: HALF * PAGE])
    cache.prefill(prompt)
    return cache.keys_for(np.asarray(prompt), None, None)[1]


# -- accounting: MemoryL3 against the inspect layer's keys and the sglang-layer rule ----------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_memory_l3_writes_one_mamba_state_per_node_and_answers_batch_exists_v2(version):
    spec = spec_for(version, "qwen3-next")
    cache = build_accounting(spec)
    prompt = tokens(10_000)
    keys = write_two_nodes(cache, prompt)
    report = expected_keys(prompt, PAGE, spec.deployment(), pools=spec.side_pools)
    assert [p.page_key for p in report.pages] == keys
    held = cache.l3.objects
    # Every KV object of every page; the Mamba objects (temporal, conv_0) of each node's last page only.
    kv = {k for row in report.pages for k, pool in zip(row.object_keys, row.object_pools, strict=True) if pool == "kv"}
    mamba = {
        (row.index, k)
        for row in report.pages
        for k, pool in zip(row.object_keys, row.object_pools, strict=True)
        if pool == "mamba"
    }
    assert held == kv | {k for i, k in mamba if i in (HALF - 1, PAGES - 1)}
    assert cache.stats.l3_side_objects_written == 4

    # (The inspect layer's loadable prefix calls the same hit_policy.loadable_prefix as the
    # engine: comparing the two could not fail, so the prefixes are checked against the rule.)
    def both(present_keys: set[str]):
        cache.l3.objects = set(present_keys)
        return cache.l3.lookup(keys)

    everything = set(held)
    assert both(everything).pages == PAGES
    last_mamba = {k for i, k in mamba if i == PAGES - 1}
    cut = both(everything - {sorted(last_mamba)[0]})
    assert cut.pages == HALF and cut.kv_pages == PAGES  # trailing_pages: the last Mamba state left is page 5's
    assert (cut.restorable == [HALF]) if version == "0.5.23" else cut.restorable is None
    assert both(everything - last_mamba - {k for i, k in mamba if i == HALF - 1}).pages == 0
    # A KV object missing ends the KV prefix first; the pool cannot serve past it.
    fourth_v = next(k for k in report.pages[3].object_keys if k.endswith("_0_v"))
    assert both(everything - {fourth_v}).pages == 0  # no Mamba state at or before page 2


def test_memory_l3_all_pages_pool_and_every_rank():
    """An MHA draft pool is per rank and all_pages: each of 2 ranks writes it on every page."""
    spec = spec_for("0.5.23", "gpt-oss", tp_size=2)  # SWA window 128 tokens = 8 pages at page 16
    spec = EngineSpec(
        **{
            **spec.__dict__,
            "side_pools": spec.side_pools + side_pools_for(["draft:attention=mha"], None, "0.5.23", False, PAGE),
        }
    )
    cache = build_accounting(spec)
    prompt = tokens(20_000)
    keys = write_two_nodes(cache, prompt)
    report = expected_keys(prompt, PAGE, spec.deployment(), pools=spec.side_pools)
    assert cache.l3.objects == set(report.object_keys)  # SWA and draft on every page of every rank
    found = cache.l3.lookup(keys)
    assert found.pages == PAGES and found.pool_hit_pages == {"swa": PAGES, "draft": PAGES}
    rank1_draft = next(k for k in report.pages[7].object_keys if k.endswith("_1_draft_k"))
    cache.l3.objects.discard(rank1_draft)
    assert cache.l3.lookup(keys).pages == 7 and cache.l3.lookup(keys).rank_pages == [PAGES, 7]


def test_preset_of_the_other_attention_kind_is_refused():
    with pytest.raises(InputError, match="qwen3-next is for an MHA model but the engine's geometry is MLA"):
        side_pools_for(None, "qwen3-next", "0.5.23", True, PAGE)
    with pytest.raises(InputError, match="needs SGLang 0.5.23"):
        side_pools_for(None, "deepseek-v3.2-mtp", "0.5.14", True, PAGE)
    with pytest.raises(InputError, match="no pool 'draft_swa'"):
        EngineSpec(
            side_pools=side_pools_for(["draft_swa"], None, "0.5.14", False, PAGE), sglang_version="0.5.14"
        ).check_side_pools()


# -- real bytes on the real master, SGLang's batch_exists_v2 as the oracle --------------------------

ORACLE = """
import types
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
try:
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    NEW = True
except ImportError:  # 0.5.14
    from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost
    NEW = False

common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=2)
device = MHATokenToKVPool(64, 16, torch.float16, head_num=2, head_dim=8, layer_num=2, **common)
if NEW:
    kv = MHATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, 16, "page_first", pin_memory=False,
                              device="cpu", device_capacity_tokens=device.size, start_layer=0, end_layer=2)
else:
    kv = MHATokenToKVPoolHost(device, 2.0, 0, 16, "page_first", pin_memory=False, device="cpu")
config = HiCacheStorageConfig(
    tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=PAYLOAD["mla"],
    enable_storage_metrics=False, is_page_first_layout=True, model_name=None, tp_lcm_size=None,
    should_split_heads=False, extra_config=dict(PAYLOAD["extra"]),
)
store = MooncakeStore(config, kv)
store.register_mem_pool_host(kv)
# Stand-ins carrying only what the key builder reads (tests/inspect/test_side_pools.py does the same).
store.registered_pools[PoolName.MAMBA] = types.SimpleNamespace(conv_buffer=[None], temporal_state_elem_size=1)
store.registered_pools[PoolName.INDEXER] = types.SimpleNamespace()
RESULT = {}
for name, keys in PAYLOAD["queries"].items():
    query = [
        PoolTransfer(name=PoolName(p), keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES) if p == "mamba"
        else PoolTransfer(name=PoolName(p))
        for p in PAYLOAD["pools"]
    ]
    result = store.batch_exists_v2(keys, query)
    RESULT[name] = {"pages": result.kv_hit_pages, "hits": {str(k): v for k, v in result.extra_pool_hit_pages.items()},
                    "restorable": getattr(result, "restorable_prefix_pages", None)}
store.store.close()
"""


def sglang_batch_exists_v2(version: str, master, pools: list[str], mla: bool, queries: dict) -> dict:
    extra = {
        "master_server_address": master.rpc_address,
        "metadata_server": master.metadata_server,
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 16 << 20,
        "local_hostname": "127.0.0.1",
    }
    payload = {"extra": extra, "pools": pools, "mla": mla, "queries": queries}
    if version == "0.5.14":
        return run_0_5_14(ORACLE, payload)
    scope = {"PAYLOAD": json.loads(json.dumps(payload))}
    exec(ORACLE, scope)
    return json.loads(json.dumps(scope["RESULT"]))


CASES = {
    # preset, geometry, the pool whose last-page objects go, what is left (0.5.14 / 0.5.23 agree here)
    "qwen3-next": ("qwen3-next", "tiny", ["mamba"], HALF),
    "deepseek-v3.2": ("deepseek-v3.2", "tiny-mla", ["indexer"], PAGES - 1),
}


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_lookup_matches_sglang_batch_exists_v2(mooncake_master, version, case):
    pool_preset, geometry, pools, left = CASES[case]
    spec = spec_for(version, pool_preset, geometry)
    store = StoreClient.connect(mooncake_master.rpc_address, segment_size=32 << 20)
    try:
        cache = build_bytes(spec, store)
        whole = write_two_nodes(cache, tokens(hash((version, case)) % 10**8 + 10**8))
        damaged = write_two_nodes(cache, tokens(hash((version, case, 1)) % 10**8 + 2 * 10**8))
        gone = [o["key"] for o in cache.l3.side_presence(damaged, PAGES)[0][pools[0]][PAGES - 1]]
        assert gone and all(o["present"] for o in cache.l3.side_presence(damaged, PAGES)[0][pools[0]][PAGES - 1])
        store.remove_keys(gone, prefix=damaged[-1], force=True)
        ours = {"whole": cache.l3.lookup(whole), "damaged": cache.l3.lookup(damaged)}
        theirs = sglang_batch_exists_v2(
            version, mooncake_master, pools, spec.geometry.mla, {"whole": whole, "damaged": damaged}
        )
        for name, found in ours.items():
            got = theirs[name]
            assert found.pages == got["pages"], (version, case, name, got)
            assert found.pool_hit_pages == {k: v for k, v in got["hits"].items() if k != "kv"}, (version, case, name)
            assert found.restorable == got["restorable"], (version, case, name)
        assert ours["whole"].pages == PAGES and ours["damaged"].pages == left and ours["damaged"].kv_pages == PAGES
    finally:
        store.close()
