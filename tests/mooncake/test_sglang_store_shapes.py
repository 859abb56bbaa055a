"""Every object-key shape, written by SGLang's own MooncakeStore (0.5.14 and 0.5.23) into the
session's real master, found by `hicache inspect keys` under exactly the names it predicts.

Shapes: MLA over two tp ranks (only SGLang's writer rank puts `__k`), pipeline parallel for MHA
(`_{tp}_{pp}_k/_v`) and MLA (`_{pp}_k`), split heads (page_head, tp_lcm_size: ranks `tp*f+i`),
extra_backend_tag with a model name (0.5.23 prefixes both, 0.5.14 only the tag), 0.5.14's
unprefixed keys, and 0.5.23 DCP (`{model}_tp4_dcp2_page16_pp1_cp1_` + `_dcp{d}_cp0_k`).
0.5.23 runs in this process; 0.5.14 runs in a child process (tests/sglang_0_5_14.py) that stays
alive while its objects are checked, since they live in its segment. Host pools are SGLang's
own, on the CPU with pin_memory=False; page keys are SGLang's own.

Then the key builder on hypothesis-drawn single ranks (MHA/MLA, tp/pp sizes and ranks, page_head
with tp_lcm_size, tag, model name, 0.5.23 DCP): the names SGLang's MooncakeStore puts
(`_tag_keys` + `_batch_preprocess`, as `batch_set_v1` composes them) against ObjectKeyScheme.
"""

from __future__ import annotations

import json
import random
import warnings
from array import array
from dataclasses import dataclass

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from cli_runner import hicache
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from sglang_0_5_14 import held_0_5_14, run_0_5_14

PAGE = 16
PAGES = 4
RANK_SEGMENT = 16 << 20  # the least a client may mount
HEADS_PER_RANK = 4  # split by 2 or 4 under page_head


@dataclass(frozen=True)
class Shape:
    id: str
    versions: tuple[str, ...]
    mla: bool = False
    tp: int = 1
    pp: int = 1
    model: str | None = "Qwen/Qwen3-0.6B"
    tag: str | None = None
    layout: str = "page_first"
    tp_lcm: int | None = None
    dcp: int = 1

    def cli_args(self) -> list[str]:
        args = ["--tp-size", str(self.tp), "--pp-size", str(self.pp), "--layout", self.layout]
        if self.model:
            args += ["--model-name", self.model]
        if self.tag:
            args += ["--extra-backend-tag", self.tag]
        if self.mla:
            args.append("--mla")
        if self.tp_lcm:
            args += ["--tp-lcm-size", str(self.tp_lcm)]
        if self.dcp > 1:
            args += ["--dcp-size", str(self.dcp)]
        return args


BOTH = ("0.5.14", "0.5.23")
SHAPES = [
    Shape("mla-tp2", BOTH, mla=True, tp=2, model="deepseek-ai/DeepSeek-V3"),
    Shape("mha-pp2", BOTH, tp=2, pp=2),
    Shape("mla-pp2", BOTH, mla=True, pp=2, model="deepseek-ai/DeepSeek-V3"),
    Shape("split-heads", BOTH, tp=2, layout="page_head", tp_lcm=4),
    Shape("tag-and-model", BOTH, tag="blue"),
    Shape("model-only", BOTH, tp=2),  # 0.5.14: no prefix at all
    Shape("dcp", ("0.5.23",), mla=True, tp=4, model="deepseek-ai/DeepSeek-V3", dcp=2),
]


def shape_payload(version: str, master) -> list[dict]:
    out = []
    for shape in SHAPES:
        if version not in shape.versions:
            continue
        base = random.randrange(10**6, 10**9)
        out.append(
            {
                "id": shape.id,
                "mla": shape.mla,
                "tp": shape.tp,
                "pp": shape.pp,
                "model": shape.model,
                "tag": shape.tag,
                "layout": shape.layout,
                "tp_lcm": shape.tp_lcm,
                "dcp": shape.dcp,
                "tokens": list(range(base, base + PAGES * PAGE + 3)),
                "extra": {
                    "master_server_address": master.rpc_address,
                    "metadata_server": master.metadata_server,
                    "protocol": "tcp",
                    "device_name": "",
                    "global_segment_size": RANK_SEGMENT * shape.tp * shape.pp,
                    "local_hostname": "127.0.0.1",
                    **({"extra_backend_tag": shape.tag} if shape.tag else {}),
                },
            }
        )
    return out


