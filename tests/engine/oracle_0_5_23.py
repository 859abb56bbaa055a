"""SGLang 0.5.23's own HiCache tree, driven on CPU pools, as the oracle for the engine.

`replay(workloads, config)` builds, per workload, SGLang's `UnifiedRadixCache` (compiled tree
core, the default) with HiCache: a CPU `MHATokenToKVPool` behind a `PagedTokenToKVPoolAllocator`,
a host pool and its `HybridCacheController`, from `ServerArgs` the way a server would. It then
replays the workload's requests one at a time, the way the scheduler serves a lone request:

1. match the prompt (key limited to len - 1, as `Req._compute_max_prefix_len` does) and lock the
   device prefix;
2. a host hit is loaded back through `init_load_back` (its own threshold of 10 tokens applies)
   and completed by `check_hicache_events`;
3. device room for the unmatched prompt is made by `evict` when the allocator is short; a
   request with more than one output token then inserts the prompt's page-aligned part
   (`checkpoint_kv_cache` after prefill: the write policy backs nodes up from here) and moves its
   lock to the inserted node (a request whose one output token came from the prefill finishes
   at once and skips this);
4. decode gets device room for every output token but the last (whose KV is never written) the
   same way; at finish prompt + output minus the last token is inserted (then the prompt's
   aligned part again, which splits the leaf at the prompt boundary), unpublished slots are
   freed and the lock released; then the scheduler's per-step `check_hicache_events`.

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

What is not driven here:
- The L3 (storage) tier: not attempted for 0.5.23 (nothing seen says it cannot run on CPU; the
  0.5.14 oracle drives SGLang's file backend). 0.5.23's prefetch is an admission protocol
  (`prefetch_from_storage`, `check_prefetch_progress`, the scheduler's retries, rank consensus)
  that a serial replay has to pump the way the scheduler loop does; that was not built, so
  storage hits are compared against 0.5.14 only.
- Requests are served one at a time: no concurrency, no chunked prefill.
"""

from __future__ import annotations

import types
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class OracleConfig:
    page_size: int = 4
    device_tokens: int = 64
    hicache_ratio: float = 2.0
    write_policy: str = "write_through"
    # An L3 tier (0.5.14 only: SGLang's file backend in a temporary folder), read with the
    # wait_complete stop policy so the outcome does not depend on thread timing.
    storage: bool = False
    prefetch_threshold: int = 256


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
    from sglang.srt.mem_cache.pool_host import mha
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    mha.transfer_kv_direct = _copy_token_rows

    pinned_init = HostKVCache.__init__

    def unpinned_init(self, **kwargs):
        kwargs["pin_memory"] = False
        pinned_init(self, **kwargs)

    HostKVCache.__init__ = unpinned_init
    _PATCHED = True


_published: tuple[OracleConfig, object] | None = None


def _server_args(config: OracleConfig):
    """The process-wide ServerArgs the pools read, published again only when the configuration
    changes (publishing resolves every server argument: slow)."""
    global _published
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    if _published is not None and _published[0] == config:
        return _published[1]
    server_args = ServerArgs(
        model_path="dummy",
        page_size=config.page_size,
        enable_hierarchical_cache=True,
        hicache_ratio=config.hicache_ratio,
        hicache_write_policy=config.write_policy,
        hicache_io_backend="direct",
        hicache_mem_layout="layer_first",
    )
    set_global_server_args_for_scheduler(server_args)
    _published = (config, server_args)
    return server_args


def build(config: OracleConfig):
    """SGLang 0.5.23's tree with HiCache on CPU pools; returns (cache, allocator)."""
    if config.storage:
        raise NotImplementedError("the 0.5.23 oracle drives no L3 tier (see the module docstring)")
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

    def key(self, tokens, limit=None):
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), limit=limit)

    def extend(self, row, tokens: int):
        """Grow a request's slot row to whole pages covering `tokens`, evicting from the tree when
        the allocator is short (a partly used last page takes the next tokens, as alloc_extend)."""
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

    def serve(self, prompt: list[int], output: list[int]) -> dict:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams

        cache = self.cache
        evicted_before = self.evicted
        match = cache.match_prefix(MatchPrefixParams(key=self.key(prompt, limit=len(prompt) - 1)))
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
        row = self.extend(row, len(prompt))
        if len(output) > 1:
            row, protected, inserted, lock = self.insert(prompt, len(prompt), row, protected, inserted, lock)
            cache.check_hicache_events()
        # Decode writes the KV of every output token but the last, then finish publishes it.
        kept = prompt + output[:-1]
        row = self.extend(row, len(kept))
        row, protected, inserted, lock = self.insert(kept, len(prompt), row, protected, inserted, lock)
        unpublished = row[protected:]
        if unpublished.numel():
            self.allocator.free(unpublished)
        cache.unlock(lock)
        cache.check_hicache_events()
        return {
            "device_hit": device_hit,
            "host_hit": loaded,
            "storage_hit": 0,
            "device_evicted": self.evicted - evicted_before,
        }


def replay(workloads: list[list[dict]], config: OracleConfig) -> list[list[dict]]:
    """Each workload is a list of {"prompt": [ids], "output": [ids]}; one fresh cache per workload."""
    results = []
    for workload in workloads:
        run = _Replay(config)
        results.append([run.serve(list(r["prompt"]), list(r["output"])) for r in workload])
        run.cache.shutdown()
    return results
