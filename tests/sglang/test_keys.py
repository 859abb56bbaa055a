"""Page and object keys against SGLang's own code (0.5.23, installed) and the published vectors."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hicache_ops.errors import InputError
from hicache_ops.sglang import page_keys as keys_mod
from hicache_ops.sglang.page_keys import Deployment, ObjectKeyScheme, dcp_topology, namespace_seed, page_keys

# Computed with SGLang 0.5.23's own functions (shared/refs), kept here so the test always runs.
REFS = json.loads((Path(__file__).parents[1] / "data" / "sglang_public_refs.json").read_text())

from sglang.srt.mem_cache import utils as sglang_utils  # noqa: E402  (a test dependency)
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402


def sglang_storage_keys(tokens, page_size, extra_key=None, cache_salt=None, whole_pages=True):
    """SGLang 0.5.23's storage-path keys, through its own RadixKey and get_storage_hash_str."""
    n = len(tokens) - len(tokens) % page_size if whole_pages else len(tokens)
    key = RadixKey(array("q", tokens[:n]), extra_key=extra_key, cache_salt=cache_salt)
    if n == 0:
        return []
    return list(sglang_utils.get_storage_hash_str(key, None, page_size=page_size))


# --- published vectors ------------------------------------------------------------------------


@pytest.mark.parametrize("case", range(2))
def test_public_reference_vectors(case):
    ref = REFS["cases"][case]
    tokens = list(range(64))
    for version in ref["versions"]:
        got = page_keys(tokens, ref["page_size"], version, extra_key=ref["extra_key"], cache_salt=ref["cache_salt"])
        assert got == ref["page_keys"]
        if "namespace_seed" in ref:
            assert namespace_seed(version, ref["extra_key"], ref["cache_salt"]) == ref["namespace_seed"]


def test_public_object_key_example():
    ex = REFS["object_key_example"]
    page_key = REFS["cases"][0]["page_keys"][0]
    mha = ObjectKeyScheme(ex["version"], model_name=ex["model_name"], tp_rank=ex["tp_rank"], tp_size=ex["tp_size"])
    mla = ObjectKeyScheme(ex["version"], model_name=ex["model_name"], mla=True)
    assert mha.object_keys(page_key) == ex["mha"]
    assert mla.object_keys(page_key) == ex["mla"]


# --- cross-checks against SGLang 0.5.23's own functions ------------------------------------------

tokens_st = st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=0, max_size=300)
namespace_st = st.one_of(st.none(), st.text(max_size=12))


@settings(max_examples=300, deadline=None)
@given(tokens=tokens_st, page_size=st.integers(1, 70), extra_key=namespace_st, cache_salt=namespace_st)
def test_storage_keys_match_sglang(tokens, page_size, extra_key, cache_salt):
    ours = page_keys(tokens, page_size, "0.5.23", extra_key=extra_key, cache_salt=cache_salt)
    assert ours == sglang_storage_keys(tokens, page_size, extra_key, cache_salt)


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=2**63 - 1), min_size=1, max_size=200),
    page_size=st.integers(1, 40),
    extra_key=namespace_st,
)
def test_wide_tokens_and_partial_page_match_sglang(tokens, page_size, extra_key):
    ours = page_keys(tokens, page_size, "0.5.23", extra_key=extra_key, include_partial=True)
    assert ours == sglang_storage_keys(tokens, page_size, extra_key, whole_pages=False)


@settings(max_examples=100, deadline=None)
@given(extra_key=namespace_st, cache_salt=namespace_st)
def test_namespace_seed_matches_sglang(extra_key, cache_salt):
    theirs = sglang_utils.storage_namespace_seed(extra_key, cache_salt or None)
    assert namespace_seed("0.5.23", extra_key, cache_salt) == theirs


def test_namespace_normalisation():
    # cache_salt "" is no salt; extra_key "" is a namespace of its own.
    assert namespace_seed("0.5.23", None, "") is None
    assert namespace_seed("0.5.23", "", None) is not None
    assert namespace_seed("0.5.23", "", None) != namespace_seed("0.5.23", None, None)
    assert page_keys(list(range(32)), 16, "0.5.23", cache_salt="") == page_keys(list(range(32)), 16, "0.5.23")


# --- 0.5.14 rules (its get_hash_str itself: test_sglang_0_5_14.py) ----------------------------