# --- SGLang 0.5.23, in this process -----------------------------------------------------------


def sglang_0_5_23_store(case: dict, tp_rank: int, pp_rank: int):
    """SGLang 0.5.23's MooncakeStore for one rank, over its own CPU host pool, as its controller builds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=2)
    dcp_rank = tp_rank % case["dcp"]
    if case["mla"]:
        device = MLATokenToKVPool(
            PAGES * PAGE * 2, PAGE, torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=2, **common
        )
        host = MLATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info,
            2.0,
            0,
            PAGE,
            case["layout"],
            pin_memory=False,
            device="cpu",
            dcp_size=case["dcp"],
            dcp_rank=dcp_rank,
            device_capacity_tokens=device.size,
            start_layer=0,
            end_layer=2,
            target_layer_num=2,
            override_kv_cache_dim=device.kv_cache_dim,
        )
    else:
        device = MHATokenToKVPool(
            PAGES * PAGE * 2, PAGE, torch.float16, head_num=HEADS_PER_RANK, head_dim=8, layer_num=2, **common
        )
        host = MHATokenToKVPoolHost(
            device.get_device_pool_infos()[0].buffer_info,
            2.0,
            0,
            PAGE,
            case["layout"],
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=device.size,
            start_layer=0,
            end_layer=2,
        )
    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=case["tp"],
        pp_rank=pp_rank,
        pp_size=case["pp"],
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=case["mla"],
        enable_storage_metrics=False,
        is_page_first_layout=case["layout"] == "page_first",
        model_name=case["model"],
        tp_lcm_size=case["tp_lcm"],
        should_split_heads=split_heads(case),
        extra_config=dict(case["extra"]),
        dcp_size=case["dcp"],
        dcp_rank=dcp_rank,
        logical_page_size=PAGE if case["dcp"] > 1 else None,
    )
    store = MooncakeStore(config, host)
    store.register_mem_pool_host(host)
    host.kv_buffer.view(torch.uint8).random_(0, 255)
    return store, config


def split_heads(case: dict) -> bool:
    """should_split_heads as SGLang's controller sets it (_generate_storage_config, both versions)."""
    return bool(case["tp_lcm"]) and not case["mla"] and case["layout"] == "page_head" and case["tp_lcm"] > case["tp"]


def write_0_5_23(case: dict) -> tuple[dict, list]:
    import torch
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    tokens = case["tokens"][: PAGES * PAGE]
    keys = list(get_storage_hash_str(RadixKey(array("q", tokens)), None, page_size=PAGE))
    stores, writers = [], []
    for pp_rank in range(case["pp"]):
        for tp_rank in range(case["tp"]):
            store, config = sglang_0_5_23_store(case, tp_rank, pp_rank)
            stores.append(store)
            if config.is_storage_writer:  # SGLang's own writer rule
                writers.append([tp_rank, pp_rank])
                assert store.batch_set_v1(keys, torch.arange(0, PAGES * PAGE)) == [True] * PAGES
    exists = [store.batch_exists(keys) for store in stores]
    return {"page_keys": keys, "writers": writers, "exists": exists}, stores


# --- SGLang 0.5.14, in a child process --------------------------------------------------------

