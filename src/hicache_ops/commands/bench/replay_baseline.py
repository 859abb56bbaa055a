"""Two references computed from a trace alone, beside the engine's replay.

- The ceiling: what an unbounded cache with SGLang's rules hits. A request hits the longest prefix
  of its whole pages that earlier requests inserted, up to the match cap of input length - 1 tokens
  (docs/controller.md#match-cap); every whole page is inserted after it (a partial last page never
  is). No eviction, so no policy can do better on the same pages.
- The block LRU: the published-style replay (the FAST'25 paper's Figure 9 and others): blocks of
  512 tokens (the trace's hash ids; a partial last block is a block of its own), one LRU list, a
  request hits its longest prefix of cached blocks (in tokens, capped at input length - 1 as any
  match is, docs/controller.md#match-cap), and every block of the request then moves to the most
  recent end. No tiers, no pages, no radix nodes.

Pure library: numpy and the page-key rules only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from hicache_ops.commands.bench.replay_trace import MOONCAKE_BLOCK_TOKENS, Trace, TraceRequest
from hicache_ops.sglang.page_keys import page_keys
from hicache_ops.sglang.policy import match_cap_pages
from hicache_ops.sglang.versions import V0_5_23

# Page identities of the mooncake format: (id of the block holding the page's last token) << this
# | page index. An id names its whole prefix, so the pair names the page's whole prefix.
_PAGE_INDEX_BITS = 32


def mooncake_page_ids(request: TraceRequest, page_size: int) -> np.ndarray:
    """One int per whole page of the prompt, equal exactly where the page keys are equal."""
    n_pages = request.input_length // page_size
    last_token = np.arange(1, n_pages + 1, dtype=np.int64) * page_size - 1
    blocks = np.asarray(request.hash_ids, dtype=np.int64)[last_token // MOONCAKE_BLOCK_TOKENS]
    return (blocks << _PAGE_INDEX_BITS) | np.arange(n_pages, dtype=np.int64)


def page_ids(request: TraceRequest, page_size: int) -> list:
    """Whole-page identities of a request (the tree's keys, or an exact stand-in for them)."""
    if request.hash_ids is not None:
        return mooncake_page_ids(request, page_size).tolist()
    return page_keys(
        request.token_ids(), page_size, V0_5_23, extra_key=request.extra_key, cache_salt=request.cache_salt
    )


def block_ids(request: TraceRequest) -> list:
    """The 512-token blocks of the published replays (a partial last block included)."""
    if request.hash_ids is not None:
        return request.hash_ids
    return page_keys(
        request.token_ids(),
        MOONCAKE_BLOCK_TOKENS,
        V0_5_23,
        extra_key=request.extra_key,
        cache_salt=request.cache_salt,
        include_partial=True,
    )


@dataclass
class ReferenceRun:
    cached_tokens: int
    prompt_tokens: int
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def ceiling(trace: Trace, page_size: int) -> ReferenceRun:
    """The unbounded, page-granular hit of the trace (see the module doc)."""
    seen: set = set()
    cached = 0
    for request in trace.requests:
        ids = page_ids(request, page_size)
        hit = 0
        for page in ids[: match_cap_pages(request.input_length, page_size)]:
            if page not in seen:
                break
            hit += 1
        cached += hit * page_size
        seen.update(ids[hit:])
    return ReferenceRun(cached, trace.prompt_tokens)


def block_lru(trace: Trace, capacity_tokens: int | None) -> ReferenceRun:
    """The published-style block LRU; `capacity_tokens` None: unbounded."""
    capacity = None if capacity_tokens is None else capacity_tokens // MOONCAKE_BLOCK_TOKENS
    cache: OrderedDict = OrderedDict()
    cached = evictions = 0
    for request in trace.requests:
        ids = block_ids(request)
        hit = 0
        for block in ids:
            if block not in cache:
                break
            hit += 1
        cached += min(hit * MOONCAKE_BLOCK_TOKENS, request.input_length - 1)
        for block in ids:
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None
        if capacity is not None:
            while len(cache) > capacity:
                cache.popitem(last=False)
                evictions += 1
    return ReferenceRun(cached, trace.prompt_tokens, evictions)
