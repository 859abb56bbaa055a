"""`--sglang-url` with SGLang 0.5.23's L3 object layout (docs/side-pools.md#l3-layout-endpoint).

Every layout served here is SGLang's own: a real 0.5.23 `MooncakeStore` on the session's real
master, over SGLang's MLA host pools built on the CPU, with side pools registered, answers
`describe_l3_object_layout`; the route's shape comes from `merge_l3_layouts` / `disabled_l3_layout`
as `http_server.py` applies them. The server-info body is 0.5.23's own (from
`tests/sglang_server.py`). The DSA indexer and SWA pools are not built here (the indexer needs an NSA device
pool): SGLang's store sees them through stand-ins that carry what its key builder reads (nothing
but the registration), and this test puts their objects under the names the layout lists. SGLang
writes the KV and the MLA draft pool itself. Its `batch_exists_v2`, queried with the layout's hit
policies, is the oracle for the live diff's loadable prefix.
Only the malformed-reply tests type a reply by hand.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import types
import warnings
from array import array

import pytest

from cli_runner import hicache
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.sglang.l3_layout import flat_suffixes, parse_l3_layout, rule_disagreements
from hicache_ops.sglang.page_keys import Deployment
from hicache_ops.sglang.side_pool_specs import PoolSpec, pool_suffixes
from sglang_server import FakeRoutes, HttpServer, body_0_5_23, json_route, write_tiny_model

PAGE = 16
PAGES = 6
SWA_WINDOW = 2
MODEL = "org/m"
SIDE = ("indexer", "swa", "draft")


def extra(master, pp_size: int) -> dict:
    # SGLang divides the global segment among the ranks; each needs the least a client may mount.
    return {
        "master_server_address": master.rpc_address, "metadata_server": master.metadata_server, "protocol": "tcp",
        "device_name": "", "global_segment_size": (16 << 20) * pp_size, "local_hostname": "127.0.0.1",
    }  # fmt: skip


def host_pool(mla: bool):
    """SGLang 0.5.23's own CPU host pool (MLA or MHA) over its device pool."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=2)
    if mla:
        device = MLATokenToKVPool(PAGES * PAGE * 2, PAGE, torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
                                  layer_num=2, **common)  # fmt: skip
        host = MLATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info,
            2.0,
            0,
            PAGE,
            "page_first",
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=device.size,
            start_layer=0,
            end_layer=2,
            target_layer_num=2,
            override_kv_cache_dim=device.kv_cache_dim,
        )
    else:
        device = MHATokenToKVPool(PAGES * PAGE * 2, PAGE, torch.float16, head_num=4, head_dim=8, layer_num=2, **common)
        host = MHATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info,
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
    host.kv_buffer.view(torch.uint8).random_(0, 255)
    return host


