"""Page keys, host pools and start-up rewrites against SGLang 0.5.14's own code.

The same cross-checks as for the installed 0.5.23 (test_keys.py, test_host_pool.py), run against
0.5.14's real `get_hash_str`, its host pool classes (built on the CPU, pin_memory=False) with
`get_page_buffer_meta` / `get_split_heads_page_buffer_meta`, and `ServerArgs._handle_hicache`.
0.5.14 runs in a child process (tests/sglang_0_5_14.py); a child start costs seconds, so the
hypothesis examples are drawn here first, sent in one call, and compared one by one.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import ModelGeometry
from hicache_ops.sglang.host_pool import LAYOUTS, MLA_HOST_BUFFERS, HostPoolLayout
from hicache_ops.sglang.page_keys import page_keys
from hicache_ops.sglang.rewrites import IO_BACKENDS, resolve_layout
from sglang_0_5_14 import draw, run_0_5_14

# --- the examples -----------------------------------------------------------------------------

key_cases_st = st.tuples(
    st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=0, max_size=300),
    st.integers(1, 70),
)


@st.composite
def pool_cases(draw_):
    mla = draw_(st.booleans())
    dtype = draw_(st.sampled_from(["bfloat16", "float16", "float32", "fp8_e4m3", "fp8_e5m2"]))
    layers = draw_(st.integers(1, 3))
    page_size = draw_(st.sampled_from([1, 2, 4, 8]))
    # At least 8 device pages: 0.5.14's page_first_direct pools index their page axis by layer
    # while building per-layer views, so a pool with fewer pages than layers fails to build.
    device_tokens = page_size * draw_(st.integers(8, 16)) + draw_(st.integers(0, page_size - 1))
    # Ratios at or below 1 make pools 0.5.14 refuses (host not larger than device).
    ratio = draw_(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.3]))
    if mla:
        case = dict(
            mla=True,
            layers=layers,
            kv_lora_rank=draw_(st.sampled_from([8, 16])),
            qk_rope_head_dim=draw_(st.sampled_from([4, 8])),
            tp=1,
            tp_lcm=None,
            layout=draw_(st.sampled_from(sorted(MLA_HOST_BUFFERS))),
        )
    else:
        kv_heads = draw_(st.sampled_from([1, 2, 4]))
        tp = draw_(st.sampled_from([t for t in (1, 2, 4) if t <= kv_heads or t % kv_heads == 0]))
        layout = draw_(st.sampled_from(LAYOUTS))
        heads_per_rank = max(1, kv_heads // tp)
        factors = [f for f in (2, 4) if heads_per_rank % f == 0] if layout == "page_head" else []
        factor = draw_(st.sampled_from(factors)) if factors else None
        case = dict(
            mla=False,
            layers=layers,
            kv_heads=kv_heads,
            head_dim=draw_(st.sampled_from([4, 8])),
            tp=tp,
            tp_lcm=tp * factor if factor else None,
            layout=layout,
        )
    return {**case, "dtype": dtype, "page_size": page_size, "device_tokens": device_tokens, "ratio": ratio}


REWRITE_CASES = [
    {"layout": layout, "io": io, "mooncake": mooncake, "rocm": rocm}
    for layout in LAYOUTS
    for io in IO_BACKENDS
    for mooncake in (False, True)
    for rocm in (False, True)
]

# --- SGLang 0.5.14's side, in one child call ---------------------------------------------------

SCRIPT = """
import logging
import torch
import sglang.srt.server_args as server_args_mod
from sglang.srt.mem_cache.utils import get_hash_str
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost
from sglang.srt.server_args import ServerArgs

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
         "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def storage_keys(tokens, page_size):
    # HiCacheController._storage_hit_query: get_hash_str per whole page, chained
    keys, prior = [], None
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        prior = get_hash_str(tokens[start : start + page_size], prior)
        keys.append(prior)
    return keys


