"""Real bytes: per-rank device (L1) and host (L2) pools, the transfer kernels, and Mooncake as L3.

Each tp rank owns a layer-first device pool and a host pool in an SGLang layout, holding its share
of the KV heads (MLA: the full latent row, replicated). Under 0.5.23 decode context parallel a rank
holds only its DCP shard of every page: token i of a logical page belongs to shard i % dcp_size,
at row i // dcp_size of the rank's page (docs/keys.md#dcp-token-split). Device page p occupies slots
(p+1)*page_size.. like SGLang's padded pool, whose first page absorbs padded writes.
`compute` writes the reference KV of each page (reference.py); every load-back and every L3 read
is compared byte for byte with a fresh reference, and mismatches are counted, never hidden.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from hicache_ops.engine.planes import ReadOutcome, WriteOutcome, side_layout, side_object_keys
from hicache_ops.engine.reference import reference_page, reference_side_object
from hicache_ops.kernels import transfer
from hicache_ops.sglang.geometry import ModelGeometry
from hicache_ops.sglang.hit_policy import LoadablePrefix, PagePresence, kv_only, loadable_prefix, read_pages
from hicache_ops.sglang.host_pool import DevicePoolLayout, HostPoolLayout
from hicache_ops.sglang.page_keys import ObjectKeyScheme
from hicache_ops.sglang.policy import STORAGE_BATCH_PAGES
from hicache_ops.sglang.side_pool_specs import PoolSpec

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NP_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


@dataclass
class SideHost:
    """One rank's host memory for side-pool objects, registered with the store: one slot per host
    page holding each pool's objects back to back (docs/side-pools.md#side-objects-in-the-engine)."""

    buffer: torch.Tensor  # (host pages, slot bytes) uint8
    offsets: dict[str, dict[str, int]]  # pool -> suffix -> offset in the slot
    object_bytes: int

    def ptr(self, host_page: int, pool: str, suffix: str) -> int:
        return self.buffer.data_ptr() + host_page * self.buffer.shape[1] + self.offsets[pool][suffix]

    def fill(self, host_page: int, pool: str, suffix: str, data: np.ndarray) -> None:
        at = self.offsets[pool][suffix]
        self.buffer[host_page, at : at + self.object_bytes] = torch.from_numpy(data)

    def holds(self, host_page: int, pool: str, suffix: str, data: np.ndarray) -> bool:
        at = self.offsets[pool][suffix]
        return bool(np.array_equal(self.buffer[host_page, at : at + self.object_bytes].numpy(), data))


def allocate_side(host_pages: int, suffixes: dict[str, list[str]], object_bytes: int) -> SideHost:
    offsets: dict[str, dict[str, int]] = {}
    at = 0
    for pool, names in suffixes.items():
        offsets[pool] = {}
        for suffix in names:
            offsets[pool][suffix] = at
            at += object_bytes
    return SideHost(torch.zeros((host_pages, at), dtype=torch.uint8), offsets, object_bytes)


@dataclass
class RankPools:
    rank: int
    device_k: torch.Tensor  # (L, slots, H, D); MLA: (L, slots, 1, C)
    device_v: torch.Tensor | None  # MHA only
    host: torch.Tensor  # SGLang's host buffer for the layout
    host_layout: HostPoolLayout
    side: SideHost | None = None  # with side pools (EngineSpec.side_pools)

    def side_host(self) -> SideHost:
        """The rank's side-pool slots, which every rank of a deployment with side pools has."""
        if self.side is None:
            raise RuntimeError(
                f"tp rank {self.rank} has no side-pool host memory: the engine was built without side pools."
            )
        return self.side

    @property
    def device(self) -> tuple[torch.Tensor, ...] | torch.Tensor:
        return self.device_k if self.device_v is None else (self.device_k, self.device_v)