def sglang_store(master, *, mla=True, pp_size=1, pp_rank=0, side=SIDE):
    """SGLang 0.5.23's MooncakeStore for tp rank 0 of one pipeline stage, side pools registered."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    kv = host_pool(mla)
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=MODEL, extra_config=extra(master, pp_size),
    )  # fmt: skip
    store = MooncakeStore(config, kv)
    store.register_mem_pool_host(kv)
    for name in side:
        if name == "draft":
            store.register_mem_host_pool_v2(host_pool(mla), PoolName.DRAFT)
        elif name == "mamba":  # what the key builder reads of a Mamba host pool
            store.registered_pools[PoolName.MAMBA] = types.SimpleNamespace(
                conv_buffer=[None], temporal_state_elem_size=1
            )
        else:
            store.registered_pools[PoolName(name)] = types.SimpleNamespace()
    return store


def route_reply(stores) -> dict:
    """What GET /get_hicache_l3_cache_layout answers for these schedulers (http_server.py's route)."""
    from fastapi.encoders import jsonable_encoder
    from sglang.srt.mem_cache.hicache_storage import disabled_l3_layout, merge_l3_layouts
    from sglang.srt.utils.msgspec_utils import msgspec_to_builtins

    layouts = [
        msgspec_to_builtins(
            s.describe_l3_object_layout(sidecar_pool_specs=(), swa_trailing_pages=SWA_WINDOW, page_size=PAGE)
        )
        for s in stores
    ]
    return jsonable_encoder(merge_l3_layouts(layouts) or disabled_l3_layout("No scheduler layout replies"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def info_body(model_dir):
    """0.5.23's server-info body for the deployment the stores belong to (no layout inside)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = ["--model-path", model_dir, "--device", "cpu", "--page-size", str(PAGE), "--served-model-name", MODEL,
            "--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake",
            "--hicache-mem-layout", "page_first"]  # fmt: skip
    body = body_0_5_23(argv, {"status": "ready", "max_total_num_tokens": 20000})
    assert "hicache_object_layout" not in body  # so the layout route is asked
    return body


@pytest.fixture
def sglang_server(info_body):
    """sglang_server(layout reply) -> URL of a loopback server answering /server_info and the layout route."""
    servers = []

    def start(reply):
        server = HttpServer({"/server_info": json_route(info_body), "/get_hicache_l3_cache_layout": json_route(reply)})
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def mla_store(mooncake_master, mooncake_segment_owner):
    store = sglang_store(mooncake_master)
    yield store
    store.store.close()


def run_json(args: list[str]):
    result = hicache([*args, "--json"])
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def tokens_arg(tokens: list[int]) -> str:
    return ",".join(map(str, tokens))


# --- the layout against our key rule -------------------------------------------------------------


@pytest.mark.parametrize("pp_size", [1, 2])
def test_layout_pools_equal_our_key_rule(mooncake_master, mooncake_segment_owner, pp_size):
    stores = [sglang_store(mooncake_master, pp_size=pp_size, pp_rank=pp) for pp in range(pp_size)]
    try:
        reply = route_reply(stores)
    finally:
        for store in stores:
            store.store.close()
    assert reply["enabled"] is True, reply
    layout = parse_l3_layout(reply)
    deployment = Deployment("0.5.23", model_name=MODEL, mla=True, pp_size=pp_size, page_size=PAGE)
    schemes = {s.pp_rank: s for s in deployment.schemes(every_rank=True)}
    assert layout.key_prefix == "org-m" and layout.is_mla and layout.pp_size == pp_size
    assert flat_suffixes(layout.kv_suffixes) == [s for pp in range(pp_size) for s in schemes[pp].suffixes]
    assert [p.name for p in layout.side_pools] == list(SIDE)
    for spec in layout.side_pools:
        ours = [s for pp in range(pp_size) for s in pool_suffixes(PoolSpec(spec.name), schemes[pp])]
        assert flat_suffixes(spec.served) == ours, spec.name
        assert spec.hit_policy == PoolSpec(spec.name).hit_policy
    assert [p.trailing_pages for p in layout.side_pools] == [None, SWA_WINDOW, None]
    assert rule_disagreements(layout, deployment) == []


# --- the live diff with the server's pools ---------------------------------------------------------

# Which pages each pool holds in each case.
CASES = {
    "complete": {},
    "swa-hole": {"swa": [0, 1, 3, 4, 5]},
    "indexer-page-missing": {"indexer": [0, 1, 2, 4, 5]},
    "draft-short": {"draft": [0, 1, 2]},
    "kv-short": {"kv": [0, 1, 2, 3]},
}


def write_case(store, client, reply: dict, case: dict) -> list[str]:
    """SGLang writes the KV and the draft pool; the stand-in pools' objects go under the layout's names."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    keys = list(get_storage_hash_str(RadixKey(array("q", case["tokens"])), None, page_size=PAGE))

    def on_pages(pages):
        picked = [keys[i] for i in pages]
        return picked, torch.cat([torch.arange(i * PAGE, (i + 1) * PAGE) for i in pages])

    picked, indices = on_pages(case["kv"])
    assert store.batch_set_v1(picked, indices) == [True] * len(picked)
    picked, indices = on_pages(case["draft"])
    store.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, keys=picked, host_indices=indices)])
    inner = reply["hicache_object_layout"]
    for pool in inner["pools"]:
        if pool["pool"] in ("indexer", "swa"):
            for i in case[pool["pool"]]:
                for suffix in pool["suffixes"]:
                    client.put(f"{inner['key_prefix']}_{keys[i]}{suffix}", b"side")
    return keys