BUILD_0_5_14 = """
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
from sglang.srt.mem_cache.utils import get_hash_str

PAGE, PAGES, HEADS_PER_RANK = PAYLOAD["page"], PAYLOAD["pages"], PAYLOAD["heads_per_rank"]


def make_store(case, tp_rank, pp_rank):
    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=2)
    if case["mla"]:
        device = MLATokenToKVPool(PAGES * PAGE * 2, PAGE, torch.bfloat16, kv_lora_rank=16, qk_rope_head_dim=8,
                                  layer_num=2, **common)
        host = MLATokenToKVPoolHost(device, 2.0, 0, PAGE, case["layout"], pin_memory=False, device="cpu")
    else:
        device = MHATokenToKVPool(PAGES * PAGE * 2, PAGE, torch.float16, head_num=HEADS_PER_RANK, head_dim=8,
                                  layer_num=2, **common)
        host = MHATokenToKVPoolHost(device, 2.0, 0, PAGE, case["layout"], pin_memory=False, device="cpu")
    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=case["tp"], pp_rank=pp_rank, pp_size=case["pp"], attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=case["mla"], enable_storage_metrics=False,
        is_page_first_layout=case["layout"] == "page_first", model_name=case["model"],
        tp_lcm_size=case["tp_lcm"], should_split_heads=case["split_heads"], extra_config=dict(case["extra"]),
    )
    store = MooncakeStore(config, host)
    store.register_mem_pool_host(host)
    host.kv_buffer.view(torch.uint8).random_(0, 255)
    return store, config
"""

WRITE_0_5_14 = (
    BUILD_0_5_14
    + """
RESULT = {}
STORES = []
for case in PAYLOAD["cases"]:
    tokens = case["tokens"][: PAGES * PAGE]
    keys, prior = [], None
    for start in range(0, len(tokens), PAGE):  # as HiCacheController._storage_hit_query chains them
        prior = get_hash_str(tokens[start : start + PAGE], prior)
        keys.append(prior)
    stores, writers = [], []
    for pp_rank in range(case["pp"]):
        for tp_rank in range(case["tp"]):
            store, config = make_store(case, tp_rank, pp_rank)
            stores.append(store)
            # 0.5.14's writer rule is inline in HiCacheController.__init__ (backup_skip).
            if not (config.is_mla_model and config.tp_rank != 0):
                writers.append([tp_rank, pp_rank])
                assert store.batch_set_v1(keys, torch.arange(0, PAGES * PAGE)) == [True] * PAGES
    RESULT[case["id"]] = {"page_keys": keys, "writers": writers, "exists": [s.batch_exists(keys) for s in stores]}
    STORES.extend(stores)
"""
)

NAMES_0_5_14 = (
    BUILD_0_5_14
    + """
RESULT = []
for case in PAYLOAD["cases"]:
    store, _ = make_store(case, case["tp_rank"], case["pp_rank"])
    try:
        # the names batch_set_v1 puts: the tag prefix, then the suffixes of _batch_preprocess
        indices = torch.arange(0, len(case["page_keys"]) * PAGE)
        RESULT.append(store._batch_preprocess(store._tag_keys(case["page_keys"]), indices)[0])
    finally:
        store.store.close()
"""
)


# --- the comparison ---------------------------------------------------------------------------


def inspect_keys(master, version: str, shape: Shape, tokens, *extra):
    args = [
        "inspect",
        "keys",
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        str(PAGE),
        "--sglang-version",
        version,
        *shape.cli_args(),
        "--master",
        master.metrics_address,
        "--json",
        *extra,
    ]
    result = hicache(args)
    return result.exit_code, json.loads(result.stdout)


def expected_writers(shape: Shape, version: str) -> list[list[int]]:
    """Who writes, as docs/keys.md#writers says (checked here against SGLang's own decision)."""
    ranks = [[tp, pp] for pp in range(shape.pp) for tp in range(shape.tp)]
    if not shape.mla:
        return ranks
    return [[tp, pp] for tp, pp in ranks if tp < shape.dcp]  # 0.5.14: tp 0; 0.5.23: tp_rank == dcp_rank


