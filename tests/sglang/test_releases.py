"""Page keys, namespace seeds and Mooncake object keys against every release's own code.

One child process per release (tests/sglang_release.py) imports that release's `sglang` and
returns, for a small fixed sample: its page keys (`get_hash_str`, chained page by page from
`storage_namespace_seed` where the release has it), its namespace seeds, whether it refuses a
token id above 2**32, and the object keys of a real `MooncakeStore` built by its own __init__
against the test master (`_tag_keys` for the prefix, its mha/mla suffixes). Ours must match for
the release's `--sglang-version`. Releases come from `make sglang-releases`; a missing one fails.
"""

from __future__ import annotations

import pytest

from hicache_ops.errors import InputError
from hicache_ops.sglang.page_keys import ObjectKeyScheme, namespace_seed, page_keys
from sglang_release import INSTALLED, UNPACKED, run_release

RELEASES = (*UNPACKED, INSTALLED)
MODEL = "Qwen/Qwen3-0.6B"
# (tokens, page size, extra_key, cache_salt): empty, partial, namespaced, unicode, uint32 edge.
KEY_CASES = [
    ([], 4, None, None),
    ([1, 2, 3], 4, None, None),
    (list(range(40)), 4, None, None),
    (list(range(100, 164)), 16, "tenant-a", None),
    ([7] * 33, 8, None, "salt"),
    ([2**32 - 1, 0, 5, 9, 11], 2, "", "ünï"),
    (list(range(1000, 1130)), 64, "x", "y"),
]
# (tp_rank, tp_size, pp_rank, pp_size, mla, model_name, extra_backend_tag)
STORE_CASES = [
    (0, 1, 0, 1, False, None, None),
    (1, 2, 0, 1, False, MODEL, None),
    (0, 2, 1, 2, False, MODEL, "tagA"),
    (0, 1, 0, 1, True, MODEL, None),
    (0, 1, 1, 2, True, None, "tagB"),
]
WIDE = [1, 2**32 + 5, 3, 4]

SCRIPT = """
from array import array
from dataclasses import MISSING, fields
from sglang.srt.mem_cache import utils as U
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

seed_of = getattr(U, "storage_namespace_seed", None)
out = {"keys": [], "seeds": [], "wide_raises": None, "objects": [], "has_seed": seed_of is not None}
for tokens, page_size, extra_key, cache_salt in PAYLOAD["keys"]:
    seed = seed_of(extra_key, cache_salt or None) if seed_of else None
    prior, keys = seed, []
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        prior = U.get_hash_str(tokens[start:start + page_size], prior)
        keys.append(prior)
    out["keys"].append(keys)
    out["seeds"].append(seed)
try:
    U.get_hash_str(PAYLOAD["wide"], None)
    out["wide_raises"] = False
except (OverflowError, ValueError, IndexError):  # array("I"), or pybind11's std::out_of_range
    out["wide_raises"] = True

master = PAYLOAD["master"]
for tp_rank, tp_size, pp_rank, pp_size, mla, model, tag in PAYLOAD["stores"]:
    want = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, is_mla_model=mla,
                is_page_first_layout=True, model_name=model, should_split_heads=False, tp_lcm_size=None,
                extra_config=dict(master_server_address=master["rpc"], metadata_server=master["metadata"],
                                  protocol="tcp", device_name="", global_segment_size=64 << 20,
                                  local_hostname="127.0.0.1", **({"extra_backend_tag": tag} if tag else {})))
    kwargs = {}
    for f in fields(HiCacheStorageConfig):
        if f.name in want:
            kwargs[f.name] = want[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            kwargs[f.name] = 0 if f.type in (int, "int") else None
    store = MooncakeStore(HiCacheStorageConfig(**kwargs))
    tagged = store._tag_keys([PAYLOAD["page_key"]])[0]
    if mla:
        objects = [f"{tagged}_{store.mla_suffix}_k"]
    else:
        suffixes = store.mha_suffix if isinstance(store.mha_suffix, list) else [store.mha_suffix]
        objects = [f"{tagged}_{s}_{kv}" for s in suffixes for kv in ("k", "v")]
    out["objects"].append(objects)
    store.close() if hasattr(store, "close") else None
RESULT = out
"""


@pytest.fixture(scope="module", params=RELEASES)
def release(request, mooncake_master):
    payload = {
        "keys": KEY_CASES,
        "wide": WIDE,
        "stores": STORE_CASES,
        "page_key": "ab" * 32,
        "master": {"rpc": mooncake_master.rpc_address, "metadata": mooncake_master.metadata_server},
    }
    return request.param, run_release(request.param, SCRIPT, payload)


def test_page_keys_and_seeds_match_the_release(release):
    version, theirs = release
    assert len(theirs["keys"]) == len(KEY_CASES)
    assert any(theirs["keys"])
    for (tokens, page_size, extra_key, cache_salt), keys, seed in zip(
        KEY_CASES, theirs["keys"], theirs["seeds"], strict=True
    ):
        assert namespace_seed(version, extra_key, cache_salt) == seed, (version, extra_key, cache_salt)
        ours = page_keys(tokens, page_size, version, extra_key=extra_key, cache_salt=cache_salt)
        assert ours == keys, (version, tokens, page_size, extra_key, cache_salt)


def test_namespace_seed_starts_in_0_5_20(release):
    version, theirs = release
    from hicache_ops.sglang.versions import since

    assert theirs["has_seed"] == since(version, "0.5.20")


def test_wide_tokens_refused_where_the_release_refuses(release):
    version, theirs = release
    from hicache_ops.sglang.versions import since

    assert theirs["wide_raises"] == (not since(version, "0.5.23"))
    if theirs["wide_raises"]:
        with pytest.raises(InputError, match="above 2\\*\\*32-1"):
            page_keys(WIDE, 2, version)
    else:
        assert len(page_keys(WIDE, 2, version)) == 2


def test_object_keys_match_the_release_mooncake_store(release):
    version, theirs = release
    for (tp_rank, tp_size, pp_rank, pp_size, mla, model, tag), objects in zip(
        STORE_CASES, theirs["objects"], strict=True
    ):
        scheme = ObjectKeyScheme(
            version=version,
            model_name=model,
            extra_backend_tag=tag,
            tp_rank=tp_rank,
            tp_size=tp_size,
            pp_rank=pp_rank,
            pp_size=pp_size,
            mla=mla,
        )
        assert scheme.object_keys("ab" * 32) == objects, (version, model, tag, tp_rank, pp_rank, mla)
