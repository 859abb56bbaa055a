"""`hicache inspect keys`: the page keys and Mooncake object keys SGLang derives for a prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hicache_ops.errors import InputError
from hicache_ops.sglang.page_keys import (
    NAMESPACE_SEED_SINCE,
    Deployment,
    namespace_seed,
    normalise_namespace,
    page_keys,
    seeds_namespace,
)
from hicache_ops.sglang.side_pool_specs import PoolSpec, check_pool, pool_suffixes
from hicache_ops.sglang.versions import family


@dataclass
class PageRow:
    index: int
    start: int
    end: int
    page_key: str
    object_keys: list[str]
    # The pool of each object ("kv" for the main pool), parallel to object_keys.
    object_pools: list[str] = field(default_factory=list)


@dataclass
class KeyReport:
    sglang_version: str
    page_size: int
    extra_key: str | None
    cache_salt: str | None
    namespace_seed: str | None
    key_prefix: str
    prompt_tokens: int
    trailing_tokens: int
    ranks: list[dict[str, Any]]
    pages: list[PageRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pools: list[PoolSpec] = field(default_factory=list)

    @property
    def object_keys(self) -> list[str]:
        return [key for page in self.pages for key in page.object_keys]


def expected_keys(
    tokens: Sequence[int],
    page_size: int,
    deployment: Deployment,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    pools: Sequence[PoolSpec] = (),
) -> KeyReport:
    """Every page key and object key SGLang's storage path derives for `tokens`.

    Each side pool in `pools` adds its objects to every page, after the KV objects of the same
    rank, in the order given (docs/side-pools.md#side-pool-object-keys).
    """
    version = deployment.version
    if len(tokens) == 0:
        raise InputError("the prompt is empty; give at least one page of token ids.")
    names = [pool.name for pool in pools]
    if len(set(names)) != len(names):
        raise InputError(f"a pool is given twice: {', '.join(names)}; SGLang registers each pool once.")
    for pool in pools:
        check_pool(pool, version, deployment.mla)
    keys = page_keys(tokens, page_size, version, extra_key=extra_key, cache_salt=cache_salt)
    schemes = deployment.schemes(every_rank=bool(pools))
    extra_key_n, cache_salt_n = normalise_namespace(version, extra_key, cache_salt)
    report = KeyReport(
        sglang_version=version,
        page_size=page_size,
        extra_key=extra_key_n,
        cache_salt=cache_salt_n,
        namespace_seed=namespace_seed(version, extra_key, cache_salt),
        key_prefix=schemes[0].prefix,
        prompt_tokens=len(tokens),
        trailing_tokens=len(tokens) % page_size,
        ranks=[
            {
                "tp_rank": s.tp_rank,
                "pp_rank": s.pp_rank,
                "dcp_rank": s.dcp_rank,
                "suffixes": s.suffixes,
                "pools": {pool.name: pool_suffixes(pool, s) for pool in pools},
            }
            for s in schemes
        ],
        pools=list(pools),
    )
    prefix = report.key_prefix
    for index, key in enumerate(keys):
        objects: dict[str, str] = {}  # object key -> pool, in order, each once
        for scheme, rank in zip(schemes, report.ranks, strict=True):
            for name, suffixes in [("kv", scheme.suffixes), *rank["pools"].items()]:
                for suffix in suffixes:
                    objects.setdefault(f"{prefix}{key}{suffix}", name)
        report.pages.append(
            PageRow(index, index * page_size, (index + 1) * page_size, key, list(objects), list(objects.values()))
        )
    if not keys:
        report.notes.append(
            f"the prompt has {len(tokens)} tokens, less than one page of {page_size}: "
            "the storage path writes no page for it."
        )
    elif report.trailing_tokens:
        report.notes.append(
            f"the last {report.trailing_tokens} tokens fill no whole page: "
            "the storage path drops them (the radix tree still hashes them)."
        )
    if not seeds_namespace(version) and (extra_key is not None or cache_salt is not None):
        report.notes.append(
            f"SGLang {version} ignores extra_key and cache_salt in page keys: tenants with the same "
            f"tokens share these keys; releases since {NAMESPACE_SEED_SINCE} seed the chain with them."
        )
    if deployment.mla and deployment.dcp_size > 1:
        report.notes.append(
            f"MLA with DCP {deployment.dcp_size}: tp ranks 0..{deployment.dcp_size - 1} write, one object per DCP "
            "shard; the other DCP groups read them."
        )
    elif deployment.mla and deployment.tp_size > 1:
        report.notes.append("MLA: only tp rank 0 writes to L3; the other ranks read its objects.")
    per_rank = [  # pools whose names differ between tp ranks of one pipeline stage
        p.name
        for p in pools
        if any(
            len({tuple(r["pools"][p.name]) for r in report.ranks if r["pp_rank"] == pp}) > 1
            for pp in {r["pp_rank"] for r in report.ranks}
        )
    ]
    if deployment.mla and per_rank:
        joined = ", ".join(per_rank)
        if family(version) == "0.5.14":
            report.notes.append(
                f"MLA with side pools named per tp rank ({joined}): SGLang 0.5.14 skips every backup on tp ranks "
                "other than 0, yet each rank looks up its own objects, so those ranks never find theirs and the "
                "MIN over ranks loads nothing (docs/side-pools.md#side-pool-object-keys)."
            )
        else:
            report.notes.append(
                f"MLA with side pools named per tp rank ({joined}): every tp rank writes its own objects of these "
                "pools, while only the KV writer writes the KV (docs/side-pools.md#side-pool-object-keys)."
            )
    return report