def check_version(master, version: str, payload: list[dict], results: dict) -> None:
    with AdminClient(master.metrics_address) as admin:
        listing = admin.get_all_keys()
    for case in payload:
        shape = next(s for s in SHAPES if s.id == case["id"])
        got = results[case["id"]]
        assert got["writers"] == expected_writers(shape, version), (version, shape.id)
        assert got["exists"] == [PAGES] * (shape.tp * shape.pp), (version, shape.id)
        code, data = inspect_keys(master, version, shape, case["tokens"])
        assert code == 0, (version, shape.id, data["diagnosis"])
        assert [p["page_key"] for p in data["pages"]] == got["page_keys"], (version, shape.id)
        assert data["contiguous_pages"] == PAGES and data["first_missing"] is None
        written = {k for k in listing if any(pk in k for pk in got["page_keys"])}
        predicted = {k for p in data["pages"] for k in p["object_keys"]}
        assert written == predicted, (version, shape.id, sorted(written ^ predicted)[:6])


def test_every_shape_as_sglang_0_5_23_writes_it(mooncake_master):
    payload = shape_payload("0.5.23", mooncake_master)
    results, stores = {}, []
    try:
        for case in payload:
            results[case["id"]], made = write_0_5_23(case)
            stores += made
        check_version(mooncake_master, "0.5.23", payload, results)

        # The examples of docs/keys.md, on SGLang's own objects.
        dcp = results["dcp"]["page_keys"][0]
        with AdminClient(mooncake_master.metrics_address) as admin:
            assert admin.exists(
                [f"deepseek-ai-DeepSeek-V3_tp4_dcp2_page16_pp1_cp1_{dcp}_dcp{d}_cp0_k" for d in (0, 1)]
            ) == [True, True]
            split = results["split-heads"]["page_keys"][0]
            assert admin.exists([f"Qwen-Qwen3-0.6B_{split}_{r}_{kv}" for r in range(4) for kv in "kv"]) == [True] * 8

        # DCP keys looked up without DCP: the diagnosis says so, and what to pass.
        dcp_case = next(c for c in payload if c["id"] == "dcp")
        no_dcp = Shape("no-dcp", ("0.5.23",), mla=True, tp=4, model="deepseek-ai/DeepSeek-V3")
        code, data = inspect_keys(mooncake_master, "0.5.23", no_dcp, dcp_case["tokens"])
        assert code == 1 and data["contiguous_pages"] == 0
        (entry,) = [d for d in data["diagnosis"] if d["kind"] == "dcp"]
        assert "DCP" in entry["message"] and "--dcp-size 2" in entry["hint"]
        assert entry["contiguous_pages"] == PAGES and entry["suffixes"] == ["_dcp0_cp0_k", "_dcp1_cp0_k"]
        # One DCP shard alone is complete.
        code, data = inspect_keys(mooncake_master, "0.5.23", SHAPES[-1], dcp_case["tokens"], "--dcp-rank", "1")
        objects = [k for p in data["pages"] for k in p["object_keys"]]
        assert code == 0 and len(objects) == PAGES and all(k.endswith("_dcp1_cp0_k") for k in objects)
    finally:
        for store in stores:
            store.store.close()


def test_every_shape_as_sglang_0_5_14_writes_it(mooncake_master):
    payload = shape_payload("0.5.14", mooncake_master)
    for case in payload:
        case["split_heads"] = split_heads(case)
    with held_0_5_14(
        WRITE_0_5_14, {"page": PAGE, "pages": PAGES, "heads_per_rank": HEADS_PER_RANK, "cases": payload}
    ) as results:
        check_version(mooncake_master, "0.5.14", payload, results)
        # 0.5.14 puts no model name in keys: the model-only shape is unprefixed.
        bare = results["model-only"]["page_keys"][0]
        tagged = results["tag-and-model"]["page_keys"][0]
        with AdminClient(mooncake_master.metrics_address) as admin:
            assert admin.exists([f"{bare}_0_k", f"{bare}_1_v", f"blue_{tagged}_0_k"]) == [True] * 3
        # Looked up as 0.5.23 names them, the diagnosis points at 0.5.14.
        case = next(c for c in payload if c["id"] == "model-only")
        code, data = inspect_keys(mooncake_master, "0.5.23", SHAPES[5], case["tokens"])
        assert code == 1
        (entry,) = [d for d in data["diagnosis"] if d["kind"] == "other_version"]
        assert entry["sglang_releases"] == "0.5.14 to 0.5.16" and entry["contiguous_pages"] == PAGES


