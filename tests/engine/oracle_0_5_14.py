"""SGLang 0.5.14's own HiCache tree (`HiRadixCache` + `HiCacheController`) as the oracle.

0.5.14 is the package `sglang` too, so it runs in a child process (tests/sglang_0_5_14.py);
`replay(workloads, config)` sends every workload in one child call (a child start costs seconds).
In the child, per workload, a fresh `HiRadixCache` over a CPU `MHATokenToKVPool` behind a
`PagedTokenToKVPoolAllocator` replays the requests one at a time the way 0.5.14's scheduler
serves a lone request, calling the tree the way its `cache_unfinished_req` / `cache_finished_req`
do (those two take a scheduler `Req`; the same tree calls are made here on the request's slot row):

1. `match_prefix` with the key limited to len - 1 (`Req._compute_max_prefix_len`), lock the
   device prefix;
2. `init_load_back` for a host hit (0.5.14 loads it all or nothing, 10 tokens minimum), then
   `ready_to_load_host_cache` and `check_hicache_events`;
3. device slots for the prompt as `alloc_for_extend` takes them for a batch of one
   (`alloc_token_slots` at page 1, else `alloc_paged_token_slots_extend`: SGLang's own eviction
   for its demand, then `alloc_extend`); a request with more than one output token then makes the
   prefill insert (cache_unfinished_req: insert, free the duplicates, re-match, move the lock);
   one whose single output token came from the prefill finishes at once;
4. a slot per decode step for every output token but the last (whose KV is never written), as
   `alloc_for_decode` takes it (`alloc_paged_token_slots_decode`, `check_hicache_events` between
   steps), then the finish insert of prompt + output minus the last token (cache_finished_req:
   insert, free duplicates and the unaligned tail, unlock); then `check_hicache_events` as the
   scheduler does every step.

Per request: device and host hit tokens and the device tokens evicted while serving it, by the
allocations and by `load_back` for the pages it loads (the cache instance's `evict` is wrapped
to add up what it reports; it runs unchanged).

What is replaced to run on CPU (nothing else of SGLang is changed):
- The host pool is created with `pin_memory=False` (`HostKVCache.__init__`): pinning needs CUDA.
- `transfer_kv_direct` (sgl_kernel's CUDA op, bound in `memory_pool_host.py` for the "direct"
  I/O backend, layer_first layout) is replaced by a torch row copy with the same rows; the
  "kernel" I/O backend's ops are CUDA kernels with no CPU path, so the oracle uses "direct".
- The controller's streams and events: 0.5.14's `cache_controller.py` binds
  `device_module = torch.get_device_module()`, which is `torch.cuda` in a CUDA build of torch even
  without a GPU; the oracle binds it to `torch.cpu` (its Stream/Event/stream() run the copies
  synchronously), as 0.5.23 does by itself on a CPU-only machine.
- The paged allocator's Triton kernels (`alloc_extend_kernel`, `alloc_decode_kernel`, bound in
  `allocator/paged.py`; Triton has no CPU driver): the extend's by SGLang's own torch version in
  that module (`alloc_extend_naive`), the decode's (0.5.14 has no torch version) by a loop giving
  the same slots: the one after the last, or the next free page's first for a token that opens a
  page. Which slots are given does not change how much is evicted, which SGLang's
  `alloc_paged_token_slots_extend` / `_decode` decide before calling the allocator.
- A one-rank gloo process group over an in-memory store, and SGLang's own parallel groups on it
  (`init_distributed_environment`, `initialize_model_parallel`): `HiRadixCache.__init__` asks
  `torch.distributed` for the TP world size, its checks all-reduce (a no-op on one rank), and the
  storage backend asks for its TP rank. (Setup, not a replacement.)

With `config.storage`, SGLang's own file backend (`HiCacheFile`, in a temporary folder per
workload, removed afterwards) is the L3 tier: on arrival the request's unmatched span is
prefetched (`prefetch_from_storage`, as the scheduler's `_prefetch_kvcache`), polled with
`check_prefetch_progress` under the `wait_complete` stop policy (the outcome then does not depend
on thread timing), counted with `pop_prefetch_loaded_tokens`, and the prompt is matched again.
The host pages a prefetch does not use (past its hit, or all of them when revoked) come back
through a queue its thread fills, sometimes after the prefetch is seen to end; the oracle waits
for them (the controller's `append_host_mem_release` is wrapped to count what it queues) and
drains the queue, as the scheduler's next step would on a quiet server, so that a request's host
evictions do not depend on thread timing;
after each request the oracle waits (bounded) until every L3 backup was acknowledged, as on a
quiet server. Not driven: concurrency, the other stop policies and chunked prefill.
"""

from __future__ import annotations

