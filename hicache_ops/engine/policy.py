"""HiCache controller policies (FACTS §4): write policies, thresholds, prefetch stop policies.

Each rule is a small function of its inputs and the SGLang version, so the engine, `trace` and the
playbooks all ask the same question the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..sglang.versions import V0_5_14, validate_version

WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_through_selective", "write_back")
STOP_POLICIES: tuple[str, ...] = ("best_effort", "wait_complete", "timeout")

# A host hit shorter than this is recomputed rather than loaded back.
LOAD_BACK_THRESHOLD = 10
DEFAULT_PREFETCH_THRESHOLD = 256
# SGLang queries storage in batches of this many pages (hicache_storage.STORAGE_BATCH_SIZE).
STORAGE_BATCH_PAGES = 128
# The share of (host - device) tokens that in-flight prefetches may occupy.
PREFETCH_CAPACITY_SHARE = 0.8


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


def write_through_threshold(policy: str) -> int | None:
    """Hits after which a node is backed up to host; None: only at GPU eviction (write_back)."""
    check_write_policy(policy)
    return {"write_through": 1, "write_through_selective": 2, "write_back": None}[policy]


def effective_prefetch_threshold(threshold: int, page_size: int) -> int:
    """Prefetches shorter than this many tokens are not issued."""
    return max(threshold, page_size)


def prefetch_capacity_tokens(host_tokens: int, device_tokens: int) -> int:
    """Tokens that in-flight prefetches may occupy in the host pool."""
    return int(PREFETCH_CAPACITY_SHARE * (host_tokens - device_tokens))


@dataclass(frozen=True)
class TimeoutBudget:
    """The `timeout` stop policy's budget; None fields take the version's defaults."""

    base: float | None = None
    per_ki_token: float | None = None
    maximum: float | None = None

    def seconds(self, tokens: int, version: str) -> float:
        """How long `timeout` waits for a prefetch of `tokens` tokens.

        0.5.14: min(30.0, 2.0 + 0.1 * tokens/1024); 0.5.23: 1.0 + 0.25 * tokens/1024, no cap.
        Extra-config prefetch_timeout_base / _per_ki_token / _max override the constants.
        """
        validate_version(version)
        if version == V0_5_14:
            base, per_ki, cap = 2.0, 0.1, 30.0
        else:
            base, per_ki, cap = 1.0, 0.25, None
        base = self.base if self.base is not None else base
        per_ki = self.per_ki_token if self.per_ki_token is not None else per_ki
        cap = self.maximum if self.maximum is not None else cap
        budget = base + per_ki * tokens / 1024
        return min(cap, budget) if cap is not None else budget


def stop_deadline(policy: str, budget_s: float, admission_s: float) -> float:
    """Seconds after the prefetch starts at which the request stops waiting for it.

    best_effort takes what has arrived when the scheduler admits the request; timeout keeps the
    request waiting up to its budget; wait_complete waits for every hit page.
    """
    check_stop_policy(policy)
    if policy == "best_effort":
        return admission_s
    if policy == "timeout":
        return max(admission_s, budget_s)
    return float("inf")
