"""The one function that turns a command's deployment options into the library's concern objects.

A command's options carry the names of the fields they fill (one flag, one parameter name:
tests/cli/test_options.py), so `deployment_settings` reads them by name from the command's
parsed parameters, after `--sglang-url` filled the ones not given (cli/common/sglang_url.py),
and hands back one validated `DeploymentSettings` (sglang/deployment.py) that commands pass whole.
An option a command does not have takes the dataclass's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer

from hicache_ops.cli.common.options import value_of
from hicache_ops.cli.common.output import PROVENANCE, json_data
from hicache_ops.sglang.deployment import CacheSizing, DeploymentSettings, L3Address, Policies
from hicache_ops.sglang.page_keys import Deployment

if TYPE_CHECKING:
    from hicache_ops.sglang.side_pool_specs import PoolSpec

# ctx.meta key under which --sglang-url leaves the JSON fields about the server it read.


def _get(params: Mapping[str, Any], name: str, default: Any) -> Any:
    value = value_of(params[name]) if name in params else None
    return default if value is None else value


def implied_mla(params: Mapping[str, Any], version: str) -> bool:
    """--mla, or the attention kind of a --pool-preset (an MLA preset describes an MLA server)."""
    mla = bool(params.get("mla", False))
    name = params.get("pool_preset")
    if name is not None and not mla:
        from hicache_ops.sglang.side_pool_specs import preset

        mla = preset(name, version).mla
    return mla


def deployment_settings(ctx: typer.Context, *, mla: bool | None = None) -> DeploymentSettings:
    """The deployment the running command's options describe, validated once.

    `mla` overrides the attention kind where a model geometry (--preset) decides it rather than --mla.
    """
    from hicache_ops.sglang.versions import default_version, validate_version

    params = ctx.params
    version = validate_version(_get(params, "sglang_version", None) or default_version())
    topology = Deployment(
        version=version,
        model_name=_get(params, "model_name", None),
        extra_backend_tag=_get(params, "extra_backend_tag", None),
        tp_size=_get(params, "tp_size", 1),
        tp_rank=_get(params, "tp_rank", None),
        pp_size=_get(params, "pp_size", 1),
        pp_rank=_get(params, "pp_rank", None),
        mla=implied_mla(params, version) if mla is None else mla,
        layout=_get(params, "layout", "page_first"),
        tp_lcm_size=_get(params, "tp_lcm_size", None),
        dcp_size=_get(params, "dcp_size", 1),
        dcp_rank=_get(params, "dcp_rank", None),
        page_size=_get(params, "page_size", None),
    )
    sizing = CacheSizing(
        device_tokens=_get(params, "device_tokens", CacheSizing.device_tokens),
        hicache_ratio=params["hicache_ratio"] if "hicache_ratio" in params else CacheSizing.hicache_ratio,
        hicache_size=_get(params, "hicache_size", CacheSizing.hicache_size),
        io_backend=_get(params, "io_backend", CacheSizing.io_backend),
        host_memory_mode=_get(params, "host_memory_mode", CacheSizing.host_memory_mode),
    )
    policies = Policies(
        write_policy=_get(params, "write_policy", Policies.write_policy),
        prefetch_policy=_get(params, "prefetch_policy", Policies.prefetch_policy),
        prefetch_threshold=_get(params, "prefetch_threshold", Policies.prefetch_threshold),
    )
    l3 = L3Address(master=_get(params, "master", None), master_rpc=_get(params, "master_rpc", None))
    found = ctx.meta.get(PROVENANCE)
    provenance = json_data(found) if found is not None else {}
    return DeploymentSettings(topology, sizing, policies, l3, provenance).validate()


def side_pools(ctx: typer.Context, settings: DeploymentSettings) -> tuple[PoolSpec, ...]:
    """The side pools --pool / --pool-preset give this deployment (its version, attention kind and page)."""
    from hicache_ops.sglang.side_pool_specs import side_pools_for

    params = ctx.params
    dep = settings.topology
    return side_pools_for(params.get("pool"), params.get("pool_preset"), dep.version, dep.mla, dep.page_size or 1)
