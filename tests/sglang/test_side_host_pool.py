"""Side host pools (docs/side-pools.md#side-host-pools) against SGLang's own host pool classes,
built on the CPU (pin_memory=False): 0.5.23 in this process, 0.5.14 in one child process.

Built for real in both versions: `MambaPoolHost` (0.5.23 from a `MambaStateBufferInfo` of CPU
tensors, 0.5.14 from a real CPU `MambaPool`), the MHA/MLA host pools that hold `swa`, `draft`
and (0.5.23) `draft_swa`, and `DSAIndexerPoolHost` on a real CPU `DSATokenToKVPool` with its MLA
anchor host pool (`indexer`, 0.5.23 `draft_indexer`). SGLang's assembler functions that pick the
draft sizes allocate pinned memory (CUDA), so the draft pools are built from the classes with the
arguments those functions pass (0.5.23: host_token_capacity = the KV host pool's slots; 0.5.14 and
draft_swa: ratio = target host slots / draft device slots). Compared: size, pages, bytes per slot,
every buffer's shape and dtype, and `get_page_buffer_meta` as offsets from each buffer's start.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import strategies as st
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402

from cli_runner import hicache
from hicache_ops.cli.common.output import json_data
from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import PRESETS as PRESETS_GEOMETRY
from hicache_ops.sglang.geometry import ModelGeometry
from hicache_ops.sglang.host_pool import HostPoolLayout
from hicache_ops.sglang.side_host_pool import side_host_pools
from hicache_ops.sglang.side_pool_specs import PRESETS, PoolSpec, parse_pool
from sglang_0_5_14 import draw, run_0_5_14

BUDGET = 1 << 40  # SGLang's own budget scope: tiny pools must not depend on this machine's free memory
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --- the cases (plain dicts: the 0.5.14 child gets them as JSON) --------------------------------


@st.composite
def mamba_cases(draw_, version="0.5.23"):
    tp = draw_(st.sampled_from([1, 2]))
    conv = draw_(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=3))
    temporal = draw_(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4))))
    if version == "0.5.14" and temporal is None:
        temporal = (1, 2, 2)  # 0.5.14 always keys the temporal state
    sized = draw_(st.booleans()) and version == "0.5.14"
    return {
        "kind": "mamba",
        "tp": tp,
        "layers": draw_(st.integers(1, 3)),
        "slots": draw_(st.integers(1, 9)),
        "conv_shapes": [[a * tp, b] for a, b in conv],
        "temporal_shape": None if temporal is None else [temporal[0] * tp, *temporal[1:]],
        "conv_dtype": draw_(st.sampled_from(sorted(DTYPES))),
        "temporal_dtype": draw_(st.sampled_from(sorted(DTYPES))),
        "ratio": draw_(st.sampled_from([1.5, 2.0, 3.3])),
        "size_gb": 1e-6 * draw_(st.integers(2, 9)) if sized else 0,
        "layout": "page_first_direct"
        if version == "0.5.14"
        else draw_(st.sampled_from(["page_first", "page_first_direct"])),
    }


def kv_case(
    kind, mla, layout, *, page_size=4, device_tokens=40, tokens=None, ratio=2.0, layers=2, heads=None, size_gb=0
):
    return {
        "kind": kind,
        "mla": mla,
        "layout": layout,
        "page_size": page_size,
        "device_tokens": device_tokens,
        "tokens": tokens,
        "ratio": ratio,
        "layers": layers,
        "heads": heads,
        "size_gb": size_gb,
    }


def kv_cases(version):
    out = []
    for layout in ("layer_first", "page_first", "page_first_direct", "page_head"):
        out.append(kv_case("swa", False, layout, tokens=24, layers=1))
        out.append(kv_case("draft", False, layout, ratio=1.5))
        out.append(kv_case("draft", False, layout, page_size=1, device_tokens=9, ratio=2.5, heads=4))
        if version == "0.5.23":
            out.append(kv_case("draft_swa", False, layout, tokens=20, layers=2))
    for layout in ("layer_first", "page_first", "page_first_direct"):
        out.append(kv_case("swa", True, layout, tokens=16, ratio=3.3))
        out.append(kv_case("draft", True, layout, page_size=8, device_tokens=64))
    if version == "0.5.14":  # --hicache-size gives the SWA pool the whole size in 0.5.14
        out.append(kv_case("swa", False, "page_first", tokens=24, size_gb=1e-5))
    return out


def indexer_cases(version):
    out = [
        {"kind": "indexer", "layout": layout, "layers": layers, "device_tokens": 256, "ratio": ratio}
        for layout in ("layer_first", "page_first", "page_first_direct")
        for layers, ratio in ((2, 2.0), (1, 1.5))
    ]
    if version == "0.5.23":
        out += [
            {"kind": "draft_indexer", "layout": layout, "layers": 2, "device_tokens": 192, "ratio": 2.0}
            for layout in ("page_first", "page_first_direct")
        ]
    return out


# --- ours ---------------------------------------------------------------------------------------


def main_geometry(case) -> ModelGeometry:
    if case["kind"] == "indexer":
        return ModelGeometry.mla_model(case["layers"], 16, 8, "bfloat16")
    if case["kind"] == "draft_indexer" or case["mla"]:
        return ModelGeometry.mla_model(3, 16, 8, "bfloat16")
    return ModelGeometry.mha(3, 2, 8, "bfloat16")


def ours(case, version):
    kind = case["kind"]
    if kind == "mamba":
        kv = HostPoolLayout(
            ModelGeometry.mha(1, case["tp"], 4),
            case["layout"],
            4,
            64,
            hicache_ratio=case["ratio"],
            hicache_size_gb=case["size_gb"],
            tp_size=case["tp"],
            sglang_version=version,
        )
        spec = PoolSpec(
            "mamba",
            conv=len(case["conv_shapes"]),
            temporal=case["temporal_shape"] is not None,
            layers=case["layers"],
            tokens=case["slots"],
            conv_shapes=tuple(tuple(s) for s in case["conv_shapes"]),
            temporal_shape=tuple(case["temporal_shape"]) if case["temporal_shape"] else None,
            conv_dtype=case["conv_dtype"],
            temporal_dtype=case["temporal_dtype"],
        )
        specs = [spec]
    elif kind in ("indexer", "draft_indexer"):
        kv = HostPoolLayout(
            main_geometry(case),
            case["layout"],
            64,
            case["device_tokens"],
            hicache_ratio=case["ratio"],
            sglang_version=version,
        )
        specs = [PoolSpec(kind, layers=case["layers"] if kind == "draft_indexer" else None)]
    else:
        kv = HostPoolLayout(
            main_geometry(case),
            case["layout"],
            case["page_size"],
            case["device_tokens"],
            hicache_ratio=case["ratio"],
            hicache_size_gb=case["size_gb"],
            sglang_version=version,
        )
        attention = ("mla" if case["mla"] else "mha") if kind != "swa" else None
        specs = [PoolSpec(kind, attention=attention, layers=case["layers"], tokens=case["tokens"], heads=case["heads"])]
        if kind == "draft_swa":
            specs.insert(0, PoolSpec("swa", tokens=case["tokens"]))
    pools, _ = side_host_pools(specs, kv)
    return kv, pools[-1]


def pages_of(pool) -> list[int]:
    return sorted({0, 1, pool.page_num // 2, pool.page_num - 1} & set(range(pool.page_num)))


def summary(pool) -> dict:
    """What the oracle reports, from our side: sizes, buffers by name, page ranges per buffer."""
    meta = [
        [o.range.buffer, o.range.offset, o.range.size] for m in pool.page_buffer_meta(pages_of(pool)) for o in m.objects
    ]
    return {
        "size": pool.size,
        "page_num": pool.page_num,
        "size_per_token": pool.bytes_per_slot,
        "buffers": {b.name: [list(b.shape), b.dtype] for b in pool.buffers},
        "meta": meta if pool.zero_copy else None,
    }


# --- SGLang 0.5.23 ------------------------------------------------------------------------------


def dtype_name(t) -> str:
    return str(t).removeprefix("torch.")


def oracle_summary(host, buffers: dict, pages, page_size, meta_ok=True) -> dict:
    """SGLang's host pool as `summary` reports ours; each pointer is named by the buffer it lies in."""
    out = {
        "size": host.size,
        "page_num": host.page_num,
        "size_per_token": host.size_per_token,
        "buffers": {name: [list(t.shape), dtype_name(t.dtype)] for name, t in buffers.items()},
        "meta": None,
    }
    if meta_ok:
        indices = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])
        ptrs, sizes = host.get_page_buffer_meta(indices)
        spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes, name) for name, t in buffers.items() if t.numel())
        meta = []
        for ptr, size in zip(ptrs, sizes, strict=True):
            name, start = next((n, s) for s, e, n in spans if s <= ptr < e)
            meta.append([name, ptr - start, size])
        out["meta"] = meta
    return out