# --- the key builder on drawn deployments (hypothesis), both versions --------------------------


@st.composite
def rank_configs(draw_, version: str):
    mla = draw_(st.booleans())
    dcp = draw_(st.sampled_from([1, 2])) if mla and version == "0.5.23" else 1
    tp = draw_(st.sampled_from([t for t in (1, 2, 4) if t % dcp == 0]))
    pp = draw_(st.integers(1, 3))
    layout = "page_first" if mla else draw_(st.sampled_from(["page_first", "page_head"]))
    return {
        "mla": mla,
        "tp": tp,
        "tp_rank": draw_(st.integers(0, tp - 1)),
        "pp": pp,
        "pp_rank": draw_(st.integers(0, pp - 1)),
        "layout": layout,
        "tp_lcm": draw_(st.sampled_from([None, tp, 2 * tp, 4 * tp])),
        "dcp": dcp,
        "model": draw_(st.sampled_from([None, "", "org/model-1.5B", "plain"])),
        "tag": draw_(st.sampled_from([None, "t1", "blue_green"])),
    }


def drawn_configs(version: str, master, count: int) -> list[dict]:
    configs: list[dict] = []

    # derandomize: the same draws every run, so the coverage asserted below is stable
    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate], derandomize=True)
    @given(rank_configs(version))
    def collect(config):
        configs.append(config)

    collect()
    for config in configs:
        config["split_heads"] = split_heads(config)
        config["page_keys"] = [f"{random.getrandbits(256):064x}" for _ in range(2)]
        config["extra"] = {
            "master_server_address": master.rpc_address,
            "metadata_server": master.metadata_server,
            "protocol": "tcp",
            "device_name": "",
            "global_segment_size": RANK_SEGMENT * config["tp"] * config["pp"],
            "local_hostname": "127.0.0.1",
            **({"extra_backend_tag": config["tag"]} if config["tag"] else {}),
        }
    return configs


def our_names(version: str, config: dict) -> list[str]:
    scheme = ObjectKeyScheme(
        version,
        model_name=config["model"],
        extra_backend_tag=config["tag"],
        tp_rank=config["tp_rank"],
        tp_size=config["tp"],
        pp_rank=config["pp_rank"],
        pp_size=config["pp"],
        mla=config["mla"],
        layout=config["layout"],
        tp_lcm_size=config["tp_lcm"],
        dcp_size=config["dcp"],
        page_size=PAGE,
    )
    return scheme.all_object_keys(config["page_keys"])


def test_key_builder_matches_sglang_0_5_23(mooncake_master):
    import torch

    configs = drawn_configs("0.5.23", mooncake_master, 30)
    assert any(c["split_heads"] for c in configs) and any(c["dcp"] > 1 for c in configs)
    for config in configs:
        store, _ = sglang_0_5_23_store(config, config["tp_rank"], config["pp_rank"])
        try:
            theirs = store._batch_preprocess(store._tag_keys(config["page_keys"]), torch.arange(0, 2 * PAGE))[0]
        finally:
            store.store.close()
        assert our_names("0.5.23", config) == theirs, config


def test_key_builder_matches_sglang_0_5_14(mooncake_master):
    configs = drawn_configs("0.5.14", mooncake_master, 30)
    assert any(c["split_heads"] for c in configs) and any(c["tag"] for c in configs)
    payload = {"page": PAGE, "pages": PAGES, "heads_per_rank": HEADS_PER_RANK, "cases": configs}
    for config, theirs in zip(configs, run_0_5_14(NAMES_0_5_14, payload), strict=True):
        assert our_names("0.5.14", config) == theirs, config
