"""Side-pool object suffixes: ours (hicache_ops.sglang.side_pool_specs) against SGLang's own key builder,
`MooncakeStore._get_hybrid_page_component_keys`, for every pool kind in 0.5.14 (child process)
and 0.5.23 (this process).

The builder is called directly on a store whose connection is not opened: it reads only the
rank suffixes, `is_mla_backend` and the registered host pools. Mamba, SWA, indexer and DeepSeek V4
pools are stand-ins carrying the attributes the builder reads (`conv_buffer`,
`temporal_state_elem_size`, `v_buffer`); draft pools are instances of SGLang's own MLA/MHA
host-pool classes, made without allocating, because the builder picks the suffixes by class.
The rank suffixes are set as SGLang's constructor sets them; the KV names built from the same
suffixes are cross-checked against real stores in tests/mooncake/test_sglang_store_shapes.py.
"""

from __future__ import annotations

import pytest

from hicache_ops.errors import InputError
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import PRESETS, SIDE_POOLS, PoolSpec, check_pool, parse_pool, pool_suffixes
from sglang_0_5_14 import run_0_5_14

RANKS = [  # tp_rank, pp_rank, pp_size, mla
    (0, 0, 1, False),
    (1, 0, 1, False),
    (1, 1, 2, False),
    (0, 0, 1, True),
    (0, 1, 2, True),
]


def specs_for(version: str, mla: bool) -> list[PoolSpec]:
    out = []
    for name in SIDE_POOLS[version]:
        if name == "mamba":
            out += [PoolSpec("mamba", conv=1), PoolSpec("mamba", conv=3)]
            if version == "0.5.23":
                out.append(PoolSpec("mamba", conv=2, temporal=False))
        elif name in ("draft", "draft_swa"):
            out += [PoolSpec(name, attention="mla"), PoolSpec(name, attention="mha")]
        else:
            out.append(PoolSpec(name))
    return out


def cases(version: str) -> list[dict]:
    out = []
    for tp_rank, pp_rank, pp_size, mla in RANKS:
        scheme = ObjectKeyScheme(version=version, tp_rank=tp_rank, tp_size=2, pp_rank=pp_rank, pp_size=pp_size, mla=mla)
        for spec in specs_for(version, mla):
            out.append(
                {
                    "pool": spec.name,
                    "attention": spec.attention,
                    "conv": spec.conv,
                    "temporal": spec.temporal,
                    "mla": mla,
                    # As MooncakeStore.__init__ sets them (both versions).
                    "mha_suffix": f"{tp_rank}_{pp_rank}" if pp_size > 1 else f"{tp_rank}",
                    "mla_suffix": f"{pp_rank}" if pp_size > 1 else "",
                    "ours": pool_suffixes(spec, scheme),
                }
            )
    return out


BUILDER = """
import types
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore
try:
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
except ImportError:  # 0.5.14 keeps them in memory_pool_host
    from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost


def host_pool(case):
    if case["pool"] in ("draft", "draft_swa"):
        cls = MLATokenToKVPoolHost if case["attention"] == "mla" else MHATokenToKVPoolHost
        return cls.__new__(cls)
    if case["pool"] == "mamba":
        return types.SimpleNamespace(
            conv_buffer=[object()] * case["conv"], temporal_state_elem_size=int(case["temporal"])
        )
    if case["pool"] == "swa" and not case["mla"]:
        return types.SimpleNamespace(v_buffer=object())
    return types.SimpleNamespace()


def sglang_suffixes(case):
    store = MooncakeStore.__new__(MooncakeStore)
    store.mha_suffix, store.mla_suffix, store.is_mla_backend = case["mha_suffix"], case["mla_suffix"], case["mla"]
    store.registered_pools = {PoolName(case["pool"]): host_pool(case)}
    keys, multiplier = store._get_hybrid_page_component_keys(["P"], PoolTransfer(name=PoolName(case["pool"])))
    assert multiplier == len(keys)
    return [key[1:] for key in keys]
"""


def sglang_0_5_23_suffixes(all_cases: list[dict]) -> list[list[str]]:
    scope: dict = {}
    exec(BUILDER, scope)  # the same script the 0.5.14 child runs, against the installed 0.5.23
    return [scope["sglang_suffixes"](case) for case in all_cases]


def test_suffixes_match_sglang_0_5_23():
    all_cases = cases("0.5.23")
    theirs = sglang_0_5_23_suffixes(all_cases)
    for case, sglang in zip(all_cases, theirs, strict=True):
        assert case["ours"] == sglang, case