def test_0_5_14_rejects_wide_tokens_that_0_5_23_hashes():
    tokens = [1, 2, 2**32, 3]
    with pytest.raises(InputError, match="0.5.14 cannot hash"):
        page_keys(tokens, 2, "0.5.14")
    assert len(page_keys(tokens, 2, "0.5.23")) == 2


# --- the native loop and the pure-Python loop agree --------------------------------------------


@pytest.mark.skipif(not keys_mod.native_available(), reason="native loop not built")
@settings(max_examples=100, deadline=None)
@given(tokens=tokens_st, page_size=st.integers(1, 70), seed=st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_native_and_python_loops_agree(tokens, page_size, seed):
    n = len(tokens) - len(tokens) % page_size
    for dtype in (np.uint32, np.int64, np.uint64):
        arr = np.asarray(tokens[:n], dtype=dtype)
        assert keys_mod._pagehash.chain(arr, page_size, seed) == keys_mod._chain_python(arr, page_size, seed)


def test_native_loop_refuses_out_of_range_tokens():
    for bad in (
        np.array([1, -1], dtype=np.int64),
        np.array([1, 2**32], dtype=np.uint64),
        np.array([-3, 1], dtype=np.int32),
    ):
        with pytest.raises(OverflowError):
            keys_mod._pagehash.chain(bad, 2, None)


def test_numpy_and_list_inputs_agree():
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 2**31, size=1000)
    assert page_keys(arr, 64, "0.5.23") == page_keys(arr.tolist(), 64, "0.5.23")
    assert page_keys(arr.astype(np.uint32), 64, "0.5.23") == page_keys(arr.tolist(), 64, "0.5.23")


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, page_size, message",
    [
        ([1, -2, 3], 2, "negative"),
        ([1, "x"], 2, "not an integer"),
        ([1, 2.5], 2, "not an integer"),
        ([1, 2**64], 2, "above 2\\*\\*63-1"),
        ([1, 2], 0, "not a positive integer"),
        ([1, 2], -4, "not a positive integer"),
        (np.array([1.0, 2.0]), 2, "must be integers"),
        (np.array([1, -1]), 2, "negative"),
    ],
)
def test_bad_tokens_are_input_errors(tokens, page_size, message):
    with pytest.raises(InputError, match=message):
        page_keys(tokens, page_size, "0.5.23")


def test_unknown_version():
    with pytest.raises(InputError, match="older than 0.5.14"):
        page_keys([1, 2], 2, "0.4.0")
    with pytest.raises(InputError, match="not a release number"):
        page_keys([1, 2], 2, "latest")


# --- object keys -------------------------------------------------------------------------------

PK = "ab" * 32


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(version="0.5.23"), [f"{PK}_0_k", f"{PK}_0_v"]),
        (dict(version="0.5.23", tp_size=4, tp_rank=3), [f"{PK}_3_k", f"{PK}_3_v"]),
        (dict(version="0.5.23", tp_size=2, tp_rank=1, pp_size=2, pp_rank=1), [f"{PK}_1_1_k", f"{PK}_1_1_v"]),
        (dict(version="0.5.23", mla=True), [f"{PK}__k"]),
        (dict(version="0.5.23", mla=True, pp_size=3, pp_rank=2), [f"{PK}_2_k"]),
        (
            dict(version="0.5.23", tp_size=2, tp_rank=1, layout="page_head", tp_lcm_size=4),
            [f"{PK}_2_k", f"{PK}_2_v", f"{PK}_3_k", f"{PK}_3_v"],
        ),
        (dict(version="0.5.23", tp_size=2, tp_rank=1, layout="page_first", tp_lcm_size=4), [f"{PK}_1_k", f"{PK}_1_v"]),
        (dict(version="0.5.23", mla=True, layout="page_head", tp_lcm_size=4), [f"{PK}__k"]),
        (
            dict(version="0.5.23", model_name="Qwen/Qwen3-0.6B", extra_backend_tag="blue"),
            [f"blue_Qwen-Qwen3-0.6B_{PK}_0_k", f"blue_Qwen-Qwen3-0.6B_{PK}_0_v"],
        ),
        (dict(version="0.5.14", model_name="Qwen/Qwen3-0.6B"), [f"{PK}_0_k", f"{PK}_0_v"]),
        (dict(version="0.5.14", extra_backend_tag="blue"), [f"blue_{PK}_0_k", f"blue_{PK}_0_v"]),
        (
            dict(
                version="0.5.23",
                model_name="deepseek-ai/DeepSeek-V3",
                mla=True,
                tp_size=8,
                tp_rank=3,
                dcp_size=4,
                page_size=64,
            ),
            [f"deepseek-ai-DeepSeek-V3_tp8_dcp4_page64_pp1_cp1_{PK}_dcp3_cp0_k"],
        ),
        (
            dict(version="0.5.23", mla=True, tp_size=4, tp_rank=1, dcp_size=2, page_size=32, pp_size=2, pp_rank=1),
            [f"tp4_dcp2_page32_pp2_cp1_{PK}_dcp1_cp0_1_k"],
        ),
    ],
)
def test_object_keys(kwargs, expected):
    assert ObjectKeyScheme(**kwargs).object_keys(PK) == expected


