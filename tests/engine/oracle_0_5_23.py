"""SGLang 0.5.23's own HiCache tree, driven on CPU pools, as the oracle for the engine.

`replay(workloads, config)` builds, per workload, SGLang's `UnifiedRadixCache` (compiled tree
core, the default) with HiCache: a CPU `MHATokenToKVPool` behind a `PagedTokenToKVPoolAllocator`,
a host pool and its `HybridCacheController`, from `ServerArgs` the way a server would. It then
replays the workload's requests one at a time, the way the scheduler serves a lone request:

1. match the prompt (key limited to len - 1, as `Req._compute_max_prefix_len` does) and lock the
   device prefix;
2. a host hit is loaded back through `init_load_back` (its own threshold of 10 tokens applies)
   and completed by `check_hicache_events`;
3. device slots for the unmatched prompt come from SGLang's own allocation for a batch of one
   (`alloc_token_slots` at page 1, else `alloc_paged_token_slots_extend`, whose eviction asks
   for the extend tokens and a page more); a request with more than one output token then
   inserts the prompt's page-aligned part
   (`checkpoint_kv_cache` after prefill: the write policy backs nodes up from here) and moves its
   lock to the inserted node (a request whose one output token came from the prefill finishes
   at once and skips this);
4. decode takes a slot per step for every output token but the last (whose KV is never
   written), through `alloc_paged_token_slots_decode` (a page's eviction asked for each step,
   `check_hicache_events` between steps); at finish prompt + output minus the last token is
   inserted (then the prompt's aligned part again, which splits the leaf at the prompt
   boundary), unpublished slots are freed and the lock released; then the scheduler's per-step
   `check_hicache_events`.

Per request it returns the device and host hit tokens the scheduler would count and the device
tokens evicted while serving it: every eviction counts, the allocations' and the ones
`init_load_back` makes for the pages it loads (the cache instance's `_evict`, which both
`evict` and `evict_for_alloc` call, is wrapped to add up what it reports; it runs unchanged).

`init_load_back` reads a few fields of the scheduler's `Req` (rid, last_node, the SWA/mamba host
hit lengths, kv.mamba_pool_idx); the oracle passes a plain handle with those fields (a FULL-only
tree: the SWA/mamba ones are 0/None). The tree's other calls take no request.

What is replaced to run on CPU (nothing else of SGLang is changed):
- The host pool is created with `pin_memory=False` (`HostKVCache.__init__` receives it): pinning
  registers the buffer with the CUDA driver, which needs a GPU.
- `transfer_kv_direct` (sgl_kernel's CUDA op, bound in `pool_host/mha.py` for the "direct" I/O
  backend with the layer_first layout) is replaced by a torch row copy on CPU with the same
  source/destination rows. The "kernel" I/O backend has no CPU path at all (sgl_kernel's
  transfer_kv_per_layer / all_layer ops are CUDA kernels), which is why the oracle uses "direct".

With `config.storage`, SGLang's own file backend (`HiCacheFile`, an empty temporary folder per
workload) is the L3 tier. At arrival the oracle applies the scheduler's `_prefetch_kvcache` gate
(the match's host anchor backed up, or the root) and calls `prefetch_from_storage` with the
unmatched span (up to len - 1), then loops `check_hicache_events` + `check_prefetch_progress` until
done under `wait_complete` (the outcome then does not depend on thread timing), pops the loaded
tokens and matches again, as `init_next_round_input` does; after the request it waits (bounded)
until every backup is acknowledged, as on a quiet server. The storage controller asks the process's
parallel context for its ranks: the oracle states one rank (`override_permanently`).

Per request it also reads the state SGLang's objects expose: host tokens freed (the host pool
instance's `free` is wrapped to add up what it frees), device and host pool tokens in use after
the request, and the files (pages) in the L3 folder.

Not driven here: requests in flight together (the in-flight limit, retries, revoked partial hits),
the best_effort and timeout stop policies (wall-clock cuts in SGLang's threads), chunked prefill.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import types
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class OracleConfig:
    page_size: int = 4
    device_tokens: int = 64
    hicache_ratio: float = 2.0
    write_policy: str = "write_through"
    # An L3 tier (SGLang's file backend in a temporary folder per workload), read with the
    # wait_complete stop policy so the outcome does not depend on thread timing.
    storage: bool = False
    prefetch_threshold: int = 256
    eviction_policy: str = "lru"  # CacheInitParams.eviction_policy: "lru" or "lfu"
    # The storage prefetch stop policy; replays keep wait_complete (tests/engine/test_stop_policy.py
    # asks the tree's own stop decision under each policy).
    stop_policy: str = "wait_complete"


_PATCHED = False


def _copy_token_rows(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """CPU stand-in for sgl_kernel's transfer_kv_direct: the same rows, copied by torch."""
    del page_size  # the kernel groups rows by page for speed; the copy is the same row by row
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def _replace_cuda_only_calls() -> None:
    global _PATCHED
    if _PATCHED:
        return
    from sglang.srt.mem_cache.pool_host import base as pool_host_base
    from sglang.srt.mem_cache.pool_host import mha
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    mha.transfer_kv_direct = _copy_token_rows

    pinned_init = HostKVCache.__init__

    def unpinned_init(self, **kwargs):
        kwargs["pin_memory"] = False
        pinned_init(self, **kwargs)

    HostKVCache.__init__ = unpinned_init
    # SGLang refuses a host pool when the machine has under 10 GiB available beyond it: a guard
    # for real servers, not a HiCache rule; on a shared test machine it failed replays at random.
    pool_host_base.HICACHE_HOST_MEMORY_RESERVE_BYTES = 0
    _PATCHED = True


