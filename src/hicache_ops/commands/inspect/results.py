"""The result model of `hicache inspect keys` (its --json), built from a KeyReport, the live diff
(--master) and the side-pool choice (--sglang-url)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hicache_ops.results import OnlyWith, Result
from hicache_ops.sglang.views import (
    BufferView,
    DevicePoolView,
    GeometryView,
    HostPoolView,
    L3LayoutView,
    PageMetaView,
    SideHostPoolView,
    SidePageMetaView,
    SidePoolView,
)


class KeyPage(Result):
    omit_if_none = ("present",)

    index: int = Field(description="the page's position in the prompt, from 0")
    start: int = Field(description="first token of the page")
    end: int = Field(description="token after the page: the span is [start, end)")
    page_key: str = Field(description="the 64-hex page key")
    object_keys: list[str] = Field(description="every object key of every selected rank")
    present: list[bool] | None = Field(
        None, description="with --master: one bool per object_keys entry, whether the master holds it"
    )


SidePool = SidePoolView  # a side pool as inspect keys lists it


class InspectKeysResult(Result):
    """`hicache inspect keys --json`."""

    only_with = (
        OnlyWith(
            "--master",
            ("master", "contiguous_pages", "first_missing", "diagnosis", "store_keys", "kv_contiguous_pages"),
        ),
        OnlyWith("--master and side pools", ("pool_hit_pages", "restorable_prefix_pages")),
        OnlyWith("--sglang-url", ("pool_source", "l3_layout", "pool_disagreements")),
    )

    sglang_version: str = Field(description="the key scheme used (`0.5.14` or `0.5.23`)")
    page_size: int = Field(description="tokens per page")
    extra_key: str | None = Field(description="the namespace's extra_key after SGLang's normalisation")
    cache_salt: str | None = Field(description='the cache_salt after normalisation (`""` is no salt)')
    namespace_seed: str | None = Field(
        description="hex digest the 0.5.23 chain starts from; `null` without extra_key/cache_salt and for 0.5.14"
    )
    key_prefix: str = Field(description='what precedes every page key in object keys (`""` when none)')
    prompt_tokens: int = Field(description="tokens in the prompt")
    trailing_tokens: int = Field(description="tokens after the last whole page: no object is written for them")
    ranks: list[dict] = Field(
        description="each writing rank: `tp_rank`, `pp_rank`, `dcp_rank`, its object `suffixes` and each side "
        "pool's (`pools`)"
    )
    pages: list[KeyPage] = Field(description="one entry per whole page")
    notes: list[str] = Field(description="plain-language remarks (dropped trailing tokens, ignored salts, MLA)")
    pools: list[SidePool] = Field(description="the side pools whose objects follow the KV's on every page")
    master: str | None = Field(None, description="with --master: the admin address asked")
    contiguous_pages: int | None = Field(
        None, description="what SGLang's batch_exists(_v2) returns: the leading pages loadable on every rank"
    )
    first_missing: str | None = Field(None, description="the object key that ends the prefix, `null` when complete")
    diagnosis: list[dict] | None = Field(
        None, description="`[{kind, message, hint, ...}]` why the prefix is short; empty when complete"
    )
    store_keys: int | None = Field(None, description="keys the master listed when a diagnosis needed the listing")
    kv_contiguous_pages: int | None = Field(None, description="batch_exists over the KV objects alone")
    restorable_prefix_pages: list[int] | None = Field(None, description="0.5.23 with side pools")
    pool_hit_pages: dict[str, int] | None = Field(None, description="with side pools: SGLang's per-pool hit pages")
    pool_source: str | None = Field(
        None, description='with --sglang-url: where the side pools came from (`"l3_layout"` or the flags)'
    )
    l3_layout: L3LayoutView | None = Field(
        None, description="the server's L3 layout, with our key rule's disagreements"
    )
    pool_disagreements: list[dict] | None = Field(None, description="--pool flags that differ from the layout's")


def keys_result(report, diff=None, choice=None) -> InspectKeysResult:
    """The JSON result of a KeyReport (key_listing.py), with the LiveDiff's fields (live_diff.py) when
    the master was asked and the PoolChoice's (sglang/l3_layout.py) when --sglang-url chose the pools."""
    present = diff.present if diff is not None else [None] * len(report.pages)
    data = {
        "sglang_version": report.sglang_version,
        "page_size": report.page_size,
        "extra_key": report.extra_key,
        "cache_salt": report.cache_salt,
        "namespace_seed": report.namespace_seed,
        "key_prefix": report.key_prefix,
        "prompt_tokens": report.prompt_tokens,
        "trailing_tokens": report.trailing_tokens,
        "ranks": report.ranks,
        "pages": [
            KeyPage(
                index=page.index,
                start=page.start,
                end=page.end,
                page_key=page.page_key,
                object_keys=page.object_keys,
                present=flags,
            )
            for page, flags in zip(report.pages, present, strict=False)
        ],
        "notes": report.notes,
        "pools": [
            pool.view(list(dict.fromkeys(s for rank in report.ranks for s in rank["pools"][pool.name])))
            for pool in report.pools
        ],
    }
    if diff is not None:
        data |= {
            "master": diff.master,
            "contiguous_pages": diff.contiguous_pages,
            "first_missing": diff.first_missing,
            "diagnosis": diff.diagnosis,
            "store_keys": diff.store_keys,
            "kv_contiguous_pages": diff.kv_contiguous_pages,
        }
        if diff.pool_hit_pages is not None:
            data |= {"restorable_prefix_pages": diff.restorable_prefix_pages, "pool_hit_pages": diff.pool_hit_pages}
    if choice is not None:
        data |= choice.result_fields()
    return InspectKeysResult(**data)


