"""SGLang's HiCache controller rules as functions of the SGLang version (docs/controller.md).

Every version-specific decision the engine, `trace`, `prefetch`, `playbook` and `bench` make is
asked here, so each rule and its wording live in one place. Rules name the section of
docs/controller.md that states them with their SGLang source.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache_ops.errors import InputError
from hicache_ops.sglang.versions import UNIFIED_TREE_SINCE, V0_5_14, family, since, validate_version

# docs/controller.md#defaults
WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_through_selective", "write_back")
STOP_POLICIES: tuple[str, ...] = ("best_effort", "wait_complete", "timeout")
DEFAULT_WRITE_POLICY = "write_through"
DEFAULT_STOP_POLICY = "timeout"
DEFAULT_PREFETCH_THRESHOLD = 256
DEFAULT_EVICTION_POLICY = "lru"
LOAD_BACK_THRESHOLD = 10
# SGLang queries and writes storage in batches of this many pages (docs/keys.md#batch-size).
STORAGE_BATCH_PAGES = 128
# Rules keyed by release (docs/releases.md names each with its SGLang file):
# in-flight limit 0.5 x host instead of 0.8 x (host - device): managers/cache_controller.py
HOST_HALF_LIMIT_SINCE = "0.5.15"
# storage-prefetch retry flags exist (poll 0 = off, max 4): server_args.py
RETRY_FLAGS_SINCE = "0.5.19"
# retries on by default (poll 8, max 8): arg_groups/fields/memory.py
RETRY_DEFAULT_ON_SINCE = "0.5.20"
# UnifiedRadixCache's budget (no max, from the issue): mem_cache/unified_radix_cache.py
UNIFIED_BUDGET_SINCE = "0.5.19"
# budget from requested tokens, clock at the first blocked admission check: unified_radix_cache.py
REQUESTED_BUDGET_SINCE = "0.5.23"
# `tlru` radix eviction: mem_cache/utils.py (TLRUStrategy)
TLRU_SINCE = "0.5.21"
# prefetch host pages allocated once the hit is known: mem_cache/hiradix_cache.py (_drain_and_alloc_storage_hit)
HOST_AT_HIT_SINCE = "0.5.16"
# shortfall-sized eviction, unbacked ancestors backed up: mem_cache/unified_radix_cache.py
SHORTFALL_EVICTION_SINCE = "0.5.19"
# a pass's KV allocation evicts the shortfall, not its whole demand: mem_cache/common.py (evict_from_tree_cache)
SHORTFALL_EXTEND_EVICTION_SINCE = "0.5.17"
# write_back drops a device leaf whose backup gets no host page, with its host-only subtree:
# mem_cache/hiradix_cache.py (_drop_subtree_no_host), then unified_radix_cache.py
WRITE_BACK_DROP_SINCE = "0.5.15"
# write_back victims of an eviction pass keep their host copies until the pass ends through 0.5.18
# (mem_cache/hiradix_cache.py `evict` / `_evict_write_back`); UnifiedRadixCache demotes each at once
WRITE_BACK_VICTIMS_HELD_UNTIL = UNIFIED_TREE_SINCE
# write_back reclaims host duplicates: mem_cache/unified_radix_cache.py
WRITE_BACK_RECLAIM_SINCE = "0.5.20"
# a hit counted once per request (inserted_len): mem_cache/unified_radix_cache.py
HIT_ONCE_SINCE = "0.5.22"
# The newest retry defaults (docs/controller.md#in-flight-limit).
RETRY_POLL_INTERVAL_PASSES = 8
RETRY_MAX_ATTEMPTS = 8
# docs/controller.md#eviction-policies: what the engine implements.
MODELLED_EVICTION_POLICIES: tuple[str, ...] = ("lru", "lfu")


def eviction_policies(version: str) -> tuple[str, ...]:
    """The radix eviction policies SGLang `version` offers."""
    base = ("lru", "lfu", "slru", "priority")
    return (*base, "tlru") if since(validate_version(version), TLRU_SINCE) else base


def retry_defaults(version: str) -> tuple[int, int] | None:
    """(poll interval in scheduler passes, max attempts) by default; None: the release has no retry."""
    version = validate_version(version)
    if since(version, RETRY_DEFAULT_ON_SINCE):
        return RETRY_POLL_INTERVAL_PASSES, RETRY_MAX_ATTEMPTS
    if since(version, RETRY_FLAGS_SINCE):
        return 0, 4
    return None


def check_write_policy(policy: str) -> str:
    if policy not in WRITE_POLICIES:
        raise InputError(f"write policy {policy!r} is unknown.", hint=f"Use one of: {', '.join(WRITE_POLICIES)}.")
    return policy


def check_stop_policy(policy: str) -> str:
    if policy not in STOP_POLICIES:
        raise InputError(
            f"prefetch stop policy {policy!r} is unknown.", hint=f"Use one of: {', '.join(STOP_POLICIES)}."
        )
    return policy


def check_eviction_policy(policy: str, version: str) -> str:
    """A policy SGLang `version` offers and the engine implements; otherwise say which it is."""
    offered = eviction_policies(version)
    if policy not in offered:
        raise InputError(
            f"SGLang {version} has no radix eviction policy {policy!r}.", hint=f"It offers: {', '.join(offered)}."
        )
    if policy not in MODELLED_EVICTION_POLICIES:
        raise InputError(
            f"the engine does not model radix eviction policy {policy!r} (SGLang {version} offers it); "
            "its answers would not be SGLang's (docs/controller.md#not-modelled).",
            hint=f"Use one of: {', '.join(MODELLED_EVICTION_POLICIES)}.",
        )
    return policy


# -- write policies: docs/controller.md#write-policies ---------------------------------------------


def write_through_threshold(policy: str) -> int | None:
    """Hits after which a node is backed up to host; None: only at device eviction (write_back)."""
    check_write_policy(policy)
    return {"write_through": 1, "write_through_selective": 2, "write_back": None}[policy]


def counts_every_insert(version: str) -> bool:
    """0.5.14 counts a hit per insert (a request inserts after prefill and at finish, so it counts
    its own pages twice); 0.5.23 counts each node once per request."""
    return not since(validate_version(version), HIT_ONCE_SINCE)


def counts_revived_nodes(version: str) -> bool:
    """An insert that gives a node off the device its recomputed pages back: 0.5.23 counts a hit on
    it (the node is on the device by the time it is counted); 0.5.14 counts none."""
    return family(validate_version(version)) != V0_5_14


def backs_up_unbacked_ancestors(version: str) -> bool:
    """A node due for backup whose parent has no host copy: 0.5.23 backs the unbacked ancestors up
    with it; 0.5.14 skips the node until its parent is backed up."""
    return since(validate_version(version), SHORTFALL_EVICTION_SINCE)


def reclaims_host_duplicates(version: str, write_policy: str) -> bool:
    """0.5.23 write_back frees host copies of device-resident nodes before evicting host nodes
    (docs/controller.md#write_back-host-reclaim)."""
    return since(validate_version(version), WRITE_BACK_RECLAIM_SINCE) and write_policy == "write_back"


def drops_unbacked_write_back(version: str) -> bool:
    """write_back, a device leaf whose backup gets no host page: from 0.5.15 it leaves the tree with
    its host-only descendants unless one of them is pinned on host; 0.5.14 keeps it on the device
    (docs/controller.md#device-eviction)."""
    return since(validate_version(version), WRITE_BACK_DROP_SINCE)


def defers_write_back_victims(version: str) -> bool:
    """write_back, 0.5.14-0.5.18 (HiRadixCache): the nodes an eviction pass backs up keep their host
    copies out of host eviction until the pass ends (0.5.14 takes them off the device only then;
    0.5.15-0.5.18 pin them with protect_host and release them at the pass's end or before a drop),
    so a later backup of the same pass short of host pages cannot free them. From 0.5.19
    (UnifiedRadixCache) each victim is demoted at once (docs/controller.md#device-eviction)."""
    return not since(validate_version(version), WRITE_BACK_VICTIMS_HELD_UNTIL)


def host_eviction_pages(version: str, needed: int, free: int, prefetch: bool) -> int:
    """Host pages a host allocation of `needed` pages asks host eviction for when only `free` are
    free (docs/controller.md#host-eviction): 0.5.14 asks for the whole allocation, for a backup
    and for a prefetch alike; 0.5.23 for the shortfall of a backup and the whole hit of a prefetch."""
    if not since(validate_version(version), SHORTFALL_EVICTION_SINCE) or prefetch:
        return needed
    return needed - free


def load_back_eviction_pages(version: str, needed: int, free: int) -> int:
    """Device pages a load-back of `needed` pages asks device eviction for when only `free` are free
    (docs/controller.md#load-back): 0.5.14 the whole load, 0.5.23 the shortfall."""
    if not since(validate_version(version), SHORTFALL_EVICTION_SINCE):
        return needed
    return needed - free


def pass_allocation_eviction_pages(
    version: str, extend_tokens: int, requests: int, free_pages: int, page_size: int
) -> int:
    """Device pages a pass's KV allocation asks eviction for (docs/controller.md#pass-allocation):
    the demand is the batch's extend tokens, plus a page per request when pages hold several
    tokens (SGLang's over-estimate of the pages the paged allocator may open)."""
    demand = extend_tokens + (requests * page_size if page_size > 1 else 0)
    return _allocation_eviction_pages(version, demand, free_pages, page_size)


def decode_eviction_pages(version: str, requests: int, free_pages: int, page_size: int) -> int:
    """Device pages a decode step's allocation asks eviction for (docs/controller.md#pass-allocation):
    the demand is a page per decoding request, whether or not its token opens a page."""
    return _allocation_eviction_pages(version, requests * page_size, free_pages, page_size)


def _allocation_eviction_pages(version: str, demand: int, free_pages: int, page_size: int) -> int:
    """When fewer tokens are free than the demand, through 0.5.16 the whole demand is evicted,
    from 0.5.17 the shortfall."""
    free = free_pages * page_size
    if free >= demand:
        return 0
    tokens = demand - free if since(validate_version(version), SHORTFALL_EXTEND_EVICTION_SINCE) else demand
    return -(-tokens // page_size)


# -- the match: docs/controller.md#match-cap --------------------------------------------------------


def match_cap_pages(input_tokens: int, page_size: int) -> int:
    """Whole pages a match (and a prefetch) may cover: at most input length - 1 tokens."""
    return max(input_tokens - 1, 0) // page_size


# -- prefetch: docs/controller.md#prefetch-threshold-and-revocation, #in-flight-limit --------------


def effective_prefetch_threshold(threshold: int, page_size: int) -> int:
    """Prefetches shorter than this many tokens are not issued, and hits below it are revoked."""
    return max(threshold, page_size)


def prefetch_limit_tokens(version: str, host_tokens: int, device_tokens: int) -> int:
    """Requested tokens that issued prefetches may hold before new ones are rate limited."""
    if not since(validate_version(version), HOST_HALF_LIMIT_SINCE):
        return max(0, int(0.8 * (host_tokens - device_tokens)))
    return int(0.5 * host_tokens)


def prefetch_limit_rule(version: str) -> str:
    if not since(validate_version(version), HOST_HALF_LIMIT_SINCE):
        return f"{version}: 0.8 x (host - device)"
    return f"{version}: 0.5 x host (since {HOST_HALF_LIMIT_SINCE})"


def retries_rate_limited(version: str) -> bool:
    """Whether a rate-limited prefetch is re-issued by default: since 0.5.20 every
    RETRY_POLL_INTERVAL_PASSES scheduler passes, up to RETRY_MAX_ATTEMPTS; 0.5.19 has the flags
    but off (poll 0); before 0.5.19 it is never offered again."""
    defaults = retry_defaults(version)
    return defaults is not None and defaults[0] > 0


def retry_rule(version: str) -> str:
    defaults = retry_defaults(version)
    if defaults is None:
        return f"{version} never retries (no retry before {RETRY_FLAGS_SINCE})"
    poll, attempts = defaults
    if poll == 0:
        return (
            f"{version} does not retry by default (--hicache-storage-prefetch-retry-poll-interval 0, "
            f"max attempts {attempts})"
        )
    return f"{version} retries every {poll} scheduler passes, up to {attempts} times"


def rate_limited_verdict(version: str, in_flight: int, limit: int) -> str:
    """Why a prefetch was not issued, naming the rule and the version."""
    return (
        f"skipped: {_tokens(in_flight)} tokens in flight >= limit {_tokens(limit)} "
        f"({prefetch_limit_rule(version)}); {retry_rule(version)}"
    )


def allocates_host_at_hit(version: str) -> bool:
    """Where a prefetch's host pages come from (docs/controller.md#prefetch-host-allocation):
    0.5.14 takes the whole requested span when it issues; 0.5.23 takes the hit once it is known.
    Both accept a partial allocation that still covers the threshold."""
    return since(validate_version(version), HOST_AT_HIT_SINCE)


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.3g}M"
    if n >= 10_000:
        return f"{n / 1e3:.3g}k"
    return str(n)


# -- the `timeout` stop policy: docs/controller.md#timeout-budget ----------------------------------


@dataclass(frozen=True)
class TimeoutBudget:
    """The `timeout` stop policy's budget; None fields take the version's defaults."""

    base: float | None = None
    per_ki_token: float | None = None
    maximum: float | None = None

    def seconds(self, version: str, *, requested_tokens: int, hit_tokens: int) -> float:
        """How long `timeout` lets a prefetch run.

        0.5.14: min(max 30, 2.0 + 0.1 x hit_tokens/1024). 0.5.23: 1.0 + 0.25 x
        requested_tokens/1024, the whole unmatched span, and `maximum` is not read.
        Extra-config prefetch_timeout_base / _per_ki_token (/ _max, 0.5.14) override the constants.
        """
        version = validate_version(version)
        if not since(version, UNIFIED_BUDGET_SINCE):
            base, per_ki, cap, tokens = 2.0, 0.1, 30.0, hit_tokens
            cap = self.maximum if self.maximum is not None else cap
        elif not since(version, REQUESTED_BUDGET_SINCE):
            base, per_ki, cap, tokens = 1.0, 0.25, None, hit_tokens
        else:
            base, per_ki, cap, tokens = 1.0, 0.25, None, requested_tokens
        base = self.base if self.base is not None else base
        per_ki = self.per_ki_token if self.per_ki_token is not None else per_ki
        budget = base + per_ki * tokens / 1024
        return min(cap, budget) if cap is not None else budget


def budget_rule(version: str) -> str:
    version = validate_version(version)
    if not since(version, UNIFIED_BUDGET_SINCE):
        return f"{version}: min(30, 2.0 + 0.1 x hit tokens/1024) from the request's queueing"
    if not since(version, REQUESTED_BUDGET_SINCE):
        return f"{version}: 1.0 + 0.25 x hit tokens/1024, no maximum, from the request's queueing"
    return f"{version}: 1.0 + 0.25 x requested tokens/1024 from the first admission check that finds it unfinished"


def clock_starts_at_issue(version: str) -> bool:
    """Before 0.5.23 the budget runs from the prefetch's issue (the request's queueing); since
    0.5.23 from the first admission check that finds the prefetch unfinished."""
    return not since(validate_version(version), REQUESTED_BUDGET_SINCE)


def stop_deadline(policy: str, budget_s: float, admission_s: float, version: str) -> float:
    """Seconds after the prefetch's issue at which the request stops waiting for it, when its
    first admission check comes `admission_s` after the issue.

    best_effort takes what has arrived at the first check; wait_complete waits for every hit page;
    timeout waits until its budget runs out, counted from the issue (0.5.14) or from that first
    check (0.5.23) (docs/controller.md#stop-policies, #timeout-budget).
    """
    check_stop_policy(policy)
    if policy == "best_effort":
        return admission_s
    if policy == "timeout":
        return max(admission_s, budget_s) if clock_starts_at_issue(version) else admission_s + budget_s
    return float("inf")


# -- what the engine cannot represent: docs/controller.md#not-modelled -----------------------------


def unmodelled_host_mode(host_memory_mode: str | None, version: str) -> str | None:
    """A sentence when a deployment's host memory mode is one the engine cannot represent."""
    if host_memory_mode in (None, "", "cache"):
        return None
    if host_memory_mode == "buffer_only" and family(validate_version(version)) != V0_5_14:
        return (
            "this deployment runs 0.5.23's buffer_only host memory mode: host RAM only stages L3 transfers "
            "(no L2 tier, prefetch limit 0.9 x host on real usage); the engine models the cache mode, so its "
            "L2 answers do not apply (docs/controller.md#not-modelled)."
        )
    return f"host memory mode {host_memory_mode!r} is not one SGLang {version} has."


# -- admission budget: docs/controller.md#admission-budget -----------------------------------------

# SGLang's estimate of a request's decode (env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, both versions).
CLIP_MAX_NEW_TOKENS = 4096


def reserved_new_tokens(max_new_tokens: int) -> int:
    """Decode tokens SGLang reserves for a request at admission: its max_new_tokens, clipped."""
    return min(max(max_new_tokens, 0), CLIP_MAX_NEW_TOKENS)


def batch_is_full(max_running_requests: int | None, running: int, admitted_this_pass: int) -> bool:
    """The scheduler stops adding to this pass (before asking the request's prefetch whether it
    may stop) once the pass's new requests fill what the running batch leaves; None: no cap."""
    if max_running_requests is None:
        return False
    return admitted_this_pass >= max_running_requests - running


def input_budget_refuses(
    extend_tokens: int, page_size: int, rem_input_tokens: int | None, admitted_this_pass: int
) -> bool:
    """Without chunked prefill a pass's prefill is capped by `rem_input_tokens` (what is left of
    max_prefill_tokens); its first request is taken even above it. None: no cap."""
    if rem_input_tokens is None or admitted_this_pass == 0:
        return False
    return paged_tokens(extend_tokens, page_size) >= rem_input_tokens


def paged_tokens(tokens: int, page_size: int) -> int:
    """Tokens rounded up to whole pages, as a pass's input budget is charged."""
    return -(-tokens // page_size) * page_size
