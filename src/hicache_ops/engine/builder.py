"""Build a TieredCache from one description: geometry, pools, policies, ranks and L3.

`accounting=True` gives the byte-free planes (same tree, eviction and policies) for benchmark
scale; otherwise every rank gets real device and host pools and, with a store, a Mooncake L3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, L3Tier, MemoryL3
from hicache_ops.engine.reference import side_object_bytes
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.deployment import DeploymentSettings
from hicache_ops.sglang.geometry import DEFAULT_PRESET, ModelGeometry, preset
from hicache_ops.sglang.host_pool import DEFAULT_HICACHE_RATIO, HostPoolLayout
from hicache_ops.sglang.page_keys import Deployment, ObjectKeyScheme, check_dcp
from hicache_ops.sglang.rewrites import resolve_layout
from hicache_ops.sglang.side_pool_specs import PoolSpec, check_pool, pool_suffixes
from hicache_ops.sglang.versions import NEWEST

if TYPE_CHECKING:
    from hicache_ops.mooncake.store_client import StoreClient


@dataclass(frozen=True)
class EngineSpec:
    geometry: ModelGeometry = field(default_factory=lambda: preset(DEFAULT_PRESET))
    page_size: int = 16
    device_tokens: int = 4096
    hicache_ratio: float = 2.0
    hicache_size_gb: float = 0
    # The host pool asked for in tokens instead of device_tokens x hicache_ratio (exact, no ratio).
    host_asked_tokens: int | None = None
    layout: str = "page_first"
    io_backend: str = "kernel"
    write_policy: str = pol.DEFAULT_WRITE_POLICY
    stop_policy: str = pol.DEFAULT_STOP_POLICY
    prefetch_threshold: int = pol.DEFAULT_PREFETCH_THRESHOLD
    timeout_budget: pol.TimeoutBudget = pol.TimeoutBudget()
    sglang_version: str = NEWEST
    model_name: str | None = "hicache/tiny"
    extra_backend_tag: str | None = None
    tp_size: int = 1
    tp_lcm_size: int | None = None
    enable_l2: bool = True
    host_memory_mode: str = "cache"  # 0.5.23 --hicache-host-memory-mode; only cache is modelled
    torch_device: str = "auto"  # "auto": cuda:r per rank when there are tp_size GPUs, else cpu
    # 0.5.23 decode context parallel (MLA only; docs/keys.md#dcp). `page_size` and `device_tokens`
    # stay logical (the tree's and the page keys' widened page); each rank holds 1/dcp_size of them.
    dcp_size: int = 1
    # Side pools written and checked with the KV (docs/side-pools.md#side-objects-in-the-engine).
    side_pools: tuple[PoolSpec, ...] = ()
    # Modelled L3 transfer rate (docs/controller.md#transfer-time); None: unlimited.
    l3_bandwidth_bytes_s: float | None = None

    @classmethod
    def of(
        cls,
        geometry: ModelGeometry,
        settings: DeploymentSettings,
        *,
        side_pools: tuple[PoolSpec, ...] = (),
        torch_device: str = "auto",
        l3_bandwidth_bytes_s: float | None = None,
    ) -> EngineSpec:
        """The engine that mirrors a deployment: its topology, pool sizes and policies, with this geometry
        (and the modelled L3 transfer rate, which no SGLang flag sets)."""
        dep, sizing, policies = settings.topology, settings.sizing, settings.policies
        return cls(
            geometry=geometry,
            page_size=settings.page_size,
            device_tokens=sizing.device_tokens,
            hicache_ratio=DEFAULT_HICACHE_RATIO if sizing.hicache_ratio is None else sizing.hicache_ratio,
            hicache_size_gb=sizing.hicache_size,
            layout=dep.layout,
            io_backend=sizing.io_backend,
            write_policy=policies.write_policy,
            stop_policy=policies.prefetch_policy,
            prefetch_threshold=policies.prefetch_threshold,
            host_memory_mode=sizing.host_memory_mode,
            sglang_version=dep.version,
            model_name=dep.model_name,
            extra_backend_tag=dep.extra_backend_tag,
            tp_size=dep.tp_size,
            tp_lcm_size=dep.tp_lcm_size,
            dcp_size=dep.dcp_size,
            torch_device=torch_device,
            side_pools=side_pools,
            l3_bandwidth_bytes_s=l3_bandwidth_bytes_s,
        )

    def validate(self, *, mooncake: bool) -> EngineSpec:
        """Refuse what the engine cannot build (pools, policies, memory) before anything starts; return self."""
        self.cache_config(self.host_layout(mooncake=mooncake))
        check_memory(self)
        return self

    @property
    def rank_page_size(self) -> int:
        """Tokens of each page one rank holds: the logical page split over the DCP shards."""
        return self.page_size // self.dcp_size

    def check_dcp(self) -> None:
        """SGLang's conditions for DCP with a Mooncake L3, plus what the engine models (one sentence each)."""
        if self.dcp_size == 1:
            return
        if isinstance(self.dcp_size, bool) or not isinstance(self.dcp_size, int) or self.dcp_size < 1:
            raise InputError(f"dcp-size {self.dcp_size!r} is not a positive integer.")
        if not self.geometry.mla:
            raise InputError(
                f"dcp-size {self.dcp_size} needs an MLA model: SGLang runs HiCache with DCP for MLA only.",
                hint="Use an MLA geometry, such as --preset tiny-mla.",
            )
        check_dcp(self.sglang_version, self.geometry.mla, self.tp_size, self.dcp_size, self.page_size)

    def host_layout(self, mooncake: bool) -> HostPoolLayout:
        """One rank's host pool. Under DCP a rank's page is `rank_page_size` tokens of the logical page,
        and its pools hold `device_tokens // dcp_size` tokens, so host pages and logical pages pair 1:1."""
        self.check_dcp()
        layout, _, _ = resolve_layout(
            self.layout, self.io_backend, mooncake, version=self.sglang_version, dcp_size=self.dcp_size
        )
        if mooncake and self.dcp_size > 1 and layout == "layer_first":
            raise InputError(
                "layout layer_first with DCP: SGLang keeps it and writes each page as a multi-buffer object of one "
                "piece per layer, which the embedded engine does not model.",
                hint="Use --hicache-mem-layout page_first (or page_first_direct).",
            )
        return HostPoolLayout(
            self.geometry,
            layout,
            self.rank_page_size,
            self.device_tokens // self.dcp_size,
            self.hicache_ratio,
            self.hicache_size_gb,
            tp_size=self.tp_size,
            tp_lcm_size=self.tp_lcm_size,
            sglang_version=self.sglang_version,
            mooncake=mooncake,
            asked_tokens=self.host_asked_tokens // self.dcp_size if self.host_asked_tokens else None,
        )

    def deployment(self) -> Deployment:
        """The key scheme of this engine's ranks, as `inspect keys` and the live diff take it."""
        return Deployment(
            version=self.sglang_version,
            model_name=self.model_name,
            extra_backend_tag=self.extra_backend_tag,
            tp_size=self.tp_size,
            mla=self.geometry.mla,
            layout=self.host_layout(mooncake=True).layout,
            tp_lcm_size=self.tp_lcm_size,
            dcp_size=self.dcp_size,
            page_size=self.page_size,
        )

    def schemes(self) -> list[ObjectKeyScheme]:
        """Every rank's object naming, writing or not (MLA ranks above 0 only read; under DCP the
        ranks of the first DCP group write, one object per shard, and tp rank r reads shard r % dcp_size)."""
        dep = self.deployment()
        return [
            ObjectKeyScheme(
                dep.version,
                model_name=dep.model_name,
                extra_backend_tag=dep.extra_backend_tag,
                tp_rank=r,
                tp_size=dep.tp_size,
                mla=dep.mla,
                layout=dep.layout,
                tp_lcm_size=dep.tp_lcm_size,
                dcp_size=dep.dcp_size,
                page_size=dep.page_size,
            )
            for r in range(self.tp_size)
        ]

    def side_pool_suffixes(self, scheme: ObjectKeyScheme) -> dict[str, list[str]]:
        """Each side pool's object suffixes for one rank, in the order of `side_pools`."""
        return {pool.name: pool_suffixes(pool, scheme) for pool in self.side_pools}

    def check_side_pools(self) -> None:
        """InputError when a side pool does not exist in this SGLang version or cannot be keyed here."""
        names = [pool.name for pool in self.side_pools]
        if len(set(names)) < len(names):
            raise InputError(f"a pool is given twice: {', '.join(names)}; SGLang registers each pool once.")
        if self.side_pools and self.dcp_size > 1:
            raise InputError(
                "side pools under DCP are not modelled by the engine: give --pool/--pool-preset or --dcp-size, not "
                "both."
            )
        for pool in self.side_pools:
            check_pool(pool, self.sglang_version, self.geometry.mla)
        for scheme in self.schemes() if self.side_pools else ():
            self.side_pool_suffixes(scheme)

    def cache_config(self, host: HostPoolLayout) -> CacheConfig:
        self.check_side_pools()
        unmodelled = pol.unmodelled_host_mode(self.host_memory_mode, self.sglang_version)
        if unmodelled:
            raise InputError(unmodelled)
        if self.device_tokens % self.page_size:
            raise InputError(
                f"device tokens {self.device_tokens} are not a whole number of {self.page_size}-token pages."
            )
        return CacheConfig(
            page_size=self.page_size,
            device_pages=self.device_tokens // self.page_size,
            host_pages=host.page_num if self.enable_l2 else 0,
            write_policy=self.write_policy,
            stop_policy=self.stop_policy,
            prefetch_threshold=self.prefetch_threshold,
            sglang_version=self.sglang_version,
            timeout_budget=self.timeout_budget,
            enable_l2=self.enable_l2,
            l3_bandwidth_bytes_s=self.l3_bandwidth_bytes_s,
        )

    def rank_devices(self) -> list[str]:
        if self.torch_device != "auto":
            return [self.torch_device] * self.tp_size
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= self.tp_size:
            return [f"cuda:{r}" for r in range(self.tp_size)]
        return ["cpu"] * self.tp_size

    def memory_needed(self) -> dict[str, Any]:
        """Bytes every rank's pools take, summed over ranks (checked before allocating)."""
        host = self.host_layout(mooncake=True)
        rank_tokens = (self.device_tokens + self.page_size) // self.dcp_size
        device_per_rank = rank_tokens * self.geometry.bytes_per_token(self.tp_size)
        return {"host": host.host_bytes * self.tp_size, "device": device_per_rank * self.tp_size}


