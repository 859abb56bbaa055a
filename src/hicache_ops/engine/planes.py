"""What the tiered cache asks of the bytes and of L3, and the accounting-only implementations.

The cache (cache.py) decides; a `DataPlane` moves KV between the device and host pools of every
rank, and an `L3Tier` answers storage queries and moves pages between host pages and the store.
The accounting implementations here move nothing, so the same tree, eviction and policy code runs
at benchmark scale; bytes.py holds the real-bytes implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hicache_ops.sglang.hit_policy import (
    LoadablePrefix,
    PagePresence,
    kv_only,
    loadable_prefix,
    writes_side_pool,
    written_pages,
)
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.side_pool_specs import PoolSpec, pool_suffixes


class DataPlane(Protocol):
    def compute(self, device_pages: list[int], storage_keys: list[str]) -> None:
        """Write the reference KV of each page into the device pool (the prefill)."""

    def backup(self, device_pages: list[int], host_pages: list[int]) -> int:
        """Copy device pages to host pages; return the bytes moved (all ranks)."""

    def load(self, host_pages: list[int], device_pages: list[int], storage_keys: list[str]) -> tuple[int, list[str]]:
        """Copy host pages to device pages, verify them; return (bytes moved, storage keys of the
        pages whose bytes differ from the reference)."""


@dataclass
class ReadOutcome:
    """Per page: whether every object arrived, the seconds since the read began when it
    completed, and whether its bytes verified; plus the bytes moved."""

    ok: list[bool] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)
    verified: list[bool] = field(default_factory=list)
    nbytes: int = 0
    # Objects that read a byte count other than this deployment's object size: written by a
    # deployment with another dtype, head count or page size under the same keys.
    size_mismatches: list[dict[str, Any]] = field(default_factory=list)
    side_objects: int = 0  # side-pool objects read (docs/side-pools.md#side-objects-in-the-engine)
    # Side-pool objects that read <= 0 bytes or other bytes than their reference: {"key", "pool", "page", "why"}.
    side_failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class WriteOutcome:
    written: int = 0  # objects put
    skipped: int = 0  # objects already present (batch_is_exist said so)
    failed: list[str] = field(default_factory=list)  # object keys whose put failed
    nbytes: int = 0
    # Per object, for tracing: {"key", "rank", "existed", "ptr", "size", "code"} (code None: skipped).
    objects: list[dict[str, Any]] = field(default_factory=list)
    side_written: int = 0  # of `written`, side-pool objects (their records carry "pool")


class L3Tier(Protocol):
    schemes: list[ObjectKeyScheme]

    def contiguous_hits(self, storage_keys: list[str]) -> list[int]:
        """Per rank, the leading pages whose objects all exist (SGLang's batch_exists)."""

    def lookup(self, storage_keys: list[str]) -> LoadablePrefix:
        """What SGLang's batch_exists_v2 makes of the pages over every rank: the KV prefix, then
        each side pool's hit policy (without side pools, the least contiguous hit)."""

    def write(self, storage_keys: list[str], host_pages: list[int]) -> tuple[list[bool], WriteOutcome]:
        """Back pages up to L3; per page whether every rank's objects are now there."""

    def read(self, storage_keys: list[str], host_pages: list[int]) -> ReadOutcome:
        """Read pages from L3 into host pages (every rank), verifying each page's bytes."""


class AccountingPlane:
    """Moves no bytes; reports the bytes a real plane would move."""

    def __init__(self, bytes_per_page: int):
        self.bytes_per_page = bytes_per_page

    def compute(self, device_pages: list[int], storage_keys: list[str]) -> None:
        return None

    def backup(self, device_pages: list[int], host_pages: list[int]) -> int:
        return len(device_pages) * self.bytes_per_page

    def load(self, host_pages: list[int], device_pages: list[int], storage_keys: list[str]) -> tuple[int, list[str]]:
        return len(device_pages) * self.bytes_per_page, []


class MemoryL3:
    """An unbounded in-process L3 that records object keys only (accounting mode)."""

    def __init__(
        self,
        schemes: list[ObjectKeyScheme],
        bytes_per_page: int,
        read_latency_s: float = 0.0,
        pools: tuple[PoolSpec, ...] = (),
        side_object_bytes: int = 0,
    ):
        self.schemes = schemes
        self.bytes_per_page = bytes_per_page
        # Simulated seconds per page read (virtual time, nothing sleeps): shows the stop policies.
        self.read_latency_s = read_latency_s
        self.objects: set[str] = set()
        self.pools = tuple(pools)
        self.side_object_bytes = side_object_bytes
        self._side = side_layout(schemes, self.pools)

    def lookup(self, storage_keys: list[str]) -> LoadablePrefix:
        if not self.pools:
            hits = self.contiguous_hits(storage_keys)
            return kv_only(hits)
        contains = self.objects.__contains__

        def presence(scheme: ObjectKeyScheme, side: dict[str, list[str]]) -> PagePresence:
            prefix = scheme.prefix

            def exists(pool: PoolSpec | None, pages: int) -> list[bool]:
                suffixes = scheme.suffixes if pool is None else side[pool.name]
                return [all(contains(prefix + key + s) for s in suffixes) for key in storage_keys[:pages]]

            return exists

        ranks = [presence(scheme, side) for scheme, side in zip(self.schemes, self._side, strict=True)]
        return loadable_prefix(self.schemes[0].version, self.pools, ranks, len(storage_keys))

    def contiguous_hits(self, storage_keys: list[str]) -> list[int]:
        # SGLang asks in batches of policy.STORAGE_BATCH_PAGES and stops at the first short batch,
        # which ends the count at the same page as one pass: the leading pages whose objects all
        # exist. Every object is looked up in one C-level pass (this runs for every page queried).
        hits = []
        contains = self.objects.__contains__
        for scheme in self.schemes:
            prefix, suffixes = scheme.prefix, scheme.suffixes
            wanted = [prefix + key + suffix for key in storage_keys for suffix in suffixes]
            present = list(map(contains, wanted))
            try:
                hits.append(present.index(False) // len(suffixes))
            except ValueError:
                hits.append(len(storage_keys))
        return hits

    def write(self, storage_keys: list[str], host_pages: list[int]) -> tuple[list[bool], WriteOutcome]:
        outcome = WriteOutcome()
        objects = self.objects
        for scheme in self.schemes:
            for key in scheme.all_object_keys(storage_keys):
                if key in objects:
                    outcome.skipped += 1
                else:
                    objects.add(key)
                    outcome.written += 1
        outcome.nbytes = len(storage_keys) * self.bytes_per_page
        for obj in side_object_keys(self.schemes, self._side, self.pools, storage_keys):
            if obj["key"] in objects:
                outcome.skipped += 1
            else:
                objects.add(obj["key"])
                outcome.written += 1
                outcome.side_written += 1
                outcome.nbytes += self.side_object_bytes
        return [True] * len(storage_keys), outcome

    def read(self, storage_keys: list[str], host_pages: list[int]) -> ReadOutcome:
        n = len(storage_keys)
        latency = self.read_latency_s
        done_at = [(i + 1) * latency for i in range(n)] if latency else [latency] * n
        return ReadOutcome(ok=[True] * n, done_at=done_at, verified=[True] * n, nbytes=n * self.bytes_per_page)


def side_layout(schemes: list[ObjectKeyScheme], pools: tuple[PoolSpec, ...]) -> list[dict[str, list[str]]]:
    """Per rank, each side pool's object suffixes (SGLang's order)."""
    return [{pool.name: pool_suffixes(pool, scheme) for pool in pools} for scheme in schemes]


def side_object_keys(
    schemes: list[ObjectKeyScheme],
    side: list[dict[str, list[str]]],
    pools: tuple[PoolSpec, ...],
    storage_keys: list[str],
) -> list[dict[str, Any]]:
    """The side-pool objects one node's L3 backup writes: per writing rank and pool, the pages the
    pool's rule picks (hit_policy.written_pages), as {"key", "rank", "pool", "page", "page_key", "suffix"}."""
    out: list[dict[str, Any]] = []
    for scheme, suffixes in zip(schemes, side, strict=True):
        for pool in pools:
            if not writes_side_pool(scheme.version, scheme, pool):
                continue
            for page in written_pages(pool, len(storage_keys)):
                out.extend(
                    {
                        "key": f"{scheme.prefix}{storage_keys[page]}{suffix}",
                        "rank": scheme.tp_rank,
                        "pool": pool.name,
                        "page": page,
                        "page_key": storage_keys[page],
                        "suffix": suffix,
                    }
                    for suffix in suffixes[pool.name]
                )
    return out
