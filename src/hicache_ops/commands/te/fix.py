"""The smallest change that makes every rank reuse the shared engine, verified by re-evaluation.

    fix = find_fix(scenario, evaluate(scenario))
    fix.changes, fix.verified

Each failing condition is repaired where its value really comes from (the variable, the extra-config
or the Mooncake config file it was read from; docs/mooncake.md#config-resolution), in the rule's
order; the changed deployment is evaluated again, so `verified` says whether it now reuses the engine.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

from pydantic import Field

from hicache_ops.commands.te.rule import (
    FORCE_TCP_ENV,
    P2P,
    RDMA,
    REUSE_ENV,
    REUSE_LOG_LINE,
    Evaluation,
    Scenario,
    evaluate,
    rdma_devices,
)
from hicache_ops.results import Result

MATTERS = (
    "Reuse is an optimisation, not a correctness issue: without it each rank's store client starts a "
    "second Transfer Engine of its own (another listener port and handshake, and on RDMA its own "
    "NIC resources and memory registrations); the KV it stores and loads is the same, and SGLang logs "
    f'nothing either way except "{REUSE_LOG_LINE}" on success.'
)


class Change(Result):
    kind: Literal["env", "flag", "config"] = Field(description="what the change edits")
    name: str = Field(description="the variable, flag (SGLang's field name) or config key")
    value: Any = Field(description="its new value; `null`: unset or remove it")
    text: str = Field(description="the change as one instruction")


class TeFix(Result):
    summary: str = Field(description="every change, in order, as one line")
    changes: list[Change] = Field(description="the changes, applied in order")
    alternative: str | None = Field(description="another way, where one exists (TCP-only deployments)")
    verified: bool = Field(description="the changed deployment, evaluated again, reuses the engine on every rank")
    matters: str = Field(description="what not reusing the engine costs")


def _change(kind: Literal["env", "flag", "config"], name: str, value: object, text: str) -> Change:
    return Change(kind=kind, name=name, value=value, text=text)


def _config_change(ev: Evaluation, key: str, value: object) -> Change:
    """Where to change a store-config field: the source it really came from."""
    cfg = ev.cfg
    source = cfg.sources.get(key, "")
    env_var = {
        "device_name": "MOONCAKE_DEVICE",
        "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
        "protocol": "MOONCAKE_PROTOCOL",
    }[key]
    shown = json.dumps(value)
    if source.startswith("env:") or cfg.origin == "env":
        return _change(
            "env", env_var, value, f"export {env_var}={shlex.quote(str(value)) if value != '' else chr(34) * 2}"
        )
    if cfg.origin == "extra_config":
        return _change("config", key, value, f'set "{key}": {shown} in --hicache-storage-backend-extra-config')
    return _change("config", key, value, f'set "{key}": {shown} in the Mooncake config file {cfg.config_path}')


def _apply(sc: Scenario, change: Change) -> Scenario:
    out = sc.copy()
    if change.kind == "env":
        if change.value is None:
            out.env.pop(change.name, None)
        else:
            out.env[change.name] = str(change.value)
    elif change.kind == "flag":
        setattr(out.args, change.name, change.value)
    else:
        out.cfg_overrides[change.name] = change.value
    return out


def _device_fix(ev: Evaluation) -> tuple[list[Change], str | None]:
    """Make the store's device_name and the engine's ib device equal on every rank."""
    results = ev.ranks
    stores = [r.store_device for r in results]
    engines = [r.engine_ib_device for r in results]
    if ev.force_tcp:
        return [_config_change(ev, "device_name", "")], None
    if all(e is None for e in engines):
        # No IB flag: name the store's device(s) on the engine side, keyed by GPU id.
        if all(s == "" for s in stores):
            devs = rdma_devices()
            hca = devs[0] if devs else "mlx5_0"
            here = "this machine's first RDMA device" if devs else "an example name: use your HCA"
            changes = [
                _config_change(ev, "device_name", hca),
                _change(
                    "flag",
                    "disaggregation_ib_device",
                    hca,
                    f"add --disaggregation-ib-device {hca} to the launch flags ({here})",
                ),
            ]
            alt = (
                f'On a TCP-only deployment instead: export {FORCE_TCP_ENV}=1 (the engine\'s ib device becomes "", '
                "equal to the default device_name; never on RDMA hardware, where it forces every Mooncake transfer "
                "onto TCP)."
            )
            return changes, alt
        if len(set(stores)) == 1:
            dev = stores[0]
            return [
                _change(
                    "flag",
                    "disaggregation_ib_device",
                    dev,
                    f"add --disaggregation-ib-device {shlex.quote(str(dev))} to the launch flags",
                )
            ], None
        by_gpu = {str(r.rank.gpu_id): r.store_device for r in results}
        text = json.dumps(by_gpu, separators=(",", ":"))
        return [
            _change(
                "flag",
                "disaggregation_ib_device",
                text,
                f"add --disaggregation-ib-device '{text}' (the store's per-rank devices keyed by GPU id)",
            )
        ], None
    # The engine has devices: give the store the same ones.
    if len(set(engines)) == 1 and engines[0] is not None:
        return [_config_change(ev, "device_name", engines[0])], None
    by_rank: dict[str, object] = {}
    for r in results:
        key = str(r.rank.store_tp_rank)
        if key in by_rank and by_rank[key] != r.engine_ib_device:
            # Ranks sharing a storage tp rank (DP attention) need different devices: fix the flag instead.
            by_gpu = {str(x.rank.gpu_id): x.store_device for x in results}
            text = json.dumps(by_gpu, separators=(",", ":"))
            return [
                _change(
                    "flag",
                    "disaggregation_ib_device",
                    text,
                    f"set --disaggregation-ib-device '{text}' (keyed by GPU id)",
                )
            ], None
        by_rank[key] = r.engine_ib_device
    text = json.dumps(by_rank, separators=(",", ":"))
    return [_config_change(ev, "device_name", text)], None


def find_fix(sc: Scenario, ev: Evaluation) -> TeFix | None:
    """Changes (applied in order) after which every rank reuses the engine, verified by re-evaluation."""
    if ev.eligible:
        return None
    changes: list[Change] = []
    alternative: str | None = None
    cur_sc, cur = sc, ev
    notes: list[str] = []

    def step(new: list[Change]) -> None:
        nonlocal cur_sc, cur
        for ch in new:
            changes.append(ch)
            cur_sc = _apply(cur_sc, ch)
        cur = evaluate(cur_sc, check_metadata=False)

    if not cur.engine_exists:
        step(
            [
                _change(
                    "env",
                    REUSE_ENV,
                    None,
                    f"unset {REUSE_ENV} (or set it to true) so HiCache creates the shared engine",
                )
            ]
        )
        notes.append("with no shared engine at all, each rank's store already runs its own Transfer Engine")
    if cur.cfg.metadata_server != P2P:
        step([_config_change(cur, "metadata_server", P2P)])
    if cur.cfg.protocol != RDMA:
        tcp_deployment = cur.cfg.protocol == "tcp" and (cur.engine_protocol == "tcp" or cur.force_tcp)
        new = [_config_change(cur, "protocol", RDMA)]
        if tcp_deployment:
            if cur.engine_protocol != RDMA and new[0].name != "MOONCAKE_PROTOCOL":
                new.append(
                    _change(
                        "env",
                        "MOONCAKE_PROTOCOL",
                        None,
                        "unset MOONCAKE_PROTOCOL (the engine's protocol; MC_FORCE_TCP keeps it on TCP)",
                    )
                )
            if not cur.force_tcp:
                new.append(
                    _change(
                        "env", FORCE_TCP_ENV, "1", f"export {FORCE_TCP_ENV}=1 so every Mooncake transfer stays on TCP"
                    )
                )
            notes.append(
                'this deployment runs over TCP: protocol "rdma" with MC_FORCE_TCP=1 keeps TCP and lets SGLang reuse '
                "the engine"
            )
        elif cur.cfg.protocol not in ("tcp",):
            notes.append(f"SGLang never reuses the engine for protocol {cur.cfg.protocol!r}")
        step(new)
    if not all(r.store_device == r.engine_ib_device for r in cur.ranks):
        new, alternative = _device_fix(cur)
        step(new)
    verified = cur.eligible
    summary = "; ".join(c.text for c in changes)
    return TeFix(
        summary=summary,
        changes=changes,
        alternative=alternative,
        verified=verified,
        matters=MATTERS + (" " + "; ".join(notes) + "." if notes else ""),
    )
