"""Side pools against SGLang's own MooncakeStore v2 calls and the session's real master, for
0.5.14 (a child process, kept alive while its objects are checked) and 0.5.23 (this process);
both run the same script.

SGLang writes every object itself: the KV (`batch_set_v1`) and the SWA, draft, Mamba and DSA
indexer pools (`batch_set_v2`), each from SGLang's own host pool class built on the CPU and
registered with `register_mem_host_pool_v2`: MHA host pools for KV, SWA and draft, `MambaPoolHost`
(over a CPU `MambaPool` in 0.5.14, a `MambaStateBufferInfo` of CPU tensors in 0.5.23) and
`DSAIndexerPoolHost` on a CPU `DSATokenToKVPool` and its MLA anchor host pool (which is why pages
are 64 tokens: SGLang's DSA pool asserts it). SGLang's `batch_exists_v2` then reports the loadable
prefix, per-pool hits and (0.5.23) the restorable stop points, which must equal ours; the master's
listing must hold exactly the objects we say are present (so our names are SGLang's), and
`inspect store`'s grouping must put each pool's objects with their page.
"""

from __future__ import annotations

import json
import random

import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.key_listing import Deployment, expected_keys
from hicache_ops.commands.inspect.live_diff import live_diff
from hicache_ops.commands.inspect.store_listing import group_keys, parse_object_key
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.sglang.side_pool_specs import PoolSpec
from sglang_0_5_14 import held_0_5_14

PAGE = 64  # SGLang's DSA device pool asserts 64-token pages
PAGES = 6
SWA_WINDOW = 2
POOLS = [
    PoolSpec("swa", window=SWA_WINDOW),
    PoolSpec("draft", attention="mha"),
    PoolSpec("mamba", conv=2),
    PoolSpec("indexer"),
]
POOL_ARGS = [
    "--pool",
    f"swa:window={SWA_WINDOW}",
    "--pool",
    "draft:attention=mha",
    "--pool",
    "mamba:conv=2",
    "--pool",
    "indexer",
]
ALL = list(range(PAGES))

# Which pages each pool holds; what SGLang loads follows from them.
SCENARIOS = {
    "complete": {},
    "mamba-last-page-missing": {"mamba": [0, 1, 2, 3, 4]},
    "mamba-hole": {"mamba": [0, 1, 3, 4, 5]},
    "swa-hole": {"swa": [0, 1, 3, 4, 5]},
    "indexer-page-missing": {"indexer": [0, 1, 2, 4, 5]},
    "mamba-never-written": {"mamba": []},
    "swa-hole-and-mamba-last": {"swa": [0, 1, 3, 4, 5], "mamba": [0, 1, 2, 3, 4]},
    "kv-short": {"kv": [0, 1, 2, 3]},
}