class SideLayoutPool(SideHostPoolView):
    pages: list[SidePageMetaView] = Field(description="the chosen pages' byte ranges and objects")


_HOST = HostPoolView.model_fields


class LayoutResult(Result):
    """`hicache inspect layout --json`: the rewrites, one rank's host pool, chosen pages, side pools."""

    sglang_version: str = Field(description="the SGLang release whose rules apply")
    layout: str = Field(description="the host layout asked for")
    effective_layout: str = Field(description="the layout SGLang runs with after its start-up rewrites")
    requested_io_backend: str = Field(description="the io backend asked for")
    io_backend: str = Field(description="the io backend SGLang runs with")
    mooncake: bool = Field(description="the Mooncake backend is on (its rewrites and zero-copy rules apply)")
    geometry: GeometryView = Field(description=_HOST["geometry"].description)
    page_size: int = Field(description=_HOST["page_size"].description)
    tp_size: int = Field(description=_HOST["tp_size"].description)
    tp_lcm_size: int | None = Field(description=_HOST["tp_lcm_size"].description)
    heads_per_rank: int = Field(description=_HOST["heads_per_rank"].description)
    device_tokens: int = Field(description=_HOST["device_tokens"].description)
    hicache_ratio: int | float = Field(description=_HOST["hicache_ratio"].description)
    hicache_size_gb: int | float = Field(description=_HOST["hicache_size_gb"].description)
    bytes_per_token: int = Field(description=_HOST["bytes_per_token"].description)
    bytes_per_page: int = Field(description=_HOST["bytes_per_page"].description)
    size_tokens: int = Field(description=_HOST["size_tokens"].description)
    page_num: int = Field(description=_HOST["page_num"].description)
    host_bytes: int = Field(description=_HOST["host_bytes"].description)
    buffers: list[BufferView] = Field(description=_HOST["buffers"].description)
    split_factor: int = Field(description=_HOST["split_factor"].description)
    objects_per_page: int = Field(description=_HOST["objects_per_page"].description)
    mooncake_objects_per_page: int = Field(description=_HOST["mooncake_objects_per_page"].description)
    mooncake_zero_copy: bool = Field(description=_HOST["mooncake_zero_copy"].description)
    device_pool: DevicePoolView = Field(description="the L1 pool one rank keeps")
    pages: list[PageMetaView] = Field(description="the chosen pages' byte ranges (pages 0, 1 and the last by default)")
    pools: list[SideLayoutPool] = Field(description="each side pool's host pool and chosen pages")
    rewrites: list[str] = Field(description="SGLang's start-up rewrites of the layout and io backend")
    notes: list[str] = Field(description="plain-language remarks (the rewrites among them)")
    warnings: list[str] = Field(description="what SGLang does silently with these flags")