def sglang_lookup(store, reply: dict, keys: list[str]) -> dict:
    """SGLang's batch_exists_v2 over the layout's side pools, with their hit policies and windows."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    query = []
    for pool in reply["hicache_object_layout"]["pools"]:
        if pool["pool"] == "kv":
            continue
        if pool["hit_policy"] == "trailing_pages":
            window = pool["trailing_pages"]
            query.append(
                PoolTransfer(name=PoolName(pool["pool"]), keys=keys[-window:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
            )
        else:
            query.append(PoolTransfer(name=PoolName(pool["pool"])))
    result = store.batch_exists_v2(keys, query)
    hits = {str(k): v for k, v in result.extra_pool_hit_pages.items() if str(k) != "kv"}
    return {"pages": result.kv_hit_pages, "hits": hits, "restorable": result.restorable_prefix_pages}


def test_live_diff_with_the_servers_pools_matches_batch_exists_v2(mooncake_master, mla_store, sglang_server):
    reply = route_reply([mla_store])
    url = sglang_server(reply)
    client = StoreClient.connect(mooncake_master.rpc_address)
    try:
        for name, holds in CASES.items():
            base = random.randrange(10**6, 10**9)
            case = {"tokens": list(range(base, base + PAGES * PAGE))}
            for pool in ("kv", *SIDE):
                case[pool] = holds.get(pool, list(range(PAGES)))
            keys = write_case(mla_store, client, reply, case)
            want = sglang_lookup(mla_store, reply, keys)
            res, data = run_json(["inspect", "keys", "--tokens", tokens_arg(case["tokens"]), "--sglang-url", url,
                                  "--master", mooncake_master.metrics_address])  # fmt: skip
            assert res.exit_code == (0 if name == "complete" else 1), (name, res.output)
            assert data["pool_source"] == "l3_layout" and data["pool_disagreements"] == []
            assert data["l3_layout"]["rule_disagreements"] == []
            assert [p["name"] for p in data["pools"]] == list(SIDE)
            assert [p["page_key"] for p in data["pages"]] == keys
            assert data["contiguous_pages"] == want["pages"], (name, want)
            assert data["pool_hit_pages"] == want["hits"], (name, want)
            assert data["restorable_prefix_pages"] == want["restorable"], (name, want)
    finally:
        client.close()
    human = hicache(["inspect", "keys", "--tokens", tokens_arg(case["tokens"]), "--sglang-url", url])
    assert human.exit_code == 0, human.output
    assert "side pools from the server's L3 layout" in human.stdout
    assert f"pool swa  trailing_pages (last {SWA_WINDOW} page(s))  __swa" in human.stdout


def test_store_checks_the_servers_pools(fresh_mooncake_master, sglang_server):
    """A master of its own, so every count is this prompt's."""
    master = fresh_mooncake_master
    store = sglang_store(master)
    client = StoreClient.connect(master.rpc_address)
    try:
        reply = route_reply([store])
        url = sglang_server(reply)
        base = random.randrange(10**6, 10**9)
        case = {"tokens": list(range(base, base + PAGES * PAGE)), "kv": list(range(PAGES)), "draft": [0, 1, 2, 3],
                "indexer": [0, 1, 2], "swa": list(range(PAGES - 1))}  # fmt: skip
        write_case(store, client, reply, case)
        res, data = run_json(["inspect", "store", "--master", master.metrics_address, "--sglang-url", url])
        human = hicache(["inspect", "store", "--master", master.metrics_address, "--sglang-url", url])
    finally:
        client.close()
        store.store.close()
    assert res.exit_code == 0, res.output
    assert data["pool_source"] == "l3_layout" and data["server_pools"]["key_prefix"] == "org-m"
    pools = {p["pool"]: p for p in data["server_pools"]["pools"]}
    assert list(pools) == ["kv", *SIDE]
    got = {
        name: (p["suffixes"], p["pages"], p["complete_pages"], p.get("kv_pages_without_pool"))
        for name, p in pools.items()
    }
    assert got == {
        "kv": (["__k"], PAGES, PAGES, None),
        "indexer": (["__indexer"], 3, 3, PAGES - 3),
        "swa": (["__swa"], PAGES - 1, PAGES - 1, 1),
        "draft": (["__draft_k"], 4, 4, PAGES - 4),
    }
    assert pools["swa"]["trailing_pages"] == SWA_WINDOW
    assert human.exit_code == 0, human.output
    assert "pools from the server's L3 layout, key prefix org-m" in human.stdout
    assert f"pool swa  trailing_pages (last {SWA_WINDOW} page(s))  {PAGES - 1} pages" in human.stdout