SCRIPT = """
from array import array
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
try:
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    NEW = True
except ImportError:  # 0.5.14
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool
    from sglang.srt.mem_cache.memory_pool_host import (
        DSAIndexerPoolHost, MambaPoolHost, MHATokenToKVPoolHost, MLATokenToKVPoolHost,
    )
    NEW = False

PAGE, PAGES, WINDOW = PAYLOAD["page"], PAYLOAD["pages"], PAYLOAD["window"]
HOST = dict(pin_memory=False, device="cpu")


def filled(host, buffers):
    for buf in buffers:
        buf.view(torch.uint8).random_(0, 255)
    return host


def mha_host():
    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=2)
    device = MHATokenToKVPool(PAGES * PAGE * 2, PAGE, torch.float16, head_num=4, head_dim=8, layer_num=2, **common)
    if NEW:
        host = MHATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, "page_first",
                                    device_capacity_tokens=device.size, start_layer=0, end_layer=2, **HOST)
    else:
        host = MHATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", **HOST)
    return filled(host, [host.kv_buffer])


def mamba_host():
    # Two layers, a temporal state and two conv states: one slot per page key.
    slots, temporal, conv = PAGES, (2, 4, 4), [(8, 3), (4, 3)]
    if NEW:
        info = MambaStateBufferInfo(
            temporal=torch.zeros(2, slots + 1, *temporal, dtype=torch.float32),
            conv=tuple(torch.zeros(2, slots + 1, *shape, dtype=torch.bfloat16) for shape in conv),
        )
        host = MambaPoolHost(info, 2.0, 0, device_capacity=slots, layout="page_first_direct", **HOST)
    else:
        shape = Mamba2StateShape(conv=conv, temporal=temporal, intermediate_size=0, conv_dim=0, ssm_state_size=0,
                                 num_heads=0, head_dim=0, state_size=0, conv_kernel=0)
        params = Mamba2CacheParams(shape=shape, layers=[0, 1],
                                   dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))
        device = MambaPool(size=slots, spec_state_size=slots, cache_params=params, mamba_layer_ids=[0, 1], device="cpu")
        host = MambaPoolHost(device, 2.0, 0, layout="page_first_direct", **HOST)
    return filled(host, [host.temporal_buffer, *host.conv_buffer])


def indexer_host():
    # The indexer rows ride on an MLA anchor host pool's slots (a DSA model's KV).
    size = PAGES * PAGE * 2
    extra = dict(index_buf_size=size) if NEW else {}  # 0.5.23's default asks the parallel state
    device = DSATokenToKVPool(size=size, page_size=PAGE, kv_lora_rank=16, dtype=torch.bfloat16, qk_rope_head_dim=8,
                              layer_num=2, device="cpu", index_head_dim=128, enable_memory_saver=False,
                              kv_cache_dim=24, **extra)
    if NEW:
        anchor = MLATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, "page_first",
                                      device_capacity_tokens=size, start_layer=0, end_layer=2, target_layer_num=2,
                                      override_kv_cache_dim=24, **HOST)
        host = DSAIndexerPoolHost(make_dsa_indexer_pool_decl(device), anchor, **HOST)
    else:
        anchor = MLATokenToKVPoolHost(device, 2.0, 0, PAGE, "page_first", **HOST)
        host = DSAIndexerPoolHost(device, anchor, "page_first", **HOST)
    return filled(host, [host.index_k_with_scale_buffer])


def page_keys(tokens):
    if NEW:
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.utils import get_storage_hash_str
        return list(get_storage_hash_str(RadixKey(array("q", tokens)), None, page_size=PAGE))
    from sglang.srt.mem_cache.utils import get_hash_str
    keys, prior = [], None
    for start in range(0, len(tokens), PAGE):
        prior = get_hash_str(tokens[start : start + PAGE], prior)
        keys.append(prior)
    return keys


def make_store():
    kv = mha_host()
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=None, tp_lcm_size=None,
        should_split_heads=False, extra_config=dict(PAYLOAD["extra"]),
    )
    store = MooncakeStore(config, kv)
    store.register_mem_pool_host(kv)
    store.register_mem_host_pool_v2(mha_host(), PoolName.SWA)
    store.register_mem_host_pool_v2(mha_host(), PoolName.DRAFT)
    store.register_mem_host_pool_v2(mamba_host(), PoolName.MAMBA)
    store.register_mem_host_pool_v2(indexer_host(), PoolName.INDEXER)
    return store


def on_pages(keys, pages, page_size=PAGE):
    picked = [keys[i] for i in pages]
    indices = torch.cat([torch.arange(i * page_size, (i + 1) * page_size) for i in pages]) if pages else None
    return picked, indices


STORES, RESULT = [], {}
for case in PAYLOAD["cases"]:
    store = make_store()
    STORES.append(store)
    keys = page_keys(case["tokens"][: PAGES * PAGE])
    picked, indices = on_pages(keys, case["kv"])
    assert store.batch_set_v1(picked, indices) == [True] * len(picked)
    transfers = []
    for name in ("swa", "draft", "mamba", "indexer"):
        picked, indices = on_pages(keys, case[name], 1 if name == "mamba" else PAGE)  # Mamba: one slot per page
        if picked:
            transfers.append(PoolTransfer(name=PoolName(name), keys=picked, host_indices=indices))
    written = store.batch_set_v2(transfers) if transfers else {}
    query = [
        PoolTransfer(name=PoolName.SWA, keys=keys[-WINDOW:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
        PoolTransfer(name=PoolName.DRAFT),
        PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
        PoolTransfer(name=PoolName.INDEXER),
    ]
    result = store.batch_exists_v2(keys, query)
    RESULT[case["id"]] = {
        "page_keys": keys,
        "written": {getattr(k, "value", k): list(v) for k, v in written.items()},
        "pages": result.kv_hit_pages,
        "hits": {str(k): v for k, v in result.extra_pool_hit_pages.items()},
        "restorable": getattr(result, "restorable_prefix_pages", None),
    }
"""


def scenario_cases(master) -> list[dict]:
    out = []
    for name, holds in SCENARIOS.items():
        base = random.randrange(10**6, 10**9)
        case = {"id": name, "tokens": list(range(base, base + PAGES * PAGE))}
        for pool in ("kv", "swa", "draft", "mamba", "indexer"):
            case[pool] = holds.get(pool, ALL)
        out.append(case)
    return out