def test_suffixes_match_sglang_0_5_14():
    all_cases = cases("0.5.14")
    theirs = run_0_5_14(BUILDER + "\nRESULT = [sglang_suffixes(case) for case in PAYLOAD]\n", all_cases)
    for case, sglang in zip(all_cases, theirs, strict=True):
        assert case["ours"] == sglang, case


def test_0_5_14_writes_temporal_even_when_empty():
    """0.5.14 has no temporal=0 form: its builder always lists the temporal object."""
    case = {
        "pool": "mamba",
        "attention": None,
        "conv": 2,
        "temporal": False,
        "mla": False,
        "mha_suffix": "0",
        "mla_suffix": "",
    }
    theirs = run_0_5_14(BUILDER + "\nRESULT = sglang_suffixes(PAYLOAD)\n", case)
    assert theirs == ["_0_temporal", "_0_conv_0", "_0_conv_1"]
    with pytest.raises(InputError, match="always writes the temporal"):
        check_pool(PoolSpec("mamba", conv=2, temporal=False), "0.5.14", mla=False)


@pytest.mark.parametrize(
    "name, version, message",
    [
        ("draft_swa", "0.5.14", "exists in 0.5.23"),
        ("deepseek_v4_c1", "0.5.14", "exists in 0.5.23"),
        ("auxiliary_swa", "0.5.23", "no Mooncake key rule"),
        ("kv", "0.5.23", "main pool"),
        ("nope", "0.5.23", "has no pool"),
    ],
)
def test_pools_the_version_lacks_are_refused(name, version, message):
    with pytest.raises(InputError, match=message):
        check_pool(PoolSpec(name), version, mla=True)


def test_auxiliary_swa_is_refused_by_sglang_too():
    scope: dict = {}
    exec(BUILDER, scope)
    with pytest.raises(ValueError, match="Unsupported Mooncake hybrid pool"):
        scope["sglang_suffixes"]({"pool": "auxiliary_swa", "mla": True, "mha_suffix": "0", "mla_suffix": ""})


def test_pool_options_parse_and_hit_policies():
    assert parse_pool("mamba:conv=2,temporal=0") == PoolSpec("mamba", conv=2, temporal=False)
    assert parse_pool("swa:window=4").trailing_pages == 4
    assert parse_pool("mamba:window=9").trailing_pages == 1
    assert parse_pool("indexer").hit_policy == "all_pages"
    for bad in ("mamba:conv", "draft:attention=gqa", "swa:window=0", ":conv=1", "mamba:depth=2"):
        with pytest.raises(InputError):
            parse_pool(bad)


def test_presets_are_valid_in_their_versions():
    for preset in PRESETS.values():
        for version in preset.versions:
            for spec in preset.specs(page_size=64):
                check_pool(spec, version, preset.mla)
    swa = PRESETS["gpt-oss"].specs(page_size=64)[0]
    assert swa.trailing_pages == 2  # 128 tokens in pages of 64
    assert PRESETS["gpt-oss"].specs(page_size=100)[0].trailing_pages == 2  # rounded up


def test_mla_side_pools_named_per_rank_expect_every_rank():
    """Each tp rank looks up its own per-rank side-pool objects (docs/side-pools.md): with MLA the
    KV stays one `__k`, the Mamba objects are one set per rank; 0.5.14 never writes ranks > 0."""
    from hicache_ops.commands.inspect.key_listing import Deployment, expected_keys

    tokens = list(range(100, 132))
    for version, says in (("0.5.14", "loads nothing"), ("0.5.23", "every tp rank writes")):
        report = expected_keys(tokens, 16, Deployment(version, mla=True, tp_size=2), pools=[PoolSpec("mamba", conv=1)])
        suffixes = [key[64:] for key in report.pages[0].object_keys]
        assert suffixes == ["__k", "_0_temporal", "_0_conv_0", "_1_temporal", "_1_conv_0"]
        assert any(says in note for note in report.notes)
        indexer = expected_keys(tokens, 16, Deployment(version, mla=True, tp_size=2), pools=[PoolSpec("indexer")])
        assert [key[64:] for key in indexer.pages[0].object_keys] == ["__k", "__indexer"]
        assert not any("per tp rank" in note for note in indexer.notes)
        staged = expected_keys(
            tokens, 16, Deployment(version, mla=True, tp_size=2, pp_size=2), pools=[PoolSpec("indexer")]
        )
        assert [key[64:] for key in staged.pages[0].object_keys] == ["_0_k", "_0_indexer", "_1_k", "_1_indexer"]
        assert not any("per tp rank" in note for note in staged.notes)