def build_accounting(spec: EngineSpec, l3: bool = True, shared_l3: L3Tier | None = None) -> TieredCache:
    """The byte-free cache; `shared_l3` lets several instances share one L3 (or brings another L3Tier)."""
    host = spec.host_layout(mooncake=l3)
    config = spec.cache_config(host)
    per_page = host.bytes_per_page * spec.tp_size
    memory_l3: L3Tier | None = shared_l3
    if memory_l3 is None and l3:
        memory_l3 = MemoryL3(
            spec.schemes(), per_page, pools=spec.side_pools, side_object_bytes=side_object_bytes(spec.geometry)
        )
    return TieredCache(config, AccountingPlane(per_page), memory_l3)


def check_memory(spec: EngineSpec) -> None:
    """Refuse pools that cannot fit in this machine's available memory, naming the bytes."""
    need = spec.memory_needed()
    devices = spec.rank_devices()
    host_total = need["host"] + (need["device"] if devices[0] == "cpu" else 0)
    available = _available_memory()
    if available is not None and host_total > 0.9 * available:
        raise InputError(
            f"the pools need {host_total / 2**30:.2f} GiB of host memory but only {available / 2**30:.2f} GiB is "
            "available.",
            hint="Lower --device-tokens, --hicache-ratio or --hicache-size, or use a smaller geometry.",
        )


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def build_bytes(spec: EngineSpec, store: StoreClient | None = None) -> TieredCache:
    """The real-bytes cache; with `store` (a Mooncake store client) L3 is Mooncake.

    Every rank's host pool is registered with the store so puts and gets are zero-copy.
    """
    from hicache_ops.engine.bytes_plane import BytesPlane, MooncakeL3, allocate_rank, allocate_side

    check_memory(spec)
    host = spec.host_layout(mooncake=store is not None)
    if store is not None and not host.mooncake_zero_copy:
        raise InputError(f"layout {host.layout!r} cannot be read or written by Mooncake zero-copy.")
    config = spec.cache_config(host)
    devices = spec.rank_devices()
    ranks = [
        allocate_rank(
            r, spec.geometry, host, spec.device_tokens // spec.dcp_size, spec.rank_page_size, spec.tp_size, devices[r]
        )
        for r in range(spec.tp_size)
    ]
    if spec.side_pools:
        for pools, scheme in zip(ranks, spec.schemes(), strict=True):
            pools.side = allocate_side(host.page_num, spec.side_pool_suffixes(scheme), side_object_bytes(spec.geometry))
    plane = BytesPlane(ranks, spec.geometry, spec.page_size, spec.tp_size, dcp_size=spec.dcp_size)
    l3 = None
    if store is not None:
        for pools in ranks:
            store.register_buffer(pools.host.data_ptr(), pools.host.numel() * pools.host.element_size())
        for pools in ranks:
            if pools.side is not None:
                store.register_buffer(pools.side.buffer.data_ptr(), pools.side.buffer.numel())
        l3 = MooncakeL3(store, spec.schemes(), plane, pools=spec.side_pools)
    return TieredCache(config, plane, l3)
