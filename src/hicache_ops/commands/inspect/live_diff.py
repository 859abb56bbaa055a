"""The live key diff: which of a prompt's expected objects a Mooncake master holds, and why not.

For every page, `present` says which expected objects exist. `kv_contiguous_pages` is what SGLang's
`batch_exists` returns over every selected rank (the leading pages whose KV objects ALL exist; one
missing `_v` ends the prefix, docs/keys.md#batch_exists). With side pools, `contiguous_pages` is
what `batch_exists_v2` makes of it per version (each pool's hit policy, intersected over ranks;
0.5.23 also gives `restorable_prefix_pages`, docs/side-pools.md#loadable-prefix); without, the two
are equal. `first_missing` is the object that ends the KV prefix, else the first missing side-pool
object. Each diagnosis is one function in DIAGNOSES (diagnoses.py) that reads a `Lookup`
(live_lookup.py: presence, prefix, and a key listing fetched on first use) and returns its entries.

Presence takes one /batch_query_keys per 512 objects; the diagnoses of missing KV pages one
/get_all_keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hicache_ops.commands.inspect.diagnoses import DIAGNOSES
from hicache_ops.commands.inspect.key_listing import KeyReport, expected_keys
from hicache_ops.commands.inspect.live_lookup import Lookup
from hicache_ops.commands.inspect.segments import unreachable_holders
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.sglang import hit_policy
from hicache_ops.sglang.hit_policy import LoadablePrefix
from hicache_ops.sglang.page_keys import Deployment, ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import PoolSpec


@dataclass
class LiveDiff:
    master: str
    present: list[list[bool]]
    contiguous_pages: int
    first_missing: str | None
    diagnosis: list[dict[str, Any]] = field(default_factory=list)
    store_keys: int | None = None  # size of the key listing, when the diagnosis needed one
    kv_contiguous_pages: int | None = None  # batch_exists over the KV objects alone
    restorable_prefix_pages: list[int] | None = None  # 0.5.23 with side pools
    pool_hit_pages: dict[str, int] | None = None  # with side pools: SGLang's per-pool hits (no entry: none)

    @property
    def complete(self) -> bool:
        return self.first_missing is None


def loadable_prefix(report: KeyReport, deployment: Deployment, present: list[list[bool]]) -> LoadablePrefix:
    """SGLang's batch_exists_v2 over every selected rank (hit_policy.loadable_prefix) from the
    presence of the report's objects."""
    flag_of = {
        k: ok
        for row, flags in zip(report.pages, present, strict=True)
        for k, ok in zip(row.object_keys, flags, strict=True)
    }
    prefix = report.key_prefix
    page_keys = [p.page_key for p in report.pages]
    ranks = []
    for scheme, rank in zip(deployment.schemes(every_rank=bool(report.pools)), report.ranks, strict=True):

        def exists(
            pool: PoolSpec | None, pages: int, scheme: ObjectKeyScheme = scheme, rank: dict[str, Any] = rank
        ) -> list[bool]:
            suffixes = scheme.suffixes if pool is None else rank["pools"][pool.name]
            return [all(flag_of[f"{prefix}{page_keys[i]}{s}"] for s in suffixes) for i in range(pages)]

        ranks.append(exists)
    return hit_policy.loadable_prefix(deployment.version, report.pools, ranks, len(page_keys))


def live_diff(
    tokens: Sequence[int],
    page_size: int,
    deployment: Deployment,
    admin: AdminClient,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    try_extra_keys: Sequence[str] = (),
    try_cache_salts: Sequence[str] = (),
    report: KeyReport | None = None,
) -> LiveDiff:
    """Compare the expected objects of `tokens` with what the master at `admin` holds."""
    if report is None:
        report = expected_keys(tokens, page_size, deployment, extra_key=extra_key, cache_salt=cache_salt)
    exists = admin.exists(report.object_keys)
    present: list[list[bool]] = []
    at = 0
    for page in report.pages:
        present.append(exists[at : at + len(page.object_keys)])
        at += len(page.object_keys)
    prefix = loadable_prefix(report, deployment, present)
    first_missing = next(
        (
            k
            for row, flags in zip(report.pages, present, strict=True)
            for k, ok in zip(row.object_keys, flags, strict=True)
            if not ok
        ),
        None,
    )
    if prefix.kv_pages < len(report.pages):  # the object that ends the KV prefix, as batch_exists stops there
        row = report.pages[prefix.kv_pages]
        first_missing = next(
            k
            for k, ok, pool in zip(row.object_keys, present[prefix.kv_pages], row.object_pools, strict=True)
            if pool == "kv" and not ok
        )
    diff = LiveDiff(admin.address, present, prefix.pages, first_missing, kv_contiguous_pages=prefix.kv_pages)
    if report.pools:
        diff.restorable_prefix_pages = prefix.restorable
        diff.pool_hit_pages = prefix.pool_hit_pages
    # Present is not readable when the segment holding an object cannot be reached from here.
    readable_prefix = [k for page in report.pages[: prefix.pages] for k in page.object_keys]
    diff.diagnosis.extend(unreachable_holders(admin, readable_prefix))
    if first_missing is None:
        return diff
    lookup = Lookup(
        tokens=tokens,
        page_size=page_size,
        deployment=deployment,
        admin=admin,
        report=report,
        present=present,
        prefix=prefix,
        first_missing=first_missing,
        extra_key=extra_key,
        cache_salt=cache_salt,
        try_extra_keys=try_extra_keys,
        try_cache_salts=try_cache_salts,
    )
    for diagnose in DIAGNOSES:
        diff.diagnosis.extend(diagnose(lookup, diff.diagnosis))
    diff.store_keys = lookup.listing_size
    return diff
