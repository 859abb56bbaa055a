"""`hicache te check`: will SGLang's Mooncake store reuse the shared Transfer Engine?

    report = check_reuse("0.5.23", server_args="--enable-hierarchical-cache --hicache-storage-backend mooncake",
                         env={"MOONCAKE_MASTER": "10.0.0.1:50051"})
    report.eligible, [c.name for c in report.conditions], report.fix, report.warnings

`check_reuse` reads the deployment (SGLang launch flags, extra-config and environment, through
`hicache_ops.sglang.launch`), evaluates the reuse rule for every rank of this node (`rule`) and,
when it is not reused, finds the smallest change that makes every rank reuse it (`fix`). A flag
SGLang does not have is a warning in the report, never dropped silently. Reuse is an optimisation:
without it the store starts a Transfer Engine of its own and stays correct.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from hicache_ops.commands.te.fix import TeFix, find_fix
from hicache_ops.commands.te.rule import (
    REUSE_LOG_LINE,
    Condition,
    Evaluation,
    RankResult,
    Scenario,
    evaluate,
    require_mooncake_store,
    show_value,
)
from hicache_ops.errors import SettingError
from hicache_ops.mooncake.config import CONFIG_PATH_ENV, StoreConfig
from hicache_ops.results import Result
from hicache_ops.sglang.launch import LaunchArgs, default_args, load_extra_config, parse_server_args
from hicache_ops.sglang.versions import validate_version


class TeCondition(Result):
    name: str = Field(description="the rule's condition, in SGLang's order")
    ok: bool = Field(description="the deployment passes it")
    actual: Any = Field(description="the deployment's value (per rank `{rank: value}` when ranks differ)")
    expected: Any = Field(description="the value the condition needs")
    why: str = Field(description="the condition in words, with where the value came from")


class TeRank(Result):
    rank: str = Field(description="the rank's label (dp/pp/tp)")
    dp_rank: int = Field(description="data-parallel rank")
    pp_rank: int = Field(description="pipeline-parallel rank")
    tp_rank: int = Field(description="tensor-parallel rank")
    store_tp_rank: int = Field(
        description="the tp rank the store client is set up with (attention tp under DP attention)"
    )
    gpu_id: int = Field(description="the GPU the rank runs on")
    store_device_name: Any = Field(description="the device_name the rank's store passes to setup()")
    engine_ib_device: str | None = Field(description="the shared engine's ib device for this rank (`null`: none)")
    device_match: bool = Field(description="store device_name == engine ib device (SGLang's comparison)")
    eligible: bool = Field(description="this rank reuses the shared engine")


class TeEngine(Result):
    reasons: list[str] = Field(description="how the shared engine's protocol was decided")
    protocol: str = Field(description="the shared engine's protocol")


class TeStoreConfig(Result):
    origin: str = Field(description="where the store config came from: `file`, `extra_config` or `env`")
    config_path: str | None = Field(description="the Mooncake config file, when one was read")
    metadata_server: str = Field(description="the store's metadata_server")
    protocol: str = Field(description="the store's protocol")
    device_name: str = Field(description="the store's device_name as configured")
    master_server_address: str | None = Field(description="the master's RPC address")
    sources: dict[str, str | None] = Field(
        description="field -> where its value was read (`env:NAME`, a file, default)"
    )


class TeCheckResult(Result):
    """`hicache te check --json`."""

    eligible: bool = Field(description="every rank reuses the shared Transfer Engine")
    verdict: Literal["reused", "not reused"] = Field(description="the answer in words")
    conditions: list[TeCondition] = Field(description="the reuse rule's conditions, in SGLang's order")
    fix: TeFix | None = Field(description="the smallest change that makes every rank reuse it; `null` when reused")
    sglang_version: str = Field(description="the SGLang release whose rule was applied")
    ranks: list[TeRank] = Field(description="every rank of this node (only --tp-rank's with it)")
    engine: TeEngine = Field(description="the shared engine SGLang would create")
    store_config: TeStoreConfig = Field(description="the Mooncake store config the ranks resolve")
    server_args_assumed: bool = Field(description="no server args given: HiCache + mooncake and SGLang's defaults")
    warnings: list[str] = Field(description="what SGLang does silently with this deployment")
    notes: list[str] = Field(description="plain-language remarks")
    live: dict[str, Any] | None = Field(
        description="with --live: the transfer test (`ok`, `master`, `engine`, `store`, `transfers`, `error`)"
    )


def _rank(r: RankResult) -> TeRank:
    k = r.rank
    return TeRank(
        rank=k.label,
        dp_rank=k.dp_rank,
        pp_rank=k.pp_rank,
        tp_rank=k.tp_rank,
        store_tp_rank=k.store_tp_rank,
        gpu_id=k.gpu_id,
        store_device_name=r.store_device,
        engine_ib_device=r.engine_ib_device,
        device_match=r.store_device == r.engine_ib_device,
        eligible=r.eligible,
    )


@dataclass
class TeReport:
    sglang_version: str
    eligible: bool
    conditions: list[Condition]
    ranks: list[RankResult]
    fix: TeFix | None
    config: StoreConfig
    args: LaunchArgs
    server_args_assumed: bool  # no server args given: HiCache + mooncake assumed
    engine_protocol: str
    engine_reasons: list[str]
    warnings: list[str]
    notes: list[str]
    live: dict | None = None

    def result(self) -> TeCheckResult:
        cfg = self.config
        return TeCheckResult(
            eligible=self.eligible,
            verdict="reused" if self.eligible else "not reused",
            conditions=[
                TeCondition(name=c.name, ok=c.ok, actual=c.actual, expected=c.expected, why=c.why)
                for c in self.conditions
            ],
            fix=self.fix,
            sglang_version=self.sglang_version,
            ranks=[_rank(r) for r in self.ranks],
            engine=TeEngine(reasons=self.engine_reasons, protocol=self.engine_protocol),
            store_config=TeStoreConfig(
                origin=cfg.origin,
                config_path=cfg.config_path,
                metadata_server=cfg.metadata_server,
                protocol=cfg.protocol,
                device_name=cfg.device_name,
                master_server_address=cfg.master_server_address,
                sources={
                    k: cfg.sources.get(k)
                    for k in ("device_name", "metadata_server", "protocol", "master_server_address")
                },
            ),
            server_args_assumed=self.server_args_assumed,
            warnings=self.warnings,
            notes=self.notes,
            live=self.live,
        )


def build_scenario(
    version: str,
    *,
    server_args: str | None = None,
    extra_config: str | dict | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    env_overrides: Mapping[str, str] | None = None,
) -> Scenario:
    """The deployment to evaluate; server_args None assumes HiCache with the mooncake backend."""
    validate_version(version)
    if server_args is None:
        args = dataclasses.replace(
            default_args(version), enable_hierarchical_cache=True, hicache_storage_backend="mooncake"
        )
    else:
        args = parse_server_args(server_args, version)
        require_mooncake_store(args)
    merged = dict(os.environ if env is None else env)
    merged.update(env_overrides or {})
    from_args = load_extra_config(
        args.hicache_storage_backend_extra_config, where="--hicache-storage-backend-extra-config"
    )
    given = (
        extra_config
        if isinstance(extra_config, dict) or extra_config is None
        else load_extra_config(extra_config, where="--extra-config")
    )
    if from_args is not None and given is not None and from_args != given:
        raise SettingError(
            "extra_config",
            "and the server args' --hicache-storage-backend-extra-config differ; SGLang reads only the latter.",
            hint="Give the extra-config once.",
        )
    extra = given if given is not None else from_args
    if config_file is not None:
        current = merged.get(CONFIG_PATH_ENV)
        if current is not None and os.path.abspath(current) != os.path.abspath(config_file):
            raise SettingError(
                "config",
                f"{config_file!r} contradicts {CONFIG_PATH_ENV}={current!r}.",
                hint=f"Give one of them (--config stands for {CONFIG_PATH_ENV}).",
            )
        merged[CONFIG_PATH_ENV] = config_file
    return Scenario(version, args, merged, extra)


def check_reuse(
    version: str,
    *,
    server_args: str | None = None,
    extra_config: str | dict | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    env_overrides: Mapping[str, str] | None = None,
    tp_rank: int | None = None,
) -> TeReport:
    """Evaluate SGLang's shared-engine reuse rule for a deployment (see the module docstring).

    `server_args`: SGLang launch flags, "@FILE", or a file path (None: HiCache + mooncake assumed).
    `extra_config`: the extra-config JSON/"@FILE"/dict, when not in the server args.
    `config_file`: the Mooncake config file (stands for SGLANG_HICACHE_MOONCAKE_CONFIG_PATH).
    `env`: the deployment's environment (default os.environ), `env_overrides` applied on top.
    `tp_rank`: evaluate only the ranks with this tp rank.
    """
    sc = build_scenario(
        version,
        server_args=server_args,
        extra_config=extra_config,
        config_file=config_file,
        env=env,
        env_overrides=env_overrides,
    )
    ev = evaluate(sc)
    if tp_rank is not None:
        if not any(r.rank.tp_rank == tp_rank for r in ev.ranks):
            have = sorted({r.rank.tp_rank for r in ev.ranks})
            raise SettingError("tp_rank", f"{tp_rank} is not a rank of this node (tp ranks {have[0]}..{have[-1]}).")
        keep = [r for r in ev.ranks if r.rank.tp_rank == tp_rank]
        ev = _narrow(ev, keep)
    # A fix is for the whole deployment (a flag or a variable changes every rank).
    fix = None if ev.eligible else find_fix(sc, evaluate(sc, check_metadata=False) if tp_rank is not None else ev)
    assumed = server_args is None
    notes: list[str] = []
    if assumed:
        notes.append(
            "no server args given: assumed --enable-hierarchical-cache --hicache-storage-backend mooncake and "
            "SGLang's defaults."
        )
    if len(ev.ranks) > 1 and not any(isinstance(x.actual, dict) or isinstance(x.expected, dict) for x in ev.conditions):
        notes.append(f"all {len(ev.ranks)} ranks of this node resolve alike.")
    if ev.eligible:
        notes.append(f'SGLang logs "{REUSE_LOG_LINE}" once per rank at start-up; grep for it to confirm.')
    else:
        notes.append(
            "SGLang logs nothing when it does not reuse the engine: the absence of "
            f'"{REUSE_LOG_LINE}" is the only sign.'
        )
    return TeReport(
        sc.version,
        ev.eligible,
        ev.conditions,
        ev.ranks,
        fix,
        ev.cfg,
        sc.args,
        assumed,
        ev.engine_protocol,
        ev.engine_reasons,
        sc.args.warnings + ev.warnings,
        notes,
    )


def _narrow(ev: Evaluation, keep: list[RankResult]) -> Evaluation:
    """The evaluation of the ranks in `keep` only (--tp-rank)."""
    out = dataclasses.replace(ev, ranks=keep)
    dev_ok = all(r.store_device == r.engine_ib_device for r in keep)
    cond = ev.conditions[1]
    one = keep[0]
    same = len({(json.dumps(r.store_device), json.dumps(r.engine_ib_device)) for r in keep}) == 1
    out.conditions = [
        ev.conditions[0],
        Condition(
            cond.name,
            dev_ok,
            one.store_device if same else {r.rank.label: r.store_device for r in keep},
            one.engine_ib_device if same else {r.rank.label: r.engine_ib_device for r in keep},
            cond.why
            if cond.ok == dev_ok
            else (
                f"rank {one.rank.label}: store device_name {show_value(one.store_device)} vs engine ib device "
                f"{show_value(one.engine_ib_device)} ({one.engine_why})."
            ),
        ),
        *ev.conditions[2:],
    ]
    return out