def compare(master, version: str, cases: list[dict], results: dict) -> None:
    with AdminClient(master.metrics_address) as admin:
        listing = admin.get_all_keys()
        for case in cases:
            got = results[case["id"]]
            dep = Deployment(version)
            report = expected_keys(case["tokens"], PAGE, dep, pools=POOLS)
            assert [p.page_key for p in report.pages] == got["page_keys"], case["id"]
            # SGLang wrote every side-pool page it was given, from its own host pools.
            given = {name: len(case[name]) for name in ("swa", "draft", "mamba", "indexer") if case[name]}
            assert {k: v.count(True) for k, v in got["written"].items()} == given, (version, case["id"], got["written"])
            diff = live_diff(case["tokens"], PAGE, dep, admin, report=report)
            # The loadable prefix, each pool's own boundary and (0.5.23) the stop points, as SGLang's.
            assert diff.contiguous_pages == got["pages"], (version, case["id"], got)
            assert diff.pool_hit_pages == {k: v for k, v in got["hits"].items() if k != "kv"}, (version, case["id"])
            assert got["hits"].get("kv", 0) == diff.kv_contiguous_pages
            assert diff.restorable_prefix_pages == got["restorable"], (version, case["id"])
            # What the master holds for these pages is exactly what we call present.
            held = {k for k in listing if any(pk in k for pk in got["page_keys"])}
            present = {
                k
                for row, flags in zip(report.pages, diff.present, strict=True)
                for k, ok in zip(row.object_keys, flags, strict=True)
                if ok
            }
            assert held == present, (version, case["id"], sorted(held ^ present)[:4])
            # inspect store's grouping: each pool with its pages, the KV pages that lack it.
            (group,) = group_keys(sorted(held))["groups"]
            assert group["pages"] == len(case["kv"]) and group["complete_pages"] == len(case["kv"])
            pools = {p["pool"]: p for p in group["pools"]}
            for name in ("swa", "draft", "mamba", "indexer"):
                if not case[name]:
                    assert name not in pools
                    continue
                row = pools[name]
                assert row["pages"] == row["complete_pages"] == len(case[name]), (case["id"], name)
                assert row["kv_pages_without_pool"] == len(set(case["kv"]) - set(case[name])), (case["id"], name)
                assert row["pages_without_kv"] == len(set(case[name]) - set(case["kv"])), (case["id"], name)
                assert set(row["suffixes"]) == set(report.ranks[0]["pools"][name])


def extra(master) -> dict:
    return {
        "master_server_address": master.rpc_address,
        "metadata_server": master.metadata_server,
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": 16 << 20,
        "local_hostname": "127.0.0.1",
    }


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_loadable_prefix_matches_sglang_batch_exists_v2(mooncake_master, mooncake_segment_owner, version):
    cases = scenario_cases(mooncake_master)
    payload = {"page": PAGE, "pages": PAGES, "window": SWA_WINDOW, "extra": extra(mooncake_master), "cases": cases}
    if version == "0.5.14":
        with held_0_5_14(SCRIPT, payload) as results:
            compare(mooncake_master, version, cases, results)
    else:
        scope = {"PAYLOAD": json.loads(json.dumps(payload))}
        try:
            exec(SCRIPT, scope)
            compare(mooncake_master, version, cases, json.loads(json.dumps(scope["RESULT"])))
            check_cli(mooncake_master, cases)
        finally:
            for store in scope.get("STORES", []):
                store.store.close()