# --- disagreements and fallbacks ----------------------------------------------------------------


def test_pool_flags_that_disagree_are_listed_and_the_servers_win(mla_store, sglang_server):
    url = sglang_server(route_reply([mla_store]))
    args = ["inspect", "keys", "--tokens", tokens_arg(list(range(PAGE * 2))), "--sglang-url", url,
            "--pool", "swa:window=4", "--pool", "draft:attention=mha", "--pool", "indexer"]  # fmt: skip
    res, data = run_json(args + ["--pool", "deepseek_v4_c4"])
    assert res.exit_code == 0, res.output
    assert data["pool_source"] == "l3_layout"
    assert data["pool_disagreements"] == [
        {"pool": "swa", "field": "trailing_pages", "server": SWA_WINDOW, "flag": 4},
        {"pool": "draft", "field": "suffixes", "server": ["__draft_k"], "flag": ["_0_draft_k", "_0_draft_v"]},
        {"pool": "deepseek_v4_c4", "field": "pool", "server": False, "flag": True},
    ]
    assert [(p["name"], p["trailing_pages"]) for p in data["pools"]] == [
        ("indexer", None),
        ("swa", SWA_WINDOW),
        ("draft", None),
    ]
    assert all(
        key.endswith(("__k", "__indexer", "__swa", "__draft_k"))
        for page in data["pages"]
        for key in page["object_keys"]
    )
    human = hicache(args)
    assert human.exit_code == 0, human.output
    assert "side pools from the server's L3 layout" in human.stdout
    assert f"pool disagreement swa trailing_pages: server {SWA_WINDOW}, --pool 4; using the server's" in human.stdout


def test_a_layout_suffix_that_differs_from_our_rule_is_reported_and_used(mla_store, sglang_server):
    reply = route_reply([mla_store])
    # The one hand edit: SGLang's own reply with the SWA suffix changed, as a newer server might name it.
    # The hand edits: SGLang's own reply with the SWA suffix changed and the indexer renamed, as a
    # newer server might name them.
    pools = {p["pool"]: p for p in reply["hicache_object_layout"]["pools"]}
    pools["swa"]["suffixes"] = ["__swa_v2"]
    pools["indexer"].update(pool="indexer_v2", suffixes=["__indexer_v2"])
    args = ["inspect", "keys", "--tokens", tokens_arg(list(range(PAGE))), "--sglang-url", sglang_server(reply)]
    res, data = run_json(args)
    assert res.exit_code == 0, res.output
    assert data["l3_layout"]["rule_disagreements"] == [
        {"pool": "indexer_v2", "field": "pool", "server": "indexer_v2", "rule": None},
        {"pool": "swa", "field": "suffixes", "server": ["__swa_v2"], "rule": ["__swa"]},
    ]
    (page,) = data["pages"]
    assert page["object_keys"][1:3] == [f"org-m_{page['page_key']}__indexer_v2", f"org-m_{page['page_key']}__swa_v2"]
    human = " ".join(hicache(args).stdout.split())  # rows wrap at the terminal's width
    assert "layout vs key rule swa suffixes: server __swa_v2, our rule __swa; using the server's" in human
    assert "layout vs key rule indexer_v2: a pool this toolkit has no key rule for" in human