def allocate_rank(
    rank: int,
    geometry: ModelGeometry,
    host_layout: HostPoolLayout,
    device_tokens: int,
    page_size: int,
    tp_size: int,
    torch_device: str,
) -> RankPools:
    dev = DevicePoolLayout(geometry, device_tokens, page_size, tp_size)
    dtype = geometry.torch_dtype()
    k = torch.zeros(dev.k_shape, dtype=dtype, device=torch_device)
    v = torch.zeros(dev.v_shape, dtype=dtype, device=torch_device) if dev.v_shape is not None else None
    pin = torch_device.startswith("cuda")
    host = torch.zeros(host_layout.buffer_shape, dtype=dtype, pin_memory=pin)
    return RankPools(rank, k, v, host, host_layout)


class BytesPlane:
    """Moves and verifies real KV bytes for every rank."""

    def __init__(
        self, ranks: list[RankPools], geometry: ModelGeometry, page_size: int, tp_size: int, dcp_size: int = 1
    ):
        self.ranks = ranks
        self.geometry = geometry
        self.logical_page_size = page_size  # the tree's page (the page keys' tokens)
        self.dcp_size = dcp_size
        self.page_size = page_size // dcp_size  # tokens of each page one rank's pools hold
        self.tp_size = tp_size
        self.layout = ranks[0].host_layout.layout
        self.bytes_per_page = ranks[0].host_layout.bytes_per_page  # one rank
        self._int = _INT_VIEW[geometry.itemsize]
        self._np_int = _NP_INT[geometry.itemsize]

    def dcp_rank(self, rank: int) -> int:
        """The DCP shard tp rank `rank` holds (SGLang's contiguous groups: tp_rank % dcp_size)."""
        return rank % self.dcp_size

    # reference bytes as a torch tensor in the pool's dtype
    def reference(self, storage_key: str, rank: int, device: torch.device) -> torch.Tensor:
        ref = reference_page(storage_key, self.geometry, self.logical_page_size, rank, self.tp_size)
        if self.dcp_size > 1:  # MLA (L, page, 1, C): this rank's interleaved tokens
            ref = np.ascontiguousarray(ref[:, self.dcp_rank(rank) :: self.dcp_size])
        return torch.from_numpy(ref.view(self._np_int)).to(device).view(self.ranks[0].device_k.dtype)

    def _slots(self, page: int) -> slice:
        start = (page + 1) * self.page_size
        return slice(start, start + self.page_size)

    def compute(self, device_pages: list[int], storage_keys: list[str]) -> None:
        for pools in self.ranks:
            for page, key in zip(device_pages, storage_keys, strict=True):
                ref = self.reference(key, pools.rank, pools.device_k.device)
                s = self._slots(page)
                if pools.device_v is None:
                    pools.device_k[:, s] = ref
                else:
                    pools.device_k[:, s] = ref[0]
                    pools.device_v[:, s] = ref[1]

    def backup(self, device_pages: list[int], host_pages: list[int]) -> int:
        dev = [p + 1 for p in device_pages]
        for pools in self.ranks:
            transfer.backup(
                pools.device,
                pools.host,
                device_indices=dev,
                host_indices=host_pages,
                layout=self.layout,
                page_size=self.page_size,
                unit="page",
            )
        self._sync()
        return len(device_pages) * self.bytes_per_page * len(self.ranks)

    def load(self, host_pages: list[int], device_pages: list[int], storage_keys: list[str]) -> tuple[int, list[str]]:
        dev = [p + 1 for p in device_pages]
        for pools in self.ranks:
            transfer.load(
                pools.host,
                pools.device,
                host_indices=host_pages,
                device_indices=dev,
                layout=self.layout,
                page_size=self.page_size,
                unit="page",
            )
        self._sync()
        bad = [k for p, k in zip(device_pages, storage_keys, strict=True) if not self.device_page_ok(p, k)]
        return len(device_pages) * self.bytes_per_page * len(self.ranks), bad

    def device_page_ok(self, page: int, storage_key: str) -> bool:
        """Whether every rank's device copy of a page equals its reference bytes."""
        s = self._slots(page)
        for pools in self.ranks:
            ref = self.reference(storage_key, pools.rank, pools.device_k.device).view(self._int)
            got_k = pools.device_k[:, s].view(self._int)
            if pools.device_v is None:
                if not torch.equal(got_k, ref):
                    return False
            elif not (torch.equal(got_k, ref[0]) and torch.equal(pools.device_v[:, s].view(self._int), ref[1])):
                return False
        return True

    def host_page_ok(self, pools: RankPools, page: int, storage_key: str) -> bool:
        """Whether one rank's host copy of a page equals its reference bytes (any layout)."""
        g = self.geometry
        heads = 1 if g.mla else g.heads_per_rank(self.tp_size)
        shape = (g.layers, self.page_size, heads, g.kv_cache_dim)
        k = torch.empty(shape, dtype=pools.host.dtype)
        scratch = k if g.mla else (k, torch.empty_like(k))
        transfer.load(
            pools.host,
            scratch,
            host_indices=[page],
            device_indices=[0],
            layout=self.layout,
            page_size=self.page_size,
            unit="page",
        )
        ref = self.reference(storage_key, pools.rank, torch.device("cpu")).view(self._int)
        if g.mla:
            return torch.equal(k.view(self._int), ref)
        return torch.equal(k.view(self._int), ref[0]) and torch.equal(scratch[1].view(self._int), ref[1])

    def _sync(self) -> None:
        if self.ranks and self.ranks[0].device_k.is_cuda:
            for pools in self.ranks:
                torch.cuda.synchronize(pools.device_k.device)


