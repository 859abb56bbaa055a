"""The deployment a command mirrors, one frozen dataclass per concern (docs/server-info.md#toolkit-use).

- `Deployment` (sglang/page_keys.py): the topology that names objects: release, model name, prefix tag,
  tp/pp/dcp sizes and ranks, MLA, host layout, logical page size.
- `CacheSizing`: how large the pools are: device tokens, host ratio or size, io backend, host memory mode.
- `Policies`: SGLang's HiCache policies: write policy, prefetch (stop) policy, prefetch threshold.
- `L3Address`: where the Mooncake master answers: its admin HTTP address and its RPC address.

Each field is named as the setting it mirrors is named everywhere in the toolkit (one flag, one
name); `DeploymentSettings` holds the four and where they came from, and is validated once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hicache_ops.errors import SettingError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import Deployment
from hicache_ops.sglang.rewrites import IO_BACKENDS


@dataclass(frozen=True)
class CacheSizing:
    """One rank's pool sizes as SGLang's flags give them (the host pool: ratio, or GB when > 0)."""

    device_tokens: int = 4096
    hicache_ratio: float | None = 2.0  # None: the release's default (upgrade check compares releases)
    hicache_size: float = 0
    io_backend: str = "kernel"
    host_memory_mode: str = "cache"

    def validate(self) -> None:
        if self.device_tokens < 1:
            raise SettingError("device_tokens", f"{self.device_tokens} must be >= 1.")
        if self.hicache_size < 0:
            raise SettingError("hicache_size", f"{self.hicache_size:g} must be >= 0 (GB per rank).")
        if self.io_backend not in IO_BACKENDS:
            raise SettingError("io_backend", f"{self.io_backend!r} is not one of {', '.join(IO_BACKENDS)}.")


@dataclass(frozen=True)
class Policies:
    """When pages are written to L2/L3, when an L3 prefetch stops, and the fewest tokens worth one."""

    write_policy: str = pol.DEFAULT_WRITE_POLICY
    prefetch_policy: str = pol.DEFAULT_STOP_POLICY
    prefetch_threshold: int = pol.DEFAULT_PREFETCH_THRESHOLD

    def validate(self) -> None:
        pol.check_write_policy(self.write_policy)
        pol.check_stop_policy(self.prefetch_policy)
        if self.prefetch_threshold < 0:
            raise SettingError("prefetch_threshold", f"{self.prefetch_threshold} is negative; it counts tokens.")


@dataclass(frozen=True)
class L3Address:
    """The Mooncake master of the L3 tier: `master` its admin HTTP HOST:METRICS_PORT, `master_rpc` HOST:RPC_PORT."""

    master: str | None = None
    master_rpc: str | None = None

    def validate(self) -> None:
        for name, value in (("master", self.master), ("master_rpc", self.master_rpc)):
            if value is not None and not value.strip():
                raise SettingError(name, "is empty; give HOST:PORT.")


@dataclass(frozen=True)
class DeploymentSettings:
    """The four concerns of one deployment, and, when a server was asked (`--sglang-url`), what it said.

    `provenance` holds the fields the command's JSON carries about that server (`sglang_server`,
    `server_disagreements`, `sglang_rules` when its version chose the rules); empty otherwise.
    """

    topology: Deployment
    sizing: CacheSizing = CacheSizing()
    policies: Policies = Policies()
    l3: L3Address = L3Address()
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def page_size(self) -> int:
        """The logical page size (the topology's); a deployment without one cannot name pages."""
        if self.topology.page_size is None:
            raise SettingError("page_size", "is not known: give the deployment's page size.")
        return self.topology.page_size

    def validate(self) -> DeploymentSettings:
        """Refuse the first bad value, naming its setting (SettingError); return self when all hold."""
        self.topology.validate()
        self.sizing.validate()
        self.policies.validate()
        self.l3.validate()
        return self