_published: tuple[OracleConfig, object] | None = None


def _server_args(config: OracleConfig):
    """The process-wide ServerArgs the pools read, published again only when the configuration
    changes (publishing resolves every server argument: slow)."""
    global _published
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    if _published is not None and _published[0] == config:
        return _published[1]
    storage = {}
    if config.storage:
        storage = dict(
            hicache_storage_backend="file",
            hicache_storage_prefetch_policy=config.stop_policy,
            hicache_storage_backend_extra_config=json.dumps({"prefetch_threshold": config.prefetch_threshold}),
        )
    server_args = ServerArgs(
        model_path="dummy",
        page_size=config.page_size,
        enable_hierarchical_cache=True,
        hicache_ratio=config.hicache_ratio,
        hicache_write_policy=config.write_policy,
        hicache_io_backend="direct",
        hicache_mem_layout="layer_first",
        **storage,
    )
    set_global_server_args_for_scheduler(server_args)
    if config.storage:
        _one_rank()
        # The storage keys' native hash is compiled on first use (a torch extension build that
        # can take a while): built here, outside the prefetch's bounded wait.
        from sglang.srt.mem_cache.cpp_utils.native_hash import get_native_hash

        get_native_hash(array("q", [1]), None)
    _published = (config, server_args)
    return server_args


def _one_rank() -> None:
    """The storage controller asks the process's parallel context for its ranks (the storage
    config, the key suffixes); a server publishes them when it builds its groups. One rank."""
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, attn_dcp_size=1
    )