class L3Store(Protocol):
    """What MooncakeL3 needs of a store client (hicache_ops.mooncake.store_client.StoreClient)."""

    def batch_is_exist(self, keys: Sequence[str]) -> list[bool]: ...

    def batch_put_from(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...

    def batch_get_into(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]: ...


class MooncakeL3:
    """L3 through a Mooncake store: every rank's objects, named exactly as SGLang names them.

    `store` is a client with batch_is_exist / batch_put_from / batch_get_into over registered
    buffers (hicache_ops.mooncake.store_client); each rank's host pool must be registered with it.
    """

    def __init__(
        self, store: L3Store, schemes: list[ObjectKeyScheme], plane: BytesPlane, pools: tuple[PoolSpec, ...] = ()
    ):
        self.store = store
        self.schemes = schemes
        self.plane = plane
        self._writing = [s for s in schemes if s.writes]
        self.pools = tuple(pools)
        self._side = side_layout(schemes, self.pools)
        # Simulated extra seconds per page read (fault injection for the stop policies; the
        # bytes still move at full speed, only the completion times the policy sees shift).
        self.extra_latency_s = 0.0

    def _pools(self, scheme: ObjectKeyScheme) -> RankPools:
        return self.plane.ranks[scheme.tp_rank]

    def _io(
        self, scheme: ObjectKeyScheme, storage_keys: list[str], host_pages: list[int]
    ) -> tuple[list[str], list[int], list[int]]:
        """The rank's object keys for the pages, with their host pool addresses and sizes."""
        pools = self._pools(scheme)
        base = pools.host.data_ptr()
        offsets, sizes = pools.host_layout.flat_meta(host_pages)
        return scheme.all_object_keys(storage_keys), [base + o for o in offsets], sizes

    def lookup(self, storage_keys: list[str]) -> LoadablePrefix:
        hits = self.contiguous_hits(storage_keys)
        if not self.pools:
            return kv_only(hits)
        presence = self.side_presence(storage_keys, max(hits, default=0))

        def rank_exists(rank: int, kv_pages: int) -> PagePresence:
            def exists(pool: PoolSpec | None, pages: int) -> list[bool]:
                if pool is None:
                    return [i < kv_pages for i in range(pages)]
                objects = presence[rank][pool.name]
                return [all(o["present"] for o in objects[i]) for i in range(pages)]

            return exists

        ranks = [rank_exists(r, kv) for r, kv in enumerate(hits)]
        return loadable_prefix(self.schemes[0].version, self.pools, ranks, len(storage_keys))

    def side_presence(self, storage_keys: list[str], pages: int) -> list[dict[str, list[list[dict[str, Any]]]]]:
        """Per rank, pool and page (the first `pages`), each side object with whether the master holds it."""
        wanted = [
            (r, pool.name, i, f"{scheme.prefix}{storage_keys[i]}{suffix}")
            for r, (scheme, side) in enumerate(zip(self.schemes, self._side, strict=True))
            for pool in self.pools
            for i in range(pages)
            for suffix in side[pool.name]
        ]
        flags = self.store.batch_is_exist([w[3] for w in wanted]) if wanted else []
        out: list[dict[str, list[list[dict[str, Any]]]]] = [
            {pool.name: [[] for _ in range(pages)] for pool in self.pools} for _ in self.schemes
        ]
        for (r, pool, i, key), present in zip(wanted, flags, strict=True):
            out[r][pool][i].append({"key": key, "present": bool(present)})
        return out

    def contiguous_hits(self, storage_keys: list[str]) -> list[int]:
        hits = []
        for scheme in self.schemes:
            per_page = len(scheme.suffixes)
            count = 0
            for start in range(0, len(storage_keys), STORAGE_BATCH_PAGES):
                batch = storage_keys[start : start + STORAGE_BATCH_PAGES]
                exists = self.store.batch_is_exist(scheme.all_object_keys(batch))
                n = 0
                while n < len(batch) and all(exists[n * per_page : (n + 1) * per_page]):
                    n += 1
                count += n
                if n < len(batch):
                    break
            hits.append(count)
        return hits

    def write(self, storage_keys: list[str], host_pages: list[int]) -> tuple[list[bool], WriteOutcome]:
        outcome = WriteOutcome()
        ok = [True] * len(storage_keys)
        for scheme in self._writing:
            keys, ptrs, sizes = self._io(scheme, storage_keys, host_pages)
            per_page = len(scheme.suffixes)
            exists = self.store.batch_is_exist(keys)  # SGLang puts only what is missing
            todo = [i for i, e in enumerate(exists) if not e]
            outcome.skipped += len(keys) - len(todo)
            codes = dict.fromkeys(range(len(keys)))
            if todo:
                put = self.store.batch_put_from(
                    [keys[i] for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo]
                )
                for i, code in zip(todo, put, strict=True):
                    codes[i] = code
                    if code == 0:
                        outcome.written += 1
                        outcome.nbytes += sizes[i]
                    else:
                        outcome.failed.append(keys[i])
                        ok[i // per_page] = False
            outcome.objects.extend(
                {
                    "key": keys[i],
                    "rank": scheme.tp_rank,
                    "existed": exists[i],
                    "ptr": ptrs[i],
                    "size": sizes[i],
                    "code": codes[i],
                }
                for i in range(len(keys))
            )
        if self.pools:
            self._write_side(storage_keys, host_pages, outcome)
        return ok, outcome

    def _write_side(self, storage_keys: list[str], host_pages: list[int], outcome: WriteOutcome) -> None:
        """Each side object the node's backup writes (hit_policy.written_pages), from its host slot.
        The engine's host copy of a side state is its reference bytes, written into the slot here."""
        objects = side_object_keys(self.schemes, self._side, self.pools, storage_keys)
        if not objects:
            return
        for o in objects:
            side = self.plane.ranks[o["rank"]].side_host()
            side.fill(
                host_pages[o["page"]],
                o["pool"],
                o["suffix"],
                reference_side_object(storage_keys[o["page"]], o["suffix"], side.object_bytes),
            )
            o["ptr"] = side.ptr(host_pages[o["page"]], o["pool"], o["suffix"])
            o["size"] = side.object_bytes
        exists = self.store.batch_is_exist([o["key"] for o in objects])
        todo = [o for o, e in zip(objects, exists, strict=True) if not e]
        outcome.skipped += len(objects) - len(todo)
        codes = (
            self.store.batch_put_from([o["key"] for o in todo], [o["ptr"] for o in todo], [o["size"] for o in todo])
            if todo
            else []
        )
        for o, code in zip(todo, codes, strict=True):
            o["code"] = code
            if code == 0:
                outcome.written += 1
                outcome.side_written += 1
                outcome.nbytes += o["size"]
            else:
                outcome.failed.append(o["key"])
        for o, e in zip(objects, exists, strict=True):
            outcome.objects.append({**o, "existed": bool(e), "code": o.get("code")})

    def read(self, storage_keys: list[str], host_pages: list[int]) -> ReadOutcome:
        n = len(storage_keys)
        outcome = ReadOutcome(ok=[True] * n, done_at=[0.0] * n, verified=[True] * n)
        start = time.perf_counter()
        for scheme in self.schemes:
            keys, ptrs, sizes = self._io(scheme, storage_keys, host_pages)
            per_page = len(scheme.suffixes)
            results = []
            for b in range(0, n, STORAGE_BATCH_PAGES):  # batches, so completion times are per batch
                lo, hi = b * per_page, min(n, b + STORAGE_BATCH_PAGES) * per_page
                results.extend(self.store.batch_get_into(keys[lo:hi], ptrs[lo:hi], sizes[lo:hi]))
                now = time.perf_counter() - start
                for page in range(b, min(n, b + STORAGE_BATCH_PAGES)):
                    outcome.done_at[page] = max(outcome.done_at[page], now)
            for i, got in enumerate(results):
                if got <= 0:  # SGLang: a page succeeds only if every object read > 0 bytes
                    outcome.ok[i // per_page] = False
                else:
                    outcome.nbytes += got
                    if got != sizes[i]:
                        outcome.size_mismatches.append({"key": keys[i], "read": got, "expected": sizes[i]})
        if self.extra_latency_s:
            outcome.done_at = [t + (i + 1) * self.extra_latency_s for i, t in enumerate(outcome.done_at)]
        for page, key in enumerate(storage_keys):
            if outcome.ok[page]:
                outcome.verified[page] = all(
                    self.plane.host_page_ok(self._pools(s), host_pages[page], key) for s in self.schemes
                )
        if self.pools:
            self._read_side(storage_keys, host_pages, outcome)
        return outcome

    def _read_side(self, storage_keys: list[str], host_pages: list[int], outcome: ReadOutcome) -> None:
        """Every rank reads each pool's objects of the pages its hit policy loads (all pages, or the
        last N before the stop point) into its side slots, verified against the reference bytes."""
        wanted: list[tuple[SideHost, PoolSpec, int, str, str, int]] = []  # (slots, pool, page, suffix, key, ptr)
        got: list[int] = []
        for scheme, suffixes in zip(self.schemes, self._side, strict=True):
            side = self._pools(scheme).side_host()
            mine = [
                (
                    side,
                    pool,
                    page,
                    suffix,
                    f"{scheme.prefix}{storage_keys[page]}{suffix}",
                    side.ptr(host_pages[page], pool.name, suffix),
                )
                for pool in self.pools
                for page in read_pages(pool, len(storage_keys))
                for suffix in suffixes[pool.name]
            ]
            if mine:  # one call per rank, as the KV: ranks of an MLA deployment read the same keys
                got.extend(
                    self.store.batch_get_into(
                        [w[4] for w in mine], [w[5] for w in mine], [side.object_bytes] * len(mine)
                    )
                )
                wanted.extend(mine)
        for (side, pool, page, suffix, key, _), n in zip(wanted, got, strict=True):
            if n <= 0:
                outcome.ok[page] = False
                outcome.side_failures.append({"key": key, "pool": pool.name, "page": page, "why": f"read {n} bytes"})
                continue
            outcome.nbytes += n
            outcome.side_objects += 1
            ref = reference_side_object(storage_keys[page], suffix, side.object_bytes)
            if n != side.object_bytes or not side.holds(host_pages[page], pool.name, suffix, ref):
                outcome.verified[page] = False
                outcome.side_failures.append(
                    {"key": key, "pool": pool.name, "page": page, "why": "bytes differ from the reference"}
                )