def check_cli(master, cases: list[dict]) -> None:
    """The diagnosis names the pool and the page; 0.5.23 shows the restorable stop points."""

    def live(case):
        result = hicache(
            [
                "inspect",
                "keys",
                "--tokens",
                ",".join(map(str, case["tokens"])),
                "--page-size",
                str(PAGE),
                "--sglang-version",
                "0.5.23",
                "--master",
                master.metrics_address,
                "--json",
                *POOL_ARGS,
            ]
        )
        return result.exit_code, json.loads(result.stdout)

    by_id = {c["id"]: c for c in cases}
    code, data = live(by_id["complete"])
    assert code == 0 and data["contiguous_pages"] == PAGES and data["diagnosis"] == []
    assert [p["name"] for p in data["pools"]] == ["swa", "draft", "mamba", "indexer"]
    assert data["pools"][2] == {
        "name": "mamba",
        "suffixes": ["_0_temporal", "_0_conv_0", "_0_conv_1"],
        "hit_policy": "trailing_pages",
        "trailing_pages": 1,
    }

    code, data = live(by_id["mamba-never-written"])
    assert code == 1 and data["kv_contiguous_pages"] == PAGES and data["contiguous_pages"] == 0
    (entry,) = data["diagnosis"]
    assert entry["kind"] == "side_pool_missing" and entry["pool"] == "mamba" and entry["pages"] == ALL

    code, data = live(by_id["swa-hole"])
    assert code == 1 and data["restorable_prefix_pages"] == [1, 2, 5, 6]
    (entry,) = data["diagnosis"]
    assert (entry["pool"], entry["page"], entry["trailing_pages"]) == ("swa", 2, SWA_WINDOW)
    assert "1-2, 5-6" in entry["message"]

    human = hicache(
        [
            "inspect",
            "keys",
            "--tokens",
            ",".join(map(str, by_id["swa-hole"]["tokens"])),
            "--page-size",
            str(PAGE),
            "--sglang-version",
            "0.5.23",
            "--master",
            master.metrics_address,
            *POOL_ARGS,
        ]
    )
    assert human.exit_code == 1 and "restorable stop points 1, 2, 5, 6" in human.output
    assert f"loadable prefix 6/{PAGES} pages" in human.output and "side_pool_missing:" in human.output

    code, data = live(by_id["indexer-page-missing"])
    (entry,) = data["diagnosis"]
    assert (entry["pool"], entry["page"], entry["pool_hit_pages"]) == ("indexer", 3, 3) and data[
        "contiguous_pages"
    ] == 3

    code, data = live(by_id["kv-short"])  # the KV diagnosis as before; the side pools are complete
    assert data["contiguous_pages"] == 4 and [d["kind"] for d in data["diagnosis"]] == ["not_found"]


@pytest.mark.parametrize(
    "suffix, rank, component, pool",
    [
        ("_0_temporal", "0", "temporal", "mamba"),
        ("_1_2_conv_3", "1_2", "conv_3", "mamba"),
        ("__draft_k", "", "draft_k", "draft"),
        ("_0_draft_v", "0", "draft_v", "draft"),
        ("_0_draft_swa_k", "0", "draft_swa_k", "draft_swa"),
        ("__draft_swa", "", "draft_swa", "draft_swa"),
        ("_1_swa_v", "1", "swa_v", "swa"),
        ("__swa", "", "swa", "swa"),
        ("_dcp1_cp0_indexer", "dcp1_cp0", "indexer", "indexer"),
        ("_1_deepseek_v4_c4_indexer_state", "1", "deepseek_v4_c4_indexer_state", "deepseek_v4_c4_indexer_state"),
    ],
)
def test_side_pool_objects_parse_with_their_pool(suffix, rank, component, pool):
    page_key = "ab" * 32
    parts = parse_object_key(f"tag_model_{page_key}{suffix}")
    assert (parts.prefix, parts.page_key, parts.rank, parts.kv, parts.pool) == (
        "tag_model_",
        page_key,
        rank,
        component,
        pool,
    )
    assert parts.suffix == suffix
    assert parse_object_key(f"{page_key}_0_k").pool == "kv"
    assert parse_object_key(f"{page_key}_0_draft_x") is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pool", "draft_swa", "--sglang-version", "0.5.14"], "SGLang 0.5.14 has no pool 'draft_swa'"),
        (["--pool", "mamba:conv=2,temporal=0", "--sglang-version", "0.5.14"], "always writes the temporal"),
        (["--pool-preset", "deepseek-v3.2-mtp", "--sglang-version", "0.5.14"], "needs SGLang 0.5.23"),
        (["--pool-preset", "nope"], "unknown pool preset"),
        (["--pool", "swa:window=x"], "window must be a positive integer"),
        (["--pool", "mamba", "--pool", "mamba:conv=2"], "given twice"),
        (["--pool", "mamba", "--layout", "page_head", "--tp-lcm-size", "2"], "split heads"),
    ],
)
def test_bad_pools_are_exit_2(args, message):
    result = hicache(["inspect", "keys", "--tokens", ",".join(map(str, range(32))), "--page-size", str(PAGE), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_human_output_lists_pools_and_presets():
    result = hicache(
        [
            "inspect",
            "keys",
            "--tokens",
            ",".join(map(str, range(32))),
            "--page-size",
            str(PAGE),
            "--sglang-version",
            "0.5.23",
            "--pool-preset",
            "gpt-oss",
        ]
    )
    assert result.exit_code == 0
    assert f"pool swa  trailing_pages (last {-(-128 // PAGE)} page(s))  _0_swa_k, _0_swa_v" in result.output