class SegmentProblem(Result):
    """A segment whose Transfer Engine endpoint a reader on another host cannot dial."""

    segment: str = Field(description="the segment's name")
    te_endpoint: str | None = Field(description="the endpoint the segment registered")
    problem: str = Field(description="what is wrong with it (a loopback or unresolvable host)")
    host: str | None = Field(description="the host part of the endpoint")
    host_candidates: list[str] = Field(description="hosts the endpoint could have meant")
    note: str | None = Field(description="what a reader on another host meets")


class NamespaceOnMaster(Result):
    """One request namespace a serve on this master keyed pages under (from its marker object)."""

    extra_key: str | None = Field(description="the requests' extra_key, null when not set")
    cache_salt: str | None = Field(description="the requests' cache_salt, null when not set")


class StoreResult(Result):
    """`hicache inspect store --json`: the master's health, segments, key counts and SGLang key groups."""

    # Present only with --sglang-url (its pools are checked against the listing), null or not.
    only_with = (
        OnlyWith("--sglang-url", ("pool_source", "l3_layout", "l3_layout_note", "server_pools"), given="with_server"),
    )
    with_server: bool = Field(False, exclude=True)

    master: str = Field(description="the master's HOST:METRICS_PORT")
    ready: bool = Field(description="whether the master says it serves")
    health: dict[str, Any] = Field(description="the master's health answer as it gave it")
    segments: list[dict[str, Any]] = Field(description="one row per mounted segment (name, endpoint, sizes, status)")
    segment_problems: list[SegmentProblem] = Field(description="segments another host cannot reach")
    capacity_bytes: int = Field(description="bytes of every segment together")
    used_bytes: int = Field(description="bytes in use")
    used_fraction: float | None = Field(description="used over capacity; null with no capacity")
    key_count: int = Field(description="objects the master holds")
    metrics: dict[str, Any] = Field(description="the master's key and size metrics")
    limit: int = Field(description="the longest list shown (--limit)")
    prefix_filter: str | None = Field(description="--prefix, null when not given")
    matched_keys: int = Field(description="keys matching --prefix (all keys without it)")
    warmup_keys: int = Field(description="SGLang's start-up probe objects")
    unified_scheme_keys: int = Field(description="keys of the unified (hybrid-model) key scheme")
    namespace_marker_keys: int = Field(
        description="namespace markers hicache serves left (one per extra_key/cache_salt they keyed pages under)"
    )
    namespaces: list[NamespaceOnMaster] = Field(description="the namespaces those markers name (at most --limit)")
    other_keys: int = Field(description="keys neither SGLang's naming nor a namespace marker explains")
    groups: list[dict[str, Any]] = Field(description="one group per SGLang key prefix: pages, suffixes, completeness")
    group_count: int = Field(description="groups found (at most --limit listed)")
    other_key_samples: list[str] = Field(description="some of the other keys")
    truncated: bool = Field(description="whether a list was cut at --limit")
    pool_source: str | None = Field(None, description="with --sglang-url: where the pools came from")
    l3_layout: L3LayoutView | None = Field(None, description="with --sglang-url: the server's L3 layout")
    l3_layout_note: str | None = Field(None, description="with --sglang-url: why no layout was read")
    server_pools: dict[str, Any] | None = Field(None, description="with --sglang-url: each pool checked in the listing")