@pytest.mark.parametrize(
    "mla, side, reason",
    [
        (False, ("swa",), "External L3 lookup requires rank-replicated/MLA pools"),
        (True, ("mamba",), "Auxiliary L3 pools are not rank-replicated/MLA"),
    ],
)
def test_a_disabled_layout_falls_back_to_the_flags_with_its_reason(
    mooncake_master, mooncake_segment_owner, sglang_server, mla, side, reason
):
    store = sglang_store(mooncake_master, mla=mla, side=side)
    try:
        reply = route_reply([store])
    finally:
        store.store.close()
    assert reply["enabled"] is False and reply["reason"] == reason
    url = sglang_server(reply)
    args = ["inspect", "keys", "--tokens", tokens_arg(list(range(PAGE))), "--sglang-url", url, "--pool", "indexer"]
    res, data = run_json(args)
    assert res.exit_code == 0, res.output
    assert data["pool_source"] == "flags" and data["l3_layout"]["enabled"] is False
    assert data["l3_layout"]["reason"] == reason and [p["name"] for p in data["pools"]] == ["indexer"]
    assert data["server_disagreements"] == []
    human = hicache(args)
    assert f"note: the server's L3 layout is disabled ({reason}); side pools come from --pool flags." in human.stderr
    assert "side pools from --pool flags" in human.stdout
    res, data = run_json(["inspect", "store", "--master", mooncake_master.metrics_address, "--sglang-url", url])
    assert res.exit_code == 0, res.output
    assert data["server_pools"] is None and data["pool_source"] is None
    assert data["l3_layout_note"] == f"the server's L3 layout is disabled ({reason}); no pools to check."


# --- bad replies -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, message",
    [
        ({"enabled": "yes"}, "no boolean 'enabled'"),
        ({"enabled": True, "hicache_object_layout": {"pools": {}}}, "no hicache_object_layout with a list of pools"),
        ({"enabled": True, "hicache_object_layout": {
            "pools": [{"pool": "swa", "suffixes": ["__swa"], "hit_policy": "trailing_pages"}]}},
         "pool swa is trailing_pages without a positive trailing_pages count"),
        ({"enabled": True, "hicache_object_layout": {
            "pools": [{"pool": "x", "suffixes": ["__x"], "hit_policy": "block_groups"}]}},
         "pool x has hit policy 'block_groups'"),
        ({"enabled": True, "hicache_object_layout": {"pp_size": 2, "pp_rank": None,
                                                     "pools": [{"pool": "kv", "suffixes": ["_0_k"],
                                                                "hit_policy": "all_pages"}]}},
         "pool kv is listed 1 time(s) for 2 pipeline stage(s)"),
    ],
)  # fmt: skip
def test_a_malformed_layout_is_exit_2(sglang_server, reply, message):
    url = sglang_server(reply)
    res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", url])
    assert res.exit_code == 2, res.output
    (error,) = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: the server's L3 layout reply is malformed: ") and message in error
    assert "Traceback" not in res.output


class StallingRoutes(FakeRoutes):
    """Answers like FakeRoutes, except that the layout route waits until the test releases it."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/get_hicache_l3_cache_layout":
            self.server.release.wait(30)
            return
        super().do_GET()


def test_a_silent_layout_route_is_exit_3_within_the_timeout(info_body):
    server = HttpServer({"/server_info": json_route(info_body)}, StallingRoutes)
    server.httpd.release = threading.Event()
    try:
        start = time.monotonic()
        res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", server.url, "--timeout", "0.5"])
        waited = time.monotonic() - start
    finally:
        server.httpd.release.set()
        server.stop()
    assert res.exit_code == 3, res.output
    assert "did not answer /get_hicache_l3_cache_layout within 0.5 s" in res.stderr
    assert waited < 30  # bounded by --timeout, not a hang
