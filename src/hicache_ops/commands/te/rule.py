"""SGLang's shared Transfer Engine reuse rule, evaluated for every rank of one node.

    sc = Scenario("0.5.23", parse_server_args(flags, "0.5.23"), env, extra_config=None)
    ev = evaluate(sc)
    ev.eligible, [c.name for c in ev.conditions], [r.eligible for r in ev.ranks]

A rank's store passes the shared engine to Mooncake's setup() only when ALL hold
(docs/transfer-engine.md#reuse-rule):
  1. a shared engine exists (docs/transfer-engine.md#engine-creation);
  2. the store's device_name (a JSON map resolved by the rank's storage tp rank) == the engine's ib
     device (docs/transfer-engine.md#ib-device): "" when MC_FORCE_TCP is exactly "1", else
     --disaggregation-ib-device or --mooncake-ib-device (a JSON map is looked up by the rank's GPU
     id), None when neither is set. The default store device_name "" is not None;
  3. metadata_server == "P2PHANDSHAKE"; 4. protocol == "rdma".
Before evaluating, SGLang's own start-up rewrites are applied (`--disaggregation-transfer-backend
mooncake_tcp` sets MC_FORCE_TCP=1 and drops the IB flag; PD/encoder mooncake normalises the IB
device list) and the store config is resolved with `mooncake.config.resolve_store_config`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from dataclasses import dataclass, field

from hicache_ops.errors import InputError
from hicache_ops.mooncake.config import StoreConfig, check_metadata_server, resolve_store_config
from hicache_ops.sglang.launch import LaunchArgs, env_bool, normalise_ib_device, parse_ib_device
from hicache_ops.sglang.versions import V0_5_23, family

P2P = "P2PHANDSHAKE"
RDMA = "rdma"
REUSE_ENV = "SGLANG_HICACHE_MOONCAKE_REUSE_TE"
FORCE_TCP_ENV = "MC_FORCE_TCP"
IB_SYSFS = "/sys/class/infiniband"
REUSE_LOG_LINE = "Reuse initialized mooncake transfer engine"


def rdma_devices() -> list[str]:
    """RDMA devices of this machine (what SGLang's IB validation lists)."""
    try:
        return sorted(os.listdir(IB_SYSFS))
    except OSError:
        return []


def require_mooncake_store(args: LaunchArgs) -> None:
    """The rule is about the HiCache Mooncake store: refuse flags that create none."""
    if args.hicache_storage_backend is not None and args.hicache_storage_backend != "mooncake":
        raise InputError(
            f"--hicache-storage-backend is {args.hicache_storage_backend!r}: there is no Mooncake store, so no "
            "engine to reuse.",
            hint="te check is about --hicache-storage-backend mooncake.",
        )
    if not args.enable_hierarchical_cache or args.hicache_storage_backend != "mooncake":
        missing = (
            "--enable-hierarchical-cache"
            if not args.enable_hierarchical_cache
            else "--hicache-storage-backend mooncake"
        )
        raise InputError(
            f"the server args lack {missing}: SGLang creates no Mooncake store, so nothing can reuse the engine.",
            hint="Pass the deployment's full launch flags (or none, to assume HiCache with the mooncake backend).",
        )


# ---------------------------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rank:
    dp_rank: int
    pp_rank: int
    tp_rank: int
    store_tp_rank: int  # the storage config's tp_rank: attention-TP rank under DP attention
    gpu_id: int

    @property
    def label(self) -> str:
        parts = []
        if self.dp_rank:
            parts.append(f"dp{self.dp_rank}")
        if self.pp_rank:
            parts.append(f"pp{self.pp_rank}")
        parts.append(f"tp{self.tp_rank}")
        return "/".join(parts)


def node_ranks(args: LaunchArgs) -> list[Rank]:
    """Every scheduler rank of this node (--node-rank) and the GPU id SGLang gives it."""
    pp_per_node = max(args.pp_size // args.nnodes, 1)
    nnodes_per_pp = max(args.nnodes // args.pp_size, 1)
    pp_range = range(
        pp_per_node * (args.node_rank // nnodes_per_pp), pp_per_node * (args.node_rank // nnodes_per_pp + 1)
    )
    tp_per_node = max(args.tp_size // nnodes_per_pp, 1)
    tp_range = range(tp_per_node * (args.node_rank % nnodes_per_pp), tp_per_node * (args.node_rank % nnodes_per_pp + 1))
    attn_tp = args.tp_size // args.attn_dp_size // args.attn_cp_size
    dp_attention = args.attn_dp_size > 1
    # DP attention runs inside the TP group (no extra GPUs); plain DP launches dp_size replicas.
    replicas = args.dp_size if args.nnodes == 1 and not dp_attention else 1
    out = []
    for dp in range(replicas):
        offset = dp * args.tp_size * args.pp_size * args.gpu_id_step
        for pp in pp_range:
            for tp in tp_range:
                gpu = (
                    args.base_gpu_id + offset + (pp % pp_per_node) * tp_per_node + (tp % tp_per_node) * args.gpu_id_step
                )
                out.append(Rank(dp, pp, tp, tp % attn_tp if dp_attention else tp, gpu))
    return out


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class Condition:
    name: str
    ok: bool
    actual: object
    expected: object
    why: str


@dataclass
class RankResult:
    rank: Rank
    store_device: object  # str, or a non-string SGLang would pass through
    engine_ib_device: str | None
    engine_why: str
    eligible: bool


@dataclass
class Scenario:
    """One deployment to evaluate: launch args, the environment, the store config (+ overrides)."""

    version: str
    args: LaunchArgs
    env: dict[str, str]
    extra_config: dict | None
    cfg_overrides: dict = field(default_factory=dict)

    def copy(self) -> Scenario:
        return Scenario(
            self.version,
            copy.deepcopy(self.args),
            dict(self.env),
            copy.deepcopy(self.extra_config),
            dict(self.cfg_overrides),
        )


@dataclass
class Evaluation:
    cfg: StoreConfig
    engine_exists: bool
    engine_reasons: list[str]
    engine_protocol: str
    force_tcp: bool
    ranks: list[RankResult]
    conditions: list[Condition]
    warnings: list[str]

    @property
    def eligible(self) -> bool:
        return all(c.ok for c in self.conditions)


def show_value(value: object) -> str:
    """None as None, strings quoted: the two values SGLang's == tells apart."""
    return "None" if value is None else json.dumps(value)


def _source(label: str, origin: str = "env") -> str:
    """A StoreConfig source label in words."""
    if label.startswith("env-default:"):
        why = (
            "unset"
            if origin == "env"
            else f"the {'extra-config' if origin == 'extra_config' else 'config file'} omits it"
        )
        return f"the default of {label.split(':', 1)[1]} ({why})"
    if label.startswith("env-invalid:"):
        return f"the default of {label.split(':', 1)[1]} (set but invalid)"
    if label.startswith("env:"):
        return f"${label.split(':', 1)[1]}"
    if label.startswith("file:"):
        return f"the config file {label.split(':', 1)[1]}"
    if label == "extra_config":
        return "the extra-config"
    return label


def _store_device_for(cfg: StoreConfig, store_tp_rank: int, warnings: list[str]) -> str:
    name = cfg.device_name
    if name and name.strip().startswith("{"):
        try:
            table = json.loads(name)
        except ValueError:
            msg = f"device_name {name!r} starts with '{{' but is not valid JSON; SGLang warns and uses \"\"."
            if msg not in warnings:
                warnings.append(msg)
            return ""
        if isinstance(table, dict):
            value = table.get(str(store_tp_rank), "")
            if value is not None and value != "" and not isinstance(value, str):
                raise InputError(
                    f"device_name maps tp rank {store_tp_rank} to {value!r}, not a string; SGLang passes it to "
                    "Mooncake's setup(), which raises TypeError.",
                    hint='Map each rank to a device string, e.g. {"0": "mlx5_0"}.',
                )
            if value in (None, ""):
                msg = f'device_name has no entry for storage tp rank {store_tp_rank}; that rank uses "".'
                if msg not in warnings:
                    warnings.append(msg)
                return ""
            return value
    return cfg.device_for_rank(store_tp_rank)


def _raw_store_mapping(cfg: StoreConfig, extra_config: dict | None) -> dict | None:
    if cfg.origin == "extra_config":
        return extra_config
    if cfg.origin == "file" and cfg.config_path:
        try:
            with open(cfg.config_path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None
    return None


def _check_raw_types(cfg: StoreConfig, extra_config: dict | None) -> None:
    """null or non-string values SGLang would hand to Mooncake's setup() (a TypeError at start-up)."""
    raw = _raw_store_mapping(cfg, extra_config)
    if not raw:
        return
    where = "the extra-config" if cfg.origin == "extra_config" else f"the Mooncake config file {cfg.config_path}"
    for key in ("device_name", "metadata_server", "protocol", "local_hostname"):
        if key in raw and not isinstance(raw[key], str):
            if key == "local_hostname" and family(cfg.sglang_version) == V0_5_23 and raw[key] is None:
                continue  # 0.5.23 falls back to "localhost" when it is null
            raise InputError(
                f"{key} is {json.dumps(raw[key])} in {where}; SGLang passes it to Mooncake's setup(), which raises "
                "TypeError at start-up.",
                hint=f'Give {key} as a string (device_name "" for none).',
            )


def evaluate(sc: Scenario, *, check_metadata: bool = True) -> Evaluation:
    version = sc.version
    args = sc.args
    env = dict(sc.env)
    warnings: list[str] = []

    # SGLang's own rewrites at start-up.
    disagg_backend = args.disaggregation_transfer_backend
    disagg_ib = args.disaggregation_ib_device
    mooncake_ib = args.mooncake_ib_device
    if disagg_backend == "mooncake_tcp":
        env.setdefault(FORCE_TCP_ENV, "1")
        disagg_backend = "mooncake"
        disagg_ib = None
    pd_mooncake = disagg_backend == "mooncake" and args.disaggregation_mode in ("prefill", "decode")
    if pd_mooncake or args.encoder_transfer_backend == "mooncake":
        disagg_ib = normalise_ib_device(disagg_ib, flag="--disaggregation-ib-device")
    if args.elastic_ep_backend == "mooncake":
        mooncake_ib = normalise_ib_device(mooncake_ib, flag="--mooncake-ib-device")

    cfg = resolve_store_config(version, extra_config=sc.extra_config, env=env)
    _check_raw_types(cfg, sc.extra_config)
    if sc.cfg_overrides:
        cfg = dataclasses.replace(cfg, **sc.cfg_overrides)
    warnings.extend(cfg.warnings)
    if check_metadata:
        _check_metadata_static(cfg.metadata_server)

    # 1. does a shared engine exist?
    reuse_te = env_bool(env, REUSE_ENV, True, warnings)
    reasons: list[str] = []
    if args.disaggregation_mode != "null" and disagg_backend == "mooncake":
        reasons.append(f"PD disaggregation ({args.disaggregation_mode}) transfers KV over mooncake")
    if args.enable_hierarchical_cache and args.hicache_storage_backend == "mooncake" and reuse_te:
        why = f"{REUSE_ENV}={env[REUSE_ENV]}" if REUSE_ENV in env else f"{REUSE_ENV} is unset (default true)"
        reasons.append(f"HiCache uses the mooncake backend and {why}")
    if args.encoder_only and args.encoder_transfer_backend == "mooncake":
        reasons.append("--encoder-only with --encoder-transfer-backend mooncake")
    if args.language_only and args.encoder_transfer_backend == "mooncake":
        reasons.append("--language-only with --encoder-transfer-backend mooncake")
    if args.enable_elastic_expert_backup and args.elastic_ep_backend is not None:
        reasons.append(f"elastic expert backup with --elastic-ep-backend {args.elastic_ep_backend}")
    if family(version) == V0_5_23 and args.elastic_ep_backend == "mooncake" and not args.enable_elastic_expert_backup:
        reasons.append("--elastic-ep-backend mooncake")
    exists = bool(reasons)
    if exists:
        exists_why = "each scheduler process creates one: " + "; ".join(reasons) + "."
    else:
        parts = [f"{REUSE_ENV}={env.get(REUSE_ENV)!r} turns off the HiCache trigger"] if not reuse_te else []
        parts.append("no PD disaggregation, encoder disaggregation or elastic EP uses mooncake")
        exists_why = "SGLang creates none: " + " and ".join(parts) + "."

    # 2. the engine's ib device per rank, vs the store's device_name
    force_tcp = env.get(FORCE_TCP_ENV) == "1"
    if FORCE_TCP_ENV in env and not force_tcp:
        warnings.append(
            f'{FORCE_TCP_ENV}={env[FORCE_TCP_ENV]!r}: SGLang compares it with "1" exactly, so the engine\'s ib '
            'device is not "".'
        )
    if (
        args.disaggregation_transfer_backend == "mooncake_tcp"
        and FORCE_TCP_ENV in sc.env
        and sc.env[FORCE_TCP_ENV] != "1"
    ):
        warnings.append(
            f"--disaggregation-transfer-backend mooncake_tcp only sets {FORCE_TCP_ENV} when unset; it stays "
            f"{sc.env[FORCE_TCP_ENV]!r}."
        )
    raw_ib = disagg_ib or mooncake_ib
    ib_flag = "--disaggregation-ib-device" if disagg_ib else "--mooncake-ib-device"
    parsed_ib = None if force_tcp else parse_ib_device(raw_ib, flag=ib_flag)
    ranks = node_ranks(args)
    results: list[RankResult] = []
    for rank in ranks:
        if force_tcp:
            ib, why = (
                "",
                (
                    f"{FORCE_TCP_ENV}=1 (set by --disaggregation-transfer-backend mooncake_tcp)"
                    if FORCE_TCP_ENV not in sc.env
                    else f"{FORCE_TCP_ENV}=1"
                )
                + ': the engine passes "" (TCP, no HCA selection)',
            )
        elif parsed_ib is None:
            ib, why = (
                None,
                "no --disaggregation-ib-device or --mooncake-ib-device: SGLang keeps None (Mooncake auto-discovers)",
            )
        elif isinstance(parsed_ib, str):
            ib, why = parsed_ib, f"{ib_flag} {parsed_ib}"
        else:
            if rank.gpu_id not in parsed_ib:
                raise InputError(
                    f"{ib_flag} maps GPUs {sorted(parsed_ib)} but rank {rank.label} runs on GPU {rank.gpu_id}; "
                    "SGLang fails to start there.",
                    hint="Key the map by GPU id (after --base-gpu-id / --gpu-id-step), one entry per GPU of the node.",
                )
            ib, why = parsed_ib[rank.gpu_id], f"{ib_flag} map, GPU {rank.gpu_id}"
        device = _store_device_for(cfg, rank.store_tp_rank, warnings)
        results.append(RankResult(rank, device, ib, why, False))

    dev_ok = all(r.store_device == r.engine_ib_device for r in results)
    uniform_store = len({json.dumps(r.store_device) for r in results}) == 1
    uniform_engine = len({json.dumps(r.engine_ib_device) for r in results}) == 1
    first_bad = next((r for r in results if r.store_device != r.engine_ib_device), results[0])
    actual = results[0].store_device if uniform_store else {r.rank.label: r.store_device for r in results}
    expected = results[0].engine_ib_device if uniform_engine else {r.rank.label: r.engine_ib_device for r in results}
    src = _source(cfg.sources.get("device_name", "?"), cfg.origin)
    store_src = f"device_name from {src}" + (
        " (a JSON map by storage tp rank)" if cfg.device_name.strip().startswith("{") else ""
    )
    if dev_ok:
        dev_why = f"store {store_src} equals the engine's ib device ({first_bad.engine_why})."
    elif first_bad.store_device == "" and first_bad.engine_ib_device is None:
        dev_why = (
            f'store {store_src} is "" but the engine\'s ib device is None ({first_bad.engine_why}); '
            'SGLang compares them with ==, and "" == None is false.'
        )
    else:
        where = "" if len(results) == 1 else f"rank {first_bad.rank.label} (GPU {first_bad.rank.gpu_id}): "
        dev_why = (
            f"{where}store {store_src} is {show_value(first_bad.store_device)} but the engine's ib device is "
            f"{show_value(first_bad.engine_ib_device)} ({first_bad.engine_why})."
        )
    for r in results:
        r.eligible = (
            exists and r.store_device == r.engine_ib_device and cfg.metadata_server == P2P and cfg.protocol == RDMA
        )

    meta_src = _source(cfg.sources.get("metadata_server", "?"), cfg.origin)
    proto_src = _source(cfg.sources.get("protocol", "?"), cfg.origin)
    engine_protocol = env.get("MOONCAKE_PROTOCOL", "rdma")
    conditions = [
        Condition("shared_engine_exists", exists, exists, True, exists_why),
        Condition("device_name_matches", dev_ok, actual, expected, dev_why),
        Condition(
            "metadata_server_p2phandshake",
            cfg.metadata_server == P2P,
            cfg.metadata_server,
            P2P,
            f"metadata_server from {meta_src}; the shared engine always uses P2PHANDSHAKE, so SGLang only reuses it "
            "then.",
        ),
        Condition(
            "protocol_rdma",
            cfg.protocol == RDMA,
            cfg.protocol,
            RDMA,
            f'protocol from {proto_src}; SGLang reuses the engine only for "rdma"'
            + (
                f" (the engine itself runs MOONCAKE_PROTOCOL={engine_protocol!r}"
                + (", forced to TCP by MC_FORCE_TCP=1" if force_tcp else "")
                + ")."
                if engine_protocol != RDMA or force_tcp
                else "."
            ),
        ),
    ]
    if engine_protocol != RDMA and cfg.protocol == RDMA and exists:
        warnings.append(
            f'the shared engine runs MOONCAKE_PROTOCOL={engine_protocol!r} while the store\'s protocol is "rdma": '
            "SGLang does not compare them, so the store would use that engine as it is."
        )
    if env.get("SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS", "").lower() in ("1", "true", "yes", "y") and isinstance(
        parsed_ib, dict
    ):
        warnings.append(
            "SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS re-indexes GPU ids per process; the per-GPU ib map lookup may "
            "differ from the ids shown."
        )
    return Evaluation(cfg, exists, reasons, engine_protocol, force_tcp, results, conditions, warnings)


def _check_metadata_static(value: str) -> None:
    """Refuse what would crash Mooncake (redis://) or is certainly a typo; allow etcd/HTTP (not this rule's concern)."""
    text = (value or "").strip()
    low = text.lower()
    if not text or low.startswith(("redis://", "rediss://")) or (low == "p2phandshake" and text != P2P):
        check_metadata_server(value)  # raises InputError with the reason and the fix