def test_mla_only_rank_zero_writes():
    assert ObjectKeyScheme("0.5.23", mla=True, tp_size=2, tp_rank=0).writes
    assert not ObjectKeyScheme("0.5.23", mla=True, tp_size=2, tp_rank=1).writes
    assert ObjectKeyScheme("0.5.23", tp_size=2, tp_rank=1).writes


def test_dcp_writers_are_the_first_dcp_group():
    writers = [
        ObjectKeyScheme("0.5.23", mla=True, tp_size=8, tp_rank=r, dcp_size=4, page_size=64).writes for r in range(8)
    ]
    assert writers == [True] * 4 + [False] * 4
    assert [ObjectKeyScheme("0.5.14", mla=True, tp_size=2, tp_rank=r).writes for r in range(2)] == [True, False]
    dep = Deployment("0.5.23", mla=True, tp_size=8, dcp_size=4, page_size=64)
    assert [s.tp_rank for s in dep.schemes()] == [0, 1, 2, 3]
    assert [
        s.tp_rank for s in Deployment("0.5.23", mla=True, tp_size=8, dcp_size=4, dcp_rank=2, page_size=64).schemes()
    ] == [2]
    with pytest.raises(InputError, match="DCP shard 1, not 2"):
        Deployment("0.5.23", mla=True, tp_size=8, tp_rank=5, dcp_size=4, dcp_rank=2, page_size=64).schemes()
    with pytest.raises(InputError, match="tp ranks 0..3"):
        Deployment("0.5.23", mla=True, tp_size=8, tp_rank=5, dcp_size=4, page_size=64).schemes()


def test_dcp_prefix_round_trips():
    scheme = ObjectKeyScheme("0.5.23", model_name="m", mla=True, tp_size=4, dcp_size=2, page_size=32)
    assert dcp_topology(scheme.prefix) == {
        "tp_size": 4,
        "dcp_size": 2,
        "page_size": 32,
        "pp_size": 1,
        "attn_cp_size": 1,
    }
    assert dcp_topology("m_") is None and dcp_topology("") is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(version="0.5.14", mla=True, tp_size=2, dcp_size=2, page_size=16), "0.5.14 has no DCP"),
        (dict(version="0.5.23", tp_size=2, dcp_size=2, page_size=16), "needs an MLA model"),
        (dict(version="0.5.23", mla=True, tp_size=3, dcp_size=2, page_size=16), "not a multiple of dcp-size"),
        (dict(version="0.5.23", mla=True, tp_size=2, dcp_size=2, page_size=15), "DCP-aligned"),
        (dict(version="0.5.23", mla=True, tp_size=2, dcp_size=2), "DCP-aligned"),
        (dict(version="0.5.23", mla=True, dcp_size=0), "must be >= 1"),
    ],
)
def test_dcp_rules_are_sglangs(kwargs, message):
    with pytest.raises(InputError, match=message):
        ObjectKeyScheme(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(tp_size=2, tp_rank=2), "outside 0..1"),
        (dict(pp_size=2, pp_rank=-1), "outside 0..1"),
        (dict(tp_size=0), "must be >= 1"),
        (dict(tp_size=3, tp_lcm_size=4), "not a positive multiple"),
    ],
)
def test_bad_rank_topology(kwargs, message):
    with pytest.raises(InputError, match=message):
        ObjectKeyScheme("0.5.23", **kwargs)