from dataclasses import asdict

from engine.oracle_0_5_23 import OracleConfig
from sglang_0_5_14 import run_0_5_14
from sglang_release import run_release

_SCRIPT = r'''
import os
import tempfile
import time
import types
import torch
import torch.distributed as dist

from sglang.srt.distributed import parallel_state

# One rank: the world group over an in-memory store (no network, no files), then SGLang's groups.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
parallel_state.init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0)
parallel_state.initialize_model_parallel(backend="gloo")

from sglang.srt.managers import cache_controller
from sglang.srt.mem_cache import memory_pool_host

cache_controller.device_module = torch.cpu
from sglang.srt.mem_cache.pool_host import base as pool_host_base
from sglang.srt.mem_cache.pool_host.base import HostKVCache


def copy_token_rows(src_layers, dst_layers, src_indices, dst_indices, page_size):
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


memory_pool_host.transfer_kv_direct = copy_token_rows
pinned_init = HostKVCache.__init__


def unpinned_init(self, device_pool, ratio, host_size, page_size, layout, pin_memory=True, *rest, **kwargs):
    pinned_init(self, device_pool, ratio, host_size, page_size, layout, False, *rest, **kwargs)


HostKVCache.__init__ = unpinned_init
# SGLang refuses a host pool when the machine has under 10 GiB available beyond it: a guard for
# real servers, not a HiCache rule; on a shared test machine it made every replay fail at random.
pool_host_base.HICACHE_HOST_MEMORY_RESERVE_BYTES = 0

from sglang.srt.mem_cache.allocator import paged
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator


class CpuLaunch:
    """A Triton kernel's `kernel[grid](...)` call made on the CPU by a torch function."""

    def __init__(self, run):
        self.run = run

    def __getitem__(self, grid):
        return self.run


def extend_slots(prefix_lens, seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
    # SGLang's own torch version of the kernel, in the same module.
    paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")


def decode_slots(seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
    # The kernel's slots: the slot after last_loc, or the first slot of the next free page for a
    # request whose new token opens a page (in batch order).
    opened = 0
    for i in range(len(seq_lens)):
        if (int(seq_lens[i]) - 1) % page_size == 0:
            out_indices[i] = free_pages[opened] * page_size
            opened += 1
        else:
            out_indices[i] = last_loc[i] + 1


paged.alloc_extend_kernel = CpuLaunch(extend_slots)
paged.alloc_decode_kernel = CpuLaunch(decode_slots)
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

try:  # the allocation helpers moved to their own module in 0.5.16
    from sglang.srt.mem_cache.allocation import (
        alloc_paged_token_slots_decode, alloc_paged_token_slots_extend, alloc_token_slots,
    )
except ImportError:
    from sglang.srt.mem_cache.common import (
        alloc_paged_token_slots_decode, alloc_paged_token_slots_extend, alloc_token_slots,
    )


SETTLE_S = 10  # the longest wait for the controller's storage threads


def wait_until(done, what):
    deadline = time.monotonic() + SETTLE_S
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"SGLang 0.5.14: {what} did not finish within {SETTLE_S} s")
        time.sleep(0.001)


class Replay:
    def __init__(self, config, storage_dir=None):
        ps = self.ps = config["page_size"]
        storage = {}
        if storage_dir is not None:
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = storage_dir
            storage = dict(
                hicache_storage_backend="file",
                hicache_storage_prefetch_policy=config.get("stop_policy", "wait_complete"),
                hicache_storage_backend_extra_config=json.dumps({"prefetch_threshold": config["prefetch_threshold"]}),
            )
        server_args = ServerArgs(
            model_path="dummy", page_size=ps, enable_hierarchical_cache=True,
            hicache_ratio=config["hicache_ratio"], hicache_write_policy=config["write_policy"],
            hicache_io_backend="direct", hicache_mem_layout="layer_first", **storage,
        )
        set_global_server_args_for_scheduler(server_args)
        kv_pool = MHATokenToKVPool(
            size=config["device_tokens"], page_size=ps, dtype=torch.float16, head_num=1, head_dim=4,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )
        self.allocator = PagedTokenToKVPoolAllocator(
            config["device_tokens"], ps, torch.float16, "cpu", kv_pool, need_sort=False
        )
        req_pool = ReqToTokenPool(size=4, max_context_len=4096, device="cpu", enable_memory_saver=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=self.allocator, page_size=ps,
            eviction_policy=config["eviction_policy"],
        )
        self.cache = HiRadixCache(params, server_args)
        self.storage = storage_dir is not None
        self.storage_dir = storage_dir
        self.extra_key = None
        self.released = 0
        self.evicted = 0
        evict = self.cache.evict

        def counted_evict(params):
            result = evict(params)
            self.evicted += result.num_tokens_evicted
            return result

        self.cache.evict = counted_evict
        self.host_freed = 0
        host = self.cache.cache_controller.mem_pool_host
        free = host.free

        def counted_free(indices, *args, **kwargs):
            freed = free(indices, *args, **kwargs)
            self.host_freed += freed
            return freed

        host.free = counted_free
        if self.storage:
            controller = self.cache.cache_controller
            release = controller.append_host_mem_release
            self.released = 0

            def counted_release(host_indices):
                release(host_indices)
                if host_indices.numel():
                    self.released += host_indices.numel()

            controller.append_host_mem_release = counted_release
        self.served = 0

    def fetch_from_storage(self, prompt, match):
        """The scheduler's _prefetch_kvcache at arrival, then check_prefetch_progress until done
        (wait_complete), as get_new_batch_prefill polls it; returns the tokens read from L3."""
        cache, rid = self.cache, f"r{self.served}"
        node = match.last_host_node
        if not (node.backuped or node is cache.root_node):
            return 0
        matched = len(match.device_indices) + match.host_hit_length
        released_before = self.released
        cache.prefetch_from_storage(rid, node, list(prompt[matched : len(prompt) - 1]), node.get_last_hash_value())
        if rid not in cache.ongoing_prefetch:
            return 0
        _, _, host_indices, operation = cache.ongoing_prefetch[rid]

        def progressed():
            cache.check_hicache_events()
            return cache.check_prefetch_progress(rid)

        wait_until(progressed, "a prefetch")
        # The prefetch thread hands back the host pages past the hit (all of them when it revokes)
        # through a queue the next scheduler step drains; it may queue them after the request
        # saw the prefetch end. Wait for them and drain, as the next step on a quiet server would.
        unused = len(host_indices) - operation.completed_tokens
        wait_until(lambda: self.released - released_before >= unused, "the prefetch's host pages")
        cache.check_hicache_events()
        return cache.pop_prefetch_loaded_tokens(rid)

    def settle_backups(self):
        """Let every L3 backup issued so far land before the next request arrives."""
        cache = self.cache

        def settled():
            cache.check_hicache_events()
            return not cache.ongoing_backup

        wait_until(settled, "the L3 backups")

    def prefill_kv(self, row, tokens):
        """Slots for the prompt past `row` (its device prefix), as `alloc_for_extend` takes them for
        a batch of one: `alloc_token_slots` at page 1, else `alloc_paged_token_slots_extend` (its
        eviction for the extend + a page, then `alloc_extend`). The row holds one slot per token."""
        extend = tokens - len(row)
        if self.ps == 1:
            slots = alloc_token_slots(self.cache, extend)
        else:
            last_loc = row[-1:] if len(row) else torch.full((1,), -1, dtype=torch.int64)
            prefix_lens = torch.tensor([len(row)], dtype=torch.int64)
            seq_lens = torch.tensor([tokens], dtype=torch.int64)
            slots = alloc_paged_token_slots_extend(
                tree_cache=self.cache, prefix_lens=prefix_lens, prefix_lens_cpu=prefix_lens, seq_lens=seq_lens,
                seq_lens_cpu=seq_lens, last_loc=last_loc, extend_num_tokens=extend,
            )
        return torch.cat([row, slots.to(torch.int64)])

    def decode_kv(self, row, tokens):
        """One slot per decode step until the row covers `tokens`, as `alloc_for_decode` takes it
        for a batch of one (each step's eviction asks for a page whether or not the token opens
        one); the scheduler's `check_hicache_events` runs between steps."""
        while len(row) < tokens:
            if self.ps == 1:
                slot = alloc_token_slots(self.cache, 1)
            else:
                seq_lens = torch.tensor([len(row) + 1], dtype=torch.int64)
                slot = alloc_paged_token_slots_decode(
                    tree_cache=self.cache, seq_lens=seq_lens, seq_lens_cpu=seq_lens, last_loc=row[-1:],
                )
            row = torch.cat([row, slot.to(torch.int64)])
            self.cache.check_hicache_events()
        return row

    def publish(self, tokens, row, protected, last_node, finished):
        cache = self.cache
        aligned = len(tokens) // self.ps * self.ps
        key = RadixKey(list(tokens[:aligned]), self.extra_key)
        result = cache.insert(InsertParams(key=key, value=row[:aligned].clone()))
        if result.prefix_len > protected:
            self.allocator.free(row[protected:result.prefix_len])
        if finished:
            if len(row) > aligned:
                self.allocator.free(row[aligned:])
            cache.dec_lock_ref(last_node)
            return row, aligned, None
        match = cache.match_prefix(MatchPrefixParams(key=key))
        row = torch.cat([match.device_indices.to(torch.int64), row[aligned:]])
        cache.dec_lock_ref(last_node)
        cache.inc_lock_ref(match.last_device_node)
        return row, aligned, match.last_device_node

    def state(self):
        """What the pools hold after a request, in tokens (L3: objects)."""
        host = self.cache.cache_controller.mem_pool_host
        state = {
            "device_used": self.allocator.size - self.allocator.available_size(),
            "host_used": host.size - host.available_size(),
        }
        if self.storage:
            state["l3_pages"] = len(os.listdir(self.storage_dir))
        return state

    def serve(self, prompt, output, extra_key=None):
        cache = self.cache
        self.extra_key = extra_key
        # A prefetch's host pages come back through the release queue: returned, not evicted.
        evicted_before, host_freed_before, released_before = self.evicted, self.host_freed, self.released
        key = RadixKey(list(prompt), extra_key, limit=len(prompt) - 1)
        match = cache.match_prefix(MatchPrefixParams(key=key))
        storage_hit = 0
        if self.storage:
            storage_hit = self.fetch_from_storage(prompt, match)
            if storage_hit:
                match = cache.match_prefix(MatchPrefixParams(key=key))
        device_hit = len(match.device_indices)
        host_hit = match.host_hit_length
        row = match.device_indices.to(torch.int64)
        last_node = match.last_device_node
        cache.inc_lock_ref(last_node)
        loaded = 0
        if host_hit > 0:
            values, node = cache.init_load_back(
                InitLoadBackParams(best_match_node=match.best_match_node, host_hit_length=host_hit)
            )
            loaded = len(values)
            if loaded:
                cache.ready_to_load_host_cache()
                cache.check_hicache_events()
                row = torch.cat([row, values.to(torch.int64)])
                cache.dec_lock_ref(last_node)
                cache.inc_lock_ref(node)
                last_node = node
        protected = len(row)
        row = self.prefill_kv(row, len(prompt))
        if len(output) > 1:  # a request whose one output token came from the prefill finishes at once
            row, protected, last_node = self.publish(prompt, row, protected, last_node, finished=False)
            cache.check_hicache_events()
        kept = list(prompt) + list(output[:-1])
        row = self.decode_kv(row, len(kept))
        self.publish(kept, row, protected, last_node, finished=True)
        cache.check_hicache_events()
        if self.storage:
            self.settle_backups()
        self.served += 1
        # Tokens read from L3 reach the device through the host like host hits; counted apart.
        return {
            "device_hit": device_hit, "host_hit": loaded - min(loaded, storage_hit),
            "storage_hit": storage_hit if loaded else 0, "device_evicted": self.evicted - evicted_before,
            "host_freed": self.host_freed - host_freed_before - (self.released - released_before),
            **self.state(),
        }


RESULT = []
for job in PAYLOAD:
    job_results = []
    for workload in job["workloads"]:
        with tempfile.TemporaryDirectory(prefix="oracle-l3-") as storage_dir:
            run = Replay(job["config"], storage_dir if job["config"]["storage"] else None)
            try:
                job_results.append([run.serve(r["prompt"], r["output"], r.get("extra_key")) for r in workload])
            except AssertionError as error:
                # 0.5.14's own evict_host assertion under write_back ("parent does not have child
                # key"): SGLang fails the workload; the caller leaves it out and counts it.
                if job["config"]["write_policy"] != "write_back" or "parent does not have child key" not in str(error):
                    raise
                job_results.append({"sglang_failed": str(error)})
            finally:
                run.cache.shutdown()
    RESULT.append(job_results)
'''


def replay_jobs(
    jobs: list[tuple[OracleConfig, list[list[dict]]]], *, timeout: float = 600, version: str = "0.5.14"
) -> list[list]:
    """Several (config, workloads) jobs in one child; per job, per workload, per request results
    (or, for a write_back workload on which 0.5.14's tree fails its own evict_host assertion,
    {"sglang_failed": message}).

    A workload is a list of {"prompt": [ids], "output": [ids]}; each gets a fresh cache. `version`:
    another HiRadixCache release whose tree the same script drives unchanged (0.5.15,
    tests/sglang_release.py), else 0.5.14.
    """
    payload = [{"config": asdict(config), "workloads": workloads} for config, workloads in jobs]
    if version != "0.5.14":
        return run_release(version, _SCRIPT, payload, timeout=timeout)
    return run_0_5_14(_SCRIPT, payload, timeout=timeout)


def replay(workloads: list[list[dict]], config: OracleConfig, version: str = "0.5.14") -> list[list[dict]]:
    return replay_jobs([(config, workloads)], version=version)[0]
