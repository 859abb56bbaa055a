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
        pol.check_write_policy(self.write_policy)
        pol.check_stop_policy(self.stop_policy)
        validate_version(self.sglang_version)
        pol.check_eviction_policy(self.eviction_policy, self.sglang_version)