def mha_or_mla_device(mla, tokens, page_size, layers, heads=2, head_dim=8):
    if mla:
        return MLATokenToKVPool(tokens, page_size, torch.bfloat16, 16, 8, layers, "cpu", False)
    return MHATokenToKVPool(tokens, page_size, torch.bfloat16, heads, head_dim, layers, "cpu", False)


def host_of(dev, mla, ratio, size_gb, page_size, layout, **extra):
    info = dev.get_device_pool_infos()[0].buffer_info
    common = dict(
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=dev.size,
        start_layer=dev.start_layer,
        end_layer=dev.end_layer,
        **extra,
    )
    if mla:
        return MLATokenToKVPoolHost(
            info,
            ratio,
            size_gb,
            page_size,
            layout,
            target_layer_num=dev.layer_num,
            override_kv_cache_dim=dev.kv_cache_dim,
            **common,
        )
    return MHATokenToKVPoolHost(info, ratio, size_gb, page_size, layout, **common)


def sglang_0_5_23(case, pool) -> dict:
    kind = case["kind"]
    with host_memory_budget_scope(BUDGET):
        if kind == "mamba":
            L, slots = case["layers"], case["slots"]
            per_rank = lambda s: [s[0] // case["tp"], *s[1:]]  # noqa: E731 - SGLang's device pool is per rank
            temporal = per_rank(case["temporal_shape"]) if case["temporal_shape"] else [0]
            info = MambaStateBufferInfo(
                temporal=torch.zeros(L, slots + 1, *temporal, dtype=DTYPES[case["temporal_dtype"]]),
                conv=tuple(
                    torch.zeros(L, slots + 1, *per_rank(s), dtype=DTYPES[case["conv_dtype"]])
                    for s in case["conv_shapes"]
                ),
            )
            host = MambaPoolHost(
                info, case["ratio"], 0, device_capacity=slots, pin_memory=False, device="cpu", layout=case["layout"]
            )
            buffers = {
                "temporal_buffer": host.temporal_buffer,
                **{f"conv_buffer[{i}]": b for i, b in enumerate(host.conv_buffer)},
            }
            return oracle_summary(host, buffers, pages_of(pool), 1)
        if kind in ("indexer", "draft_indexer"):

            def dsa_device(layers):
                return DSATokenToKVPool(
                    size=case["device_tokens"],
                    page_size=64,
                    kv_lora_rank=16,
                    dtype=torch.bfloat16,
                    qk_rope_head_dim=8,
                    layer_num=layers,
                    device="cpu",
                    index_head_dim=128,
                    enable_memory_saver=False,
                    kv_cache_dim=24,
                    index_buf_size=case["device_tokens"],  # its default asks the parallel state for the DCP size
                )

            dev = dsa_device(case["layers"] if kind == "indexer" else 3)
            anchor = host_of(dev, True, case["ratio"], 0, 64, case["layout"])
            name = PoolName.INDEXER
            if kind == "draft_indexer":  # the draft's own DSA pool, laid on a draft host pool of the KV's slots
                dev = dsa_device(case["layers"])
                anchor = host_of(
                    dev, True, anchor.size / dev.size, 0, 64, case["layout"], host_token_capacity=anchor.size
                )
                name = PoolName.DRAFT_INDEXER
            host = DSAIndexerPoolHost(
                make_dsa_indexer_pool_decl(dev, name=name), anchor, pin_memory=False, device="cpu"
            )
            return oracle_summary(
                host,
                {"index_k_with_scale_buffer": host.index_k_with_scale_buffer},
                pages_of(pool),
                64,
                meta_ok=case["layout"] != "layer_first",
            )
        mla, ps = case["mla"], case["page_size"]
        main = host_of(mha_or_mla_device(mla, case["device_tokens"], ps, 3), mla, case["ratio"], 0, ps, case["layout"])
        heads = case["heads"] or 2
        if kind == "swa":
            dev = mha_or_mla_device(mla, case["tokens"], ps, case["layers"])
            host = host_of(dev, mla, case["ratio"], case["size_gb"], ps, case["layout"])
        elif kind == "draft":
            dev = mha_or_mla_device(mla, case["device_tokens"], ps, case["layers"], heads)
            host = host_of(dev, mla, main.size / dev.size, 0, ps, case["layout"], host_token_capacity=main.size)
        else:  # draft_swa follows the target SWA host pool
            swa = host_of(mha_or_mla_device(mla, case["tokens"], ps, 3), mla, case["ratio"], 0, ps, case["layout"])
            dev = mha_or_mla_device(mla, case["tokens"], ps, case["layers"], heads)
            host = host_of(dev, mla, swa.size / dev.size, 0, ps, case["layout"])
        meta_ok = mla or case["layout"] != "layer_first"
        return oracle_summary(host, {"kv_buffer": host.kv_buffer}, pages_of(pool), ps, meta_ok=meta_ok)


MAMBA_0_5_23 = draw(mamba_cases(), 25)
KV_0_5_23 = kv_cases("0.5.23")
INDEXER_0_5_23 = indexer_cases("0.5.23")


@pytest.mark.parametrize("case", MAMBA_0_5_23 + KV_0_5_23 + INDEXER_0_5_23, ids=lambda c: c["kind"])
def test_side_host_pool_matches_sglang_0_5_23(case):
    _, pool = ours(case, "0.5.23")
    assert summary(pool) == sglang_0_5_23(case, pool)


# --- SGLang 0.5.14, one child for every case ----------------------------------------------------

SCRIPT_0_5_14 = r"""
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MambaPool, MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.memory_pool_host import (
    DSAIndexerPoolHost, MambaPoolHost, MHATokenToKVPoolHost, MLATokenToKVPoolHost,
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def summary(host, buffers, pages, page_size, meta_ok):
    out = {"size": host.size, "page_num": host.page_num, "size_per_token": host.size_per_token,
           "buffers": {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in buffers.items()},
           "meta": None}
    if meta_ok:
        indices = torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])
        ptrs, sizes = host.get_page_buffer_meta(indices)
        spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes, n) for n, t in buffers.items() if t.numel())
        out["meta"] = [[n, p - s, z] for p, z in zip(ptrs, sizes) for s, e, n in spans if s <= p < e]
    return out


def kv_device(mla, tokens, ps, layers, heads=2):
    if mla:
        return MLATokenToKVPool(tokens, ps, torch.bfloat16, 16, 8, layers, "cpu", False)
    return MHATokenToKVPool(tokens, ps, torch.bfloat16, heads, 8, layers, "cpu", False)


def kv_host(dev, mla, ratio, size_gb, ps, layout):
    cls = MLATokenToKVPoolHost if mla else MHATokenToKVPoolHost
    return cls(dev, ratio, size_gb, ps, layout, pin_memory=False, device="cpu")


def run(case, pages):
    kind = case["kind"]
    if kind == "mamba":
        per_rank = lambda s: tuple([s[0] // case["tp"], *s[1:]])
        shape = Mamba2StateShape(conv=[per_rank(s) for s in case["conv_shapes"]],
                                 temporal=per_rank(case["temporal_shape"]), intermediate_size=0, conv_dim=0,
                                 ssm_state_size=0, num_heads=0, head_dim=0, state_size=0, conv_kernel=0)
        params = Mamba2CacheParams(shape=shape, layers=list(range(case["layers"])),
                                   dtype=Mamba2StateDType(conv=DTYPES[case["conv_dtype"]],
                                                          temporal=DTYPES[case["temporal_dtype"]]))
        dev = MambaPool(size=case["slots"], spec_state_size=case["slots"], cache_params=params,
                        mamba_layer_ids=list(range(case["layers"])), device="cpu")
        host = MambaPoolHost(dev, case["ratio"], case["size_gb"], pin_memory=False, device="cpu", layout=case["layout"])
        conv = {f"conv_buffer[{i}]": b for i, b in enumerate(host.conv_buffer)}
        buffers = {"temporal_buffer": host.temporal_buffer, **conv}
        return summary(host, buffers, pages, 1, True)
    if kind == "indexer":
        dev = DSATokenToKVPool(size=case["device_tokens"], page_size=64, kv_lora_rank=16, dtype=torch.bfloat16,
                               qk_rope_head_dim=8, layer_num=case["layers"], device="cpu", index_head_dim=128,
                               enable_memory_saver=False, kv_cache_dim=24)
        anchor = kv_host(dev, True, case["ratio"], 0, 64, case["layout"])
        host = DSAIndexerPoolHost(dev, anchor, case["layout"], pin_memory=False, device="cpu")
        return summary(host, {"index_k_with_scale_buffer": host.index_k_with_scale_buffer}, pages, 64,
                       case["layout"] != "layer_first")
    mla, ps = case["mla"], case["page_size"]
    main = kv_host(kv_device(mla, case["device_tokens"], ps, 3), mla, case["ratio"], 0, ps, case["layout"])
    if kind == "swa":
        host = kv_host(kv_device(mla, case["tokens"], ps, case["layers"]), mla, case["ratio"], case["size_gb"], ps,
                       case["layout"])
    else:  # draft: kv_cache_builder's ratio, the target host slots over the draft device slots
        dev = kv_device(mla, case["device_tokens"], ps, case["layers"], case["heads"] or 2)
        host = kv_host(dev, mla, main.size / dev.size, 0, ps, case["layout"])
    return summary(host, {"kv_buffer": host.kv_buffer}, pages, ps, mla or case["layout"] != "layer_first")


def attempt(case, pages):
    try:
        return run(case, pages)
    except (AssertionError, ValueError) as error:  # SGLang refuses the pool at start-up
        return {"refused": type(error).__name__}


RESULT = [attempt(case, pages) for case, pages in PAYLOAD]
"""

MAMBA_0_5_14 = draw(mamba_cases("0.5.14"), 15)
# --hicache-size too small for one slot: a host pool no larger than the device pool, refused.
MAMBA_REFUSED = {**MAMBA_0_5_14[0], "size_gb": 1e-9, "slots": 4}
CASES_0_5_14 = [*MAMBA_0_5_14, MAMBA_REFUSED, *kv_cases("0.5.14"), *indexer_cases("0.5.14")]


def ours_or_refused(case, version):
    try:
        return ours(case, version)[1]
    except InputError:
        return None


@pytest.fixture(scope="module")
def sglang_0_5_14_results():
    payload = []
    for case in CASES_0_5_14:
        pool = ours_or_refused(case, "0.5.14")
        payload.append((case, pages_of(pool) if pool else [0]))
    return run_0_5_14(SCRIPT_0_5_14, payload)


@pytest.mark.parametrize("index", range(len(CASES_0_5_14)), ids=lambda i: CASES_0_5_14[i]["kind"])
def test_side_host_pool_matches_sglang_0_5_14(sglang_0_5_14_results, index):
    """Where we refuse a pool (InputError), SGLang 0.5.14 refuses it too."""
    pool = ours_or_refused(CASES_0_5_14[index], "0.5.14")
    theirs = sglang_0_5_14_results[index]
    assert (summary(pool) if pool else "refused") == (theirs if "refused" not in theirs else "refused")


# --- `hicache inspect layout` with side pools ----------------------------------------------------


def layout(*args):
    return hicache(["inspect", "layout", *args])


def test_cli_qwen3_next_preset_json():
    """The preset's public shapes give Qwen3-Next's Mamba state: 36 x (8192x3 bf16 + 32x128x128 fp32) per slot."""
    result = layout(
        "--pool-preset",
        "qwen3-next",
        "--hicache-mem-layout",
        "page_first_direct",
        "--hicache-io-backend",
        "direct",
        "--pool",
        "mamba:tokens=40",
        "--sglang-version",
        "0.5.14",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["geometry"]["name"] == "qwen3-next-80b-a3b" and data["geometry"]["layers"] == 12
    (mamba,) = data["pools"]
    assert mamba["bytes_per_slot"] == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4) == 77_266_944
    assert (mamba["device_slots"], mamba["size_slots"], mamba["page_num"], mamba["page_size"]) == (40, 81, 81, 1)
    assert [b["shape"] for b in mamba["buffers"]] == [[81, 36, 1, 32, 128, 128], [81, 36, 1, 8192, 3]]
    assert mamba["suffixes"] == ["_0_temporal", "_0_conv_0"]
    assert [p["index"] for p in mamba["pages"]] == [0, 1, 80]
    last = mamba["pages"][-1]["objects"]
    assert [(o["suffix"], o["buffer"], o["offset"], o["size"]) for o in last] == [
        ("_0_temporal", "temporal_buffer", 80 * 75_497_472, 75_497_472),
        ("_0_conv_0", "conv_buffer[0]", 80 * 1_769_472, 1_769_472),
    ]
    # The same as the library computes (which the tests above check against SGLang).
    kv = HostPoolLayout(PRESETS_GEOMETRY["qwen3-next-80b-a3b"], "page_first_direct", 64, 65536, sglang_version="0.5.14")
    (ours_mamba,), _ = side_host_pools([PoolSpec(**{**PRESETS["qwen3-next"].pools[0].__dict__, "tokens": 40})], kv)
    assert {k: v for k, v in mamba.items() if k != "pages"} == json_data(ours_mamba.view())


def test_cli_tp_splits_mamba_state_and_gpt_oss_swa():
    result = layout("--pool-preset", "qwen3-next", "--tp-size", "2", "--json")
    assert result.exit_code == 0, result.output
    shapes = json.loads(result.stdout)["pools"][0]["shapes"]
    assert (shapes["conv_shapes"], shapes["temporal_shape"]) == ([[4096, 3]], [16, 128, 128])
    result = layout("--pool-preset", "gpt-oss", "--page-size", "32", "--pool", "swa:tokens=1000", "--json")
    assert result.exit_code == 0, result.output
    (swa,) = json.loads(result.stdout)["pools"]
    assert swa["shapes"]["layers"] == 18 and swa["bytes_per_slot"] == 2 * 18 * 8 * 64 * 2
    assert swa["size_slots"] == (2000 // 32 + 1) * 32 and swa["suffixes"] == ["_0_swa_k", "_0_swa_v"]


def test_cli_human_rendering_of_side_pools():
    result = layout("--pool-preset", "deepseek-v3.2-mtp", "--device-tokens", "4096", "--sglang-version", "0.5.23")
    assert result.exit_code == 0, result.output
    for fragment in (
        "side pool indexer",
        "side pool draft ",
        "side pool draft_indexer",
        "__draft_k",
        "__indexer",
        "index_k_with_scale",
    ):
        assert fragment in result.stdout
    assert "follow the draft KV host pool" in result.stderr


def test_cli_deepseek_v4_pools_are_named_not_shown():
    result = layout("--preset", "deepseek-v3", "--pool", "deepseek_v4_c4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pools"] == [] and any("DeepSeek V4 host pools are not shown" in n for n in data["notes"])


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--pool-preset", "qwen3-next", "--sglang-version", "0.5.14"], "refuses the page_first layout"),
        (["--preset", "tiny", "--pool", "mamba:conv=1"], "needs the Mamba state's layers, conv_shapes"),
        (["--preset", "tiny", "--pool", "indexer"], "ride on an MLA KV pool"),
        (["--preset", "deepseek-v3", "--page-size", "32", "--pool", "indexer"], "--page-size 64 (got 32)"),
        (["--pool-preset", "eagle3-mha-on-mla"], "needs its own heads and head size"),
        (["--preset", "tiny", "--pool", "swa:conv_shapes=4x3"], "conv_shapes does not describe its host pool"),
        (
            [
                "--preset",
                "tiny",
                "--pool",
                "mamba:layers=2,conv_shapes=3x3,temporal_shape=2x2x2",
                "--tp-size",
                "2",
                "--hicache-mem-layout",
                "page_first_direct",
            ],
            "does not split evenly over tp-size 2",
        ),
        (
            ["--preset", "tiny", "--pool", "swa", "--hicache-size", "1", "--sglang-version", "0.5.23"],
            "split between the KV and SWA host pools",
        ),
        (["--preset", "tiny", "--pool", "mamba:temporal_shape=0x2"], "not a shape like 8192x3"),
    ],
)
def test_cli_side_pool_bad_input_exits_2(args, fragment):
    result = layout(*args, "--json")
    assert result.exit_code == 2, result.output
    message = json.loads(result.stdout)["error"]["message"]
    assert fragment in message and "\n" not in message
    human = layout(*args)
    assert human.exit_code == 2 and human.stdout == "" and "Traceback" not in human.output


def test_pool_option_changes_a_preset_pool():
    from hicache_ops.sglang.side_pool_specs import combine_pools

    (mamba,) = combine_pools(PRESETS["qwen3-next"].specs(64), ["mamba:tokens=512,temporal=0"])
    assert (mamba.tokens, mamba.temporal, mamba.temporal_shape, mamba.layers) == (512, False, None, 36)
    pools = combine_pools(PRESETS["deepseek-v3.2"].specs(64), ["draft:attention=mla"])
    assert [p.name for p in pools] == ["indexer", "draft"]
    assert parse_pool("mamba:conv_shapes=4x3+2x3").conv == 2
    with pytest.raises(InputError, match="conv=1 but 2 conv_shapes"):
        parse_pool("mamba:conv=1,conv_shapes=4x3+2x3")