def build(config: OracleConfig):
    """SGLang 0.5.23's tree with HiCache on CPU pools; returns (cache, allocator). With
    `config.storage`, the file backend writes under $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR."""
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    _replace_cuda_only_calls()
    ps = config.page_size
    server_args = _server_args(config)
    kv_pool = MHATokenToKVPool(
        size=config.device_tokens,
        page_size=ps,
        dtype=torch.float16,
        head_num=1,
        head_dim=4,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = PagedTokenToKVPoolAllocator(config.device_tokens, ps, torch.float16, "cpu", kv_pool, need_sort=False)
    req_pool = ReqToTokenPool(size=4, max_context_len=4096, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=req_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=ps,
        tree_components=(ComponentType.FULL,),
        eviction_policy=config.eviction_policy,
    )
    cache = UnifiedRadixCache(params)
    cache.init_hicache(server_args, params)
    return cache, allocator


class _Replay:
    def __init__(self, config: OracleConfig):
        self.config = config
        self.cache, self.allocator = build(config)
        self.evicted = 0
        evict = self.cache._evict

        def counted_evict(*args, **kwargs):
            result = evict(*args, **kwargs)
            self.evicted += result.num_tokens_evicted
            return result

        self.cache._evict = counted_evict
        # Host pages freed (host eviction, write_back's reclaim, a prefetch's unused pages): the
        # host pool instance's `free` is wrapped to add up what it frees; it runs unchanged.
        self.host_freed = 0
        host = self.cache.cache_controller.mem_pool_host
        free = host.free

        def counted_free(indices, *args, **kwargs):
            freed = free(indices, *args, **kwargs)
            self.host_freed += freed
            return freed

        host.free = counted_free

        self.extra_key: str | None = None  # the namespace of the request being served
        self.served = 0

    def key(self, tokens, limit=None):
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), extra_key=self.extra_key, limit=limit)

    def fetch_from_storage(self, prompt: list[int], match) -> int:
        """The scheduler's `_prefetch_kvcache` at arrival (the gate: the host anchor backed up or
        the root), then `check_hicache_events` + `check_prefetch_progress` until the prefetch is
        done (wait_complete), as each scheduler pass polls a waiting request; returns the tokens
        `pop_prefetch_loaded_tokens` reports."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        cache = self.cache
        node = match.last_host_node
        if not (cache.is_backuped(node) or cache.is_root(node)):
            return 0
        matched = match.device_prefix_len + match.host_hit_length
        handle = CacheRequestHandle(f"r{self.served}", 0)
        cache.prefetch_from_storage(
            handle,
            node,
            array("q", prompt[matched : len(prompt) - 1]),
            cache.get_last_hash_value(node),
            cache.get_prefix_hash_values(node) if cache.hicache_storage_pass_prefix_keys else None,
            matched_prefix_tokens=array("q", prompt[:matched]),
            extra_key=self.extra_key,
        )

        def progressed():
            cache.check_hicache_events()
            return cache.check_prefetch_progress(handle)

        _wait_until(progressed, "a prefetch")
        cache.check_hicache_events()
        return cache.pop_prefetch_loaded_tokens(handle)

    def settle(self) -> None:
        """On a quiet server every host and L3 backup is acknowledged before the next request."""
        cache = self.cache

        def settled():
            cache.check_hicache_events()
            return not cache.ongoing_backup and not cache.ongoing_write_through

        _wait_until(settled, "the backups")

    def state(self) -> dict:
        """What the pools hold after a request, in tokens (L3: objects)."""
        host = self.cache.cache_controller.mem_pool_host
        state = {
            "device_used": self.allocator.size - self.allocator.available_size(),
            "host_used": host.size - host.available_size(),
        }
        if self.config.storage:
            state["l3_pages"] = len(os.listdir(os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]))
        return state

    def extend(self, row, tokens: int):
        """The wave loops' decode, its pages taken at the finish: grow a slot row to whole pages
        covering `tokens`, evicting the shortfall first (a partly used last page takes the next
        tokens, as alloc_extend)."""
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        ps = self.config.page_size
        need = -(-tokens // ps) * ps - len(row)
        if need <= 0:
            return row
        short = need - self.allocator.available_size()
        if short > 0:
            self.cache.evict(EvictParams(num_tokens=short))
        slots = self.allocator.alloc(need)
        if slots is None:
            raise RuntimeError(f"SGLang's allocator cannot give {need} tokens after eviction")
        return torch.cat([row, slots.to(torch.int64)])

    def prefill_kv(self, row, tokens: int):
        """Slots for the prompt past `row` (its device prefix), as `alloc_for_extend` takes them for
        a batch of one (`alloc_kv`). The row holds one slot per token."""
        import torch

        return torch.cat([row, alloc_kv(self.cache, [row], [tokens], self.config.page_size)[0]])

    def decode_kv(self, row, tokens: int):
        """One slot per decode step until the row covers `tokens`, as `alloc_for_decode` takes it
        for a batch of one: `alloc_token_slots` at page 1, else `alloc_paged_token_slots_decode`
        (each step's eviction asks for a page whether or not the token opens one); the scheduler's
        `check_hicache_events` runs between steps."""
        import torch
        from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_decode, alloc_token_slots

        while len(row) < tokens:
            if self.config.page_size == 1:
                slot = alloc_token_slots(self.cache, 1)
            else:
                seq_lens = torch.tensor([len(row) + 1], dtype=torch.int64)
                slot = alloc_paged_token_slots_decode(
                    tree_cache=self.cache, seq_lens=seq_lens, seq_lens_cpu=seq_lens, last_loc=row[-1:]
                )
            row = torch.cat([row, slot.to(torch.int64)])
            self.cache.check_hicache_events()
        return row

    def insert(self, tokens, prompt_len: int, row, protected: int, inserted: int, lock):
        """Publish the page-aligned part of `tokens` as checkpoint_into_tree does; returns
        (row, protected, inserted, lock) afterwards.

        `protected` (cache_protected_len) keeps the request's tree-owned slots from being freed
        as duplicates; `inserted` (cache_inserted_len) is what this request published before:
        only nodes past it count a hit.
        """
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        ps = self.config.page_size
        aligned = len(tokens) // ps * ps
        if aligned == 0:
            return row, protected, inserted, lock
        values = row[:aligned].clone()
        result = self.cache.insert(
            InsertParams(key=self.key(tokens[:aligned]), value=values, prev_prefix_len=protected, inserted_len=inserted)
        )
        inserted = max(inserted, aligned)
        prompt_aligned = prompt_len // ps * ps
        if 0 < prompt_aligned < aligned:
            # The leaf is split at the prompt boundary (output KV evictable apart from the prompt).
            self.cache.insert(
                InsertParams(
                    key=self.key(tokens[:prompt_aligned]),
                    value=values[:prompt_aligned],
                    prev_prefix_len=prompt_aligned,
                    inserted_len=prompt_aligned,
                    priority=1,
                )
            )
        path = self.cache.path_device_indices(result.last_device_node)
        row = torch.cat([path[:aligned], row[aligned:]])
        self.cache.unlock(lock)
        return row, aligned, inserted, self.cache.lock(result.last_device_node)

    def serve(self, prompt: list[int], output: list[int], extra_key: str | None = None) -> dict:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams

        cache = self.cache
        self.extra_key = extra_key
        evicted_before, host_freed_before = self.evicted, self.host_freed
        match = cache.match_prefix(MatchPrefixParams(key=self.key(prompt, limit=len(prompt) - 1)))
        storage_hit = 0
        if self.config.storage:
            storage_hit = self.fetch_from_storage(prompt, match)
            if storage_hit:  # init_next_round_input matches again: the prefetched pages are host pages
                match = cache.match_prefix(MatchPrefixParams(key=self.key(prompt, limit=len(prompt) - 1)))
        self.served += 1
        device_hit = match.device_prefix_len
        host_hit = min(match.host_hit_length, len(prompt) - 1 - device_hit)
        last_node = match.last_device_node
        lock = cache.lock(last_node)
        row = cache.path_device_indices(last_node)[:device_hit].to(torch.int64)
        loaded = 0
        if host_hit > 0:
            handle = types.SimpleNamespace(
                rid="oracle",
                last_node=last_node,
                swa_host_hit_length=0,
                mamba_host_hit_length=0,
                priority=0,
                session_id=None,
                kv=types.SimpleNamespace(mamba_pool_idx=None),
            )
            loaded, node = cache.init_load_back(
                InitLoadBackParams(best_match_node=match.best_match_node, host_hit_length=host_hit, req=handle)
            )
            if loaded:
                cache.ready_to_load_host_cache()
                cache.check_hicache_events()
                row = cache.path_device_indices(node)[: device_hit + loaded]
                cache.unlock(lock)
                lock = cache.lock(node)
        protected, inserted = len(row), 0
        # Prefill: the rest of the prompt is computed. A request that goes on decoding publishes
        # it now (checkpoint_kv_cache; the write policy acts here); one whose single output token
        # came from the prefill finishes at once.
        row = self.prefill_kv(row, len(prompt))
        if len(output) > 1:
            row, protected, inserted, lock = self.insert(prompt, len(prompt), row, protected, inserted, lock)
            cache.check_hicache_events()
        # Decode writes the KV of every output token but the last, then finish publishes it.
        kept = prompt + output[:-1]
        row = self.decode_kv(row, len(kept))
        row, protected, inserted, lock = self.insert(kept, len(prompt), row, protected, inserted, lock)
        unpublished = row[protected:]
        if unpublished.numel():
            self.allocator.free(unpublished)
        cache.unlock(lock)
        cache.check_hicache_events()
        if self.config.storage:
            self.settle()
        # Tokens read from L3 reach the device through the host like host hits; counted apart.
        return {
            "device_hit": device_hit,
            "host_hit": loaded - min(loaded, storage_hit),
            "storage_hit": storage_hit if loaded else 0,
            "device_evicted": self.evicted - evicted_before,
            "host_freed": self.host_freed - host_freed_before,
            **self.state(),
        }


SETTLE_S = 30  # the longest wait for the controller's storage threads


def _wait_until(done, what: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"SGLang 0.5.23: {what} did not finish within {SETTLE_S} s")
        time.sleep(0.0005)


def replay(workloads: list[list[dict]], config: OracleConfig) -> list[list[dict]]:
    """Each workload is a list of {"prompt": [ids], "output": [ids], "extra_key": str (optional)};
    one fresh cache per workload (with `config.storage`, over an empty L3 folder of its own)."""
    results = []
    for workload in workloads:
        with tempfile.TemporaryDirectory(prefix="oracle-l3-") as storage_dir:
            saved = os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR")
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = storage_dir
            try:
                run = _Replay(config)
                try:
                    results.append(
                        [run.serve(list(r["prompt"]), list(r["output"]), r.get("extra_key")) for r in workload]
                    )
                finally:
                    run.cache.shutdown()
            finally:
                if saved is None:
                    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
                else:
                    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = saved
    return results


def alloc_kv(cache, prefixes, lengths, page_size):
    """A batch's extend slots, as `alloc_for_extend` takes them: `alloc_token_slots` for the
    extend tokens at page 1, else `alloc_paged_token_slots_extend` (one eviction for the batch's
    demand, then `alloc_extend`). `prefixes`: each request's device prefix slots; returns each
    request's new slots (its prompt past the prefix)."""
    import torch
    from sglang.srt.mem_cache.allocation import alloc_paged_token_slots_extend, alloc_token_slots

    prefix_lens = torch.tensor([len(p) for p in prefixes], dtype=torch.int64)
    seq_lens = torch.tensor(lengths, dtype=torch.int64)
    extend = (seq_lens - prefix_lens).tolist()
    if page_size == 1:
        out = alloc_token_slots(cache, sum(extend))
    else:
        last_loc = torch.cat([p[-1:] if len(p) else torch.full((1,), -1, dtype=torch.int64) for p in prefixes])
        out = alloc_paged_token_slots_extend(
            tree_cache=cache,
            prefix_lens=prefix_lens,
            prefix_lens_cpu=prefix_lens,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens,
            last_loc=last_loc,
            extend_num_tokens=sum(extend),
        )
    return list(out.to(torch.int64).split(extend))


def alloc_pass_kv(cache, reqs, lengths, page_size):
    """The pass's KV allocation, as `prepare_for_extend` makes it for the whole batch before any
    request's insert (`alloc_kv`). Returns each request's slot row, its device prefix first, padded
    to whole pages (the wave loops' rows cover whole pages; the last page's slots follow its first)."""
    import torch

    if not reqs:
        return []
    prefixes = [cache.path_device_indices(req.last_node)[: req.prefix_len].to(torch.int64) for req in reqs]
    rows = []
    for prefix, slots in zip(prefixes, alloc_kv(cache, prefixes, lengths, page_size), strict=True):
        row = torch.cat([prefix, slots])
        pad = -len(row) % page_size
        rows.append(torch.cat([row, row[-1] + 1 + torch.arange(pad, dtype=torch.int64)]) if pad else row)
    return rows
