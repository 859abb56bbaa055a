"""What a TieredCache is built with: pool sizes and the policies it follows, per SGLang version
(docs/controller.md#defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.versions import V0_5_23, validate_version


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 16
    device_pages: int = 64
    host_pages: int = 129
    write_policy: str = pol.DEFAULT_WRITE_POLICY
    stop_policy: str = pol.DEFAULT_STOP_POLICY
    prefetch_threshold: int = pol.DEFAULT_PREFETCH_THRESHOLD
    load_back_threshold: int = pol.LOAD_BACK_THRESHOLD
    sglang_version: str = V0_5_23
    timeout_budget: pol.TimeoutBudget = pol.TimeoutBudget()
    # When the scheduler admits a request after its prefetch started; best_effort takes what has
    # arrived by then, `timeout` waits at least this long.
    admission_s: float = 0.05
    enable_l2: bool = True
    eviction_policy: str = pol.DEFAULT_EVICTION_POLICY
    # The concurrency model's admission caps (docs/controller.md#admission-budget): requests in
    # the running batch (SGLang's --max-running-requests) and prefill tokens per scheduler pass
    # (--max-prefill-tokens, chunked prefill off). None: no cap.
    max_running_requests: int | None = None
    max_prefill_tokens: int | None = None
    # Modelled time (docs/controller.md#transfer-time): an L3 read batch takes `l3_latency_s` plus
    # its bytes / `l3_bandwidth_bytes_s` (None: no bandwidth limit), on top of what the L3 tier
    # itself reports; an L3 write becomes visible to lookups as long after its host copy is
    # acknowledged. The concurrency model's scheduler pass takes `pass_s` on its clock.
    l3_bandwidth_bytes_s: float | None = None
    l3_latency_s: float = 0.0
    pass_s: float = 0.02

    def __post_init__(self) -> None:
        if self.page_size <= 0:
            raise InputError(f"page size {self.page_size} must be > 0.")
        if self.device_pages <= 0:
            raise InputError(f"the device pool needs at least one page, got {self.device_pages}.")
        if self.enable_l2 and self.host_pages <= 0:
            raise InputError(f"the host pool needs at least one page, got {self.host_pages}.")
        for name in ("max_running_requests", "max_prefill_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InputError(f"{name.replace('_', ' ')} {value} must be > 0.")
        if self.l3_bandwidth_bytes_s is not None and self.l3_bandwidth_bytes_s <= 0:
            raise InputError(f"L3 bandwidth {self.l3_bandwidth_bytes_s} bytes/s must be > 0.")
        for name in ("l3_latency_s", "pass_s", "admission_s"):
            if getattr(self, name) < 0:
                raise InputError(f"{name.replace('_', ' ')} {getattr(self, name)} must be >= 0.")
        pol.check_write_policy(self.write_policy)
        pol.check_stop_policy(self.stop_policy)
        validate_version(self.sglang_version)
        pol.check_eviction_policy(self.eviction_policy, self.sglang_version)