def host_pool(case):
    dtype = TORCH[case["dtype"]]
    common = dict(device="cpu", enable_memory_saver=False, start_layer=0, end_layer=case["layers"])
    if case["mla"]:
        dev = MLATokenToKVPool(case["device_tokens"], case["page_size"], dtype, kv_lora_rank=case["kv_lora_rank"],
                               qk_rope_head_dim=case["qk_rope_head_dim"], layer_num=case["layers"], **common)
        host_cls = MLATokenToKVPoolHost
    else:
        heads = max(1, case["kv_heads"] // case["tp"])
        dev = MHATokenToKVPool(case["device_tokens"], case["page_size"], dtype, head_num=heads,
                               head_dim=case["head_dim"], layer_num=case["layers"], **common)
        host_cls = MHATokenToKVPoolHost
    try:
        host = host_cls(dev, case["ratio"], 0, case["page_size"], case["layout"], pin_memory=False, device="cpu")
    except AssertionError as exc:
        return {"refused": str(exc)}
    out = {"size": host.size, "page_num": host.page_num, "size_per_token": host.size_per_token,
           "shape": list(host.kv_buffer.shape), "dtype": str(host.kv_buffer.dtype).removeprefix("torch."),
           "nbytes": host.kv_buffer.nbytes, "device_size": dev.size}
    base = host.kv_buffer.data_ptr()
    if not case["mla"]:
        out["v_offset"] = host.v_buffer.data_ptr() - base
    pages = sorted({0, 1, host.page_num // 2, host.page_num - 1} & set(range(host.page_num)))
    ps = case["page_size"]
    indices = torch.cat([torch.arange(p * ps, (p + 1) * ps, dtype=torch.int64) for p in pages])
    out["pages"] = pages
    try:
        if case["tp_lcm"]:
            ptrs, sizes = host.get_split_heads_page_buffer_meta(indices, case["tp_lcm"] // case["tp"])
        else:
            ptrs, sizes = host.get_page_buffer_meta(indices)
        out["offsets"] = [p - base for p in ptrs]
        out["sizes"] = list(sizes)
    except Exception as exc:
        out["meta_error"] = f"{type(exc).__name__}: {exc}"
    return out


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += 1


WARNINGS = Warnings()
server_args_mod.logger.addHandler(WARNINGS)


def rewrite(case):
    server_args_mod.is_hip = lambda: case["rocm"]  # the platform probe _resolve_layout_io_compatibility reads
    WARNINGS.count = 0
    args = ServerArgs.__new__(ServerArgs)  # no __post_init__: only the hicache fields are set
    args.enable_hierarchical_cache = True
    args.disaggregation_decode_enable_offload_kvcache = False
    args.hicache_mem_layout = case["layout"]
    args.hicache_io_backend = case["io"]
    args.hicache_storage_backend = "mooncake" if case["mooncake"] else None
    args._handle_hicache()
    return [args.hicache_mem_layout, args.hicache_io_backend, WARNINGS.count]  # one warning per rewrite


RESULT = {
    "keys": [storage_keys(tokens, page_size) for tokens, page_size in PAYLOAD["keys"]],
    "pools": [host_pool(case) for case in PAYLOAD["pools"]],
    "rewrites": [rewrite(case) for case in PAYLOAD["rewrites"]],
}
"""


@pytest.fixture(scope="module")
def sglang_0_5_14():
    payload = {
        "keys": draw(key_cases_st, 200),
        "pools": draw(pool_cases(), 60),
        "rewrites": REWRITE_CASES,
    }
    return payload, run_0_5_14(SCRIPT, payload)


def test_page_keys_match_get_hash_str(sglang_0_5_14):
    payload, theirs = sglang_0_5_14
    assert len(theirs["keys"]) == len(payload["keys"]) >= 100
    assert any(keys for keys in theirs["keys"])
    for (tokens, page_size), expected in zip(payload["keys"], theirs["keys"], strict=True):
        # 0.5.14 ignores extra_key and cache_salt: the keys are the same with or without them.
        assert page_keys(tokens, page_size, "0.5.14") == expected, (tokens, page_size)
        assert page_keys(tokens, page_size, "0.5.14", extra_key="t", cache_salt="s") == expected


def geometry_of(case: dict) -> ModelGeometry:
    if case["mla"]:
        return ModelGeometry.mla_model(case["layers"], case["kv_lora_rank"], case["qk_rope_head_dim"], case["dtype"])
    return ModelGeometry.mha(case["layers"], case["kv_heads"], case["head_dim"], case["dtype"])


def test_host_pools_match_sglang(sglang_0_5_14):
    payload, theirs = sglang_0_5_14
    assert any("refused" in t for t in theirs["pools"]) and any("offsets" in t for t in theirs["pools"])
    for case, got in zip(payload["pools"], theirs["pools"], strict=True):
        assert got.get("device_size", case["device_tokens"]) == case["device_tokens"], case

        def ours(case: dict = case):  # bound now: called within this iteration only
            return HostPoolLayout(
                geometry_of(case),
                case["layout"],
                case["page_size"],
                case["device_tokens"],
                hicache_ratio=case["ratio"],
                tp_size=case["tp"],
                tp_lcm_size=case["tp_lcm"],
                sglang_version="0.5.14",
            )

        if "refused" in got:  # SGLang 0.5.14 asserts host > device: so does our 0.5.14 pool
            with pytest.raises(InputError, match="not larger than the device pool"):
                ours()
            continue
        pool = ours()
        assert (pool.size, pool.page_num, pool.bytes_per_token) == (
            got["size"],
            got["page_num"],
            got["size_per_token"],
        ), case
        assert list(pool.buffer_shape) == got["shape"] and pool.buffers[0].dtype == got["dtype"], case
        assert pool.host_bytes == got["nbytes"], case
        if not case["mla"]:
            assert pool.v_offset == got["v_offset"], case
        assert "meta_error" not in got, (case, got.get("meta_error"))
        assert pool.flat_meta(got["pages"]) == (got["offsets"], got["sizes"]), case


def test_rewrites_match_server_args_handle_hicache(sglang_0_5_14):
    payload, theirs = sglang_0_5_14
    for case, expected in zip(payload["rewrites"], theirs["rewrites"], strict=True):
        got = resolve_layout(case["layout"], case["io"], case["mooncake"], version="0.5.14", rocm=case["rocm"])
        layout, io_backend, warnings = expected
        assert (got.layout, got.io_backend) == (layout, io_backend), case
        assert len(got.notes) == warnings, (case, got.notes)  # one note per rewrite SGLang warns about
    assert any(w == 2 for *_, w in theirs["rewrites"])  # ROCm page_first -> layer_first -> page_first
