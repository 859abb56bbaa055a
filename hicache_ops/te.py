"""Will SGLang's Mooncake store reuse the shared Transfer Engine? (FACTS §6)

    report = check_reuse("0.5.23", server_args="--enable-hierarchical-cache --hicache-storage-backend mooncake",
                         env={"MOONCAKE_MASTER": "10.0.0.1:50051"})
    report.eligible, [c.name for c in report.conditions], report.fix

A rank's store passes the shared engine to Mooncake's setup() only when ALL hold:
  1. a shared engine exists: each scheduler process creates one when PD disaggregation uses mooncake,
     HiCache uses the mooncake backend and SGLANG_HICACHE_MOONCAKE_REUSE_TE is true (default),
     encoder/language-only serving transfers over mooncake, elastic-EP expert backup is on, or
     (0.5.23) the elastic-EP backend is mooncake;
  2. the store's device_name (a JSON map resolved by the rank's storage tp rank) == the engine's ib
     device: "" when MC_FORCE_TCP is exactly "1", else --disaggregation-ib-device or
     --mooncake-ib-device (a JSON map is looked up by the rank's GPU id), None when neither is set.
     The default store device_name "" is not None: without an IB flag the default is not reused;
  3. metadata_server == "P2PHANDSHAKE"; 4. protocol == "rdma".
Reuse is an optimisation: without it the store starts a Transfer Engine of its own and stays correct.

`check_reuse` parses SGLang launch flags the way SGLang's argparse does (only the flags this rule
reads), applies SGLang's own rewrites (`--disaggregation-transfer-backend mooncake_tcp` sets
MC_FORCE_TCP=1 and drops the IB flag; PD/encoder mooncake normalises the IB device list), resolves
the store config with `mooncake.config.resolve_store_config`, evaluates every rank on this node
and, when not reused, finds the smallest change that makes every rank reuse it (verified by
evaluating the changed deployment again).

`live_check` proves a transfer works with the engine passed in: a child process initialises a
`mooncake.engine.TransferEngine` and a store client with `engine=te.get_engine()` (mounting a small
segment, as a rank does) against a real master on loopback; this process reads the child's object
and writes one into its segment, so bytes cross the shared engine in both directions.
Nothing here imports mooncake, torch or sglang at module level.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CheckFailed, InputError, UnreachableError
from .mooncake.config import CONFIG_PATH_ENV, StoreConfig, check_metadata_server, resolve_store_config
from .sglang.versions import V0_5_14, V0_5_23, validate_version

P2P = "P2PHANDSHAKE"
RDMA = "rdma"
REUSE_ENV = "SGLANG_HICACHE_MOONCAKE_REUSE_TE"
FORCE_TCP_ENV = "MC_FORCE_TCP"
IB_SYSFS = "/sys/class/infiniband"
REUSE_LOG_LINE = "Reuse initialized mooncake transfer engine"

MATTERS = (
    "Reuse is an optimisation, not a correctness issue: without it each rank's store client starts a "
    "second Transfer Engine of its own (another listener port and handshake, and on RDMA its own "
    "NIC resources and memory registrations); the KV it stores and loads is the same, and SGLang logs "
    f"nothing either way except \"{REUSE_LOG_LINE}\" on success."
)

# ---------------------------------------------------------------------------------------------
# SGLang launch flags (only those the reuse rule reads)
# ---------------------------------------------------------------------------------------------

_BOOL, _STR, _INT = "bool", "str", "int"

# flag -> (field, kind, versions that accept it (None: both))
_FLAGS: dict[str, tuple[str, str, frozenset | None]] = {
    "--enable-hierarchical-cache": ("enable_hierarchical_cache", _BOOL, None),
    "--enable-hicache": ("enable_hierarchical_cache", _BOOL, frozenset({V0_5_23})),
    "--hicache-storage-backend": ("hicache_storage_backend", _STR, None),
    "--hicache-storage-backend-extra-config": ("hicache_storage_backend_extra_config", _STR, None),
    "--disaggregation-mode": ("disaggregation_mode", _STR, None),
    "--disaggregation-transfer-backend": ("disaggregation_transfer_backend", _STR, None),
    "--disaggregation-ib-device": ("disaggregation_ib_device", _STR, None),
    "--mooncake-ib-device": ("mooncake_ib_device", _STR, None),
    "--encoder-only": ("encoder_only", _BOOL, None),
    "--language-only": ("language_only", _BOOL, None),
    "--encoder-transfer-backend": ("encoder_transfer_backend", _STR, None),
    "--elastic-ep-backend": ("elastic_ep_backend", _STR, None),
    "--enable-elastic-expert-backup": ("enable_elastic_expert_backup", _BOOL, None),
    "--tp-size": ("tp_size", _INT, None),
    "--tensor-parallel-size": ("tp_size", _INT, None),
    "--pp-size": ("pp_size", _INT, None),
    "--pipeline-parallel-size": ("pp_size", _INT, None),
    "--dp-size": ("dp_size", _INT, None),
    "--data-parallel-size": ("dp_size", _INT, None),
    "--attn-dp-size": ("attn_dp_size", _INT, frozenset({V0_5_23})),
    "--attention-data-parallel-size": ("attn_dp_size", _INT, frozenset({V0_5_23})),
    "--attn-cp-size": ("attn_cp_size", _INT, None),
    "--attention-context-parallel-size": ("attn_cp_size", _INT, None),
    "--enable-dp-attention": ("enable_dp_attention", _BOOL, None),
    "--base-gpu-id": ("base_gpu_id", _INT, None),
    "--gpu-id-step": ("gpu_id_step", _INT, None),
    "--nnodes": ("nnodes", _INT, None),
    "--node-rank": ("node_rank", _INT, None),
}
_DISAGG_MODES = ("null", "prefill", "decode")
_ELASTIC_EP = ("mooncake", "nixl")
_ENCODER_BACKENDS = {
    V0_5_14: ("zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
    V0_5_23: ("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
}


@dataclass
class LaunchArgs:
    """The SGLang server args the reuse rule reads, with SGLang's defaults."""

    enable_hierarchical_cache: bool = False
    hicache_storage_backend: str | None = None
    hicache_storage_backend_extra_config: str | None = None
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_ib_device: str | None = None
    mooncake_ib_device: str | None = None
    encoder_only: bool = False
    language_only: bool = False
    encoder_transfer_backend: str | None = None  # version default filled in by parse_server_args
    elastic_ep_backend: str | None = None
    enable_elastic_expert_backup: bool = False
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1
    attn_cp_size: int = 1
    enable_dp_attention: bool = False
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    nnodes: int = 1
    node_rank: int = 0
    given: list[str] = field(default_factory=list)  # flags present on the command line, in order
    assumed: bool = False  # no server args given: HiCache + mooncake assumed

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        return out


def _read_server_args_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"the server-args file {path!r} does not exist.", hint="Pass the flags inline or fix the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the server-args file {path!r}: {exc}.") from None
    stripped = text.strip()
    if stripped.startswith("["):  # a JSON list of arguments (container specs hold them like this)
        try:
            items = json.loads(stripped)
        except ValueError as exc:
            raise InputError(f"the server-args file {path!r} starts like a JSON list but is not valid JSON: {exc}.") from None
        if not isinstance(items, list) or not all(isinstance(i, (str, int, float)) for i in items):
            raise InputError(f"the server-args file {path!r} must hold a JSON list of strings.")
        return shlex.join(str(i) for i in items)
    return text


def split_server_args(text: str, *, comments: bool = False) -> list[str]:
    """The argv a shell would pass: quotes, backslash-newline continuations, # comments (files)."""
    if not isinstance(text, str):
        raise InputError("--server-args must be a string of SGLang launch flags.")
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        lexer = shlex.shlex(body, posix=True, punctuation_chars=False)
        lexer.whitespace_split = True
        lexer.commenters = "#" if comments else ""
        return list(lexer)
    except ValueError as exc:
        raise InputError(
            f"the server args are not valid shell words ({exc}).",
            hint="Check the quoting, e.g. --hicache-storage-backend-extra-config '{\"device_name\": \"mlx5_0\"}'.",
        ) from None


def parse_server_args(text: str | None, version: str) -> LaunchArgs:
    """Parse SGLang launch flags (a string, or "@FILE" / an existing file path holding them).

    Flags the reuse rule does not read are skipped with their values; a program prefix such as
    `python -m sglang.launch_server` is skipped too. The last occurrence of a flag wins, as with
    argparse. Raises InputError for bad quoting, a missing or malformed value, or a flag this
    SGLang version does not have.
    """
    validate_version(version)
    args = LaunchArgs(encoder_transfer_backend=_ENCODER_BACKENDS[version][0])
    if text is None:
        args.enable_hierarchical_cache = True
        args.hicache_storage_backend = "mooncake"
        args.assumed = True
        return args
    source = "--server-args"
    from_file = False
    if text.startswith("@"):
        source, from_file = text[1:], True
        text = _read_server_args_file(text[1:])
    elif text.strip() and not text.lstrip().startswith("-") and "\n" not in text and os.path.isfile(text.strip()):
        source, from_file = text.strip(), True
        text = _read_server_args_file(text.strip())
    argv = split_server_args(text, comments=from_file)
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            continue  # the program and its module, or the value of a flag we skip
        name, eq, inline = token.partition("=")
        spec = _FLAGS.get(name)
        if spec is None:
            continue
        fname, kind, versions = spec
        if versions is not None and version not in versions:
            other = "--enable-hierarchical-cache" if fname == "enable_hierarchical_cache" else None
            raise InputError(
                f"SGLang {version} has no {name} flag (it would refuse to start).",
                hint=f"Use {other}." if other else f"Remove {name}, or check --sglang-version.",
            )
        if kind == _BOOL:
            if eq:
                raise InputError(f"{name} takes no value (got {token!r}).", hint=f"Write {name} alone.")
            setattr(args, fname, True)
            args.given.append(name)
            continue
        if eq:
            value = inline
        else:
            if i >= len(argv) or (argv[i].startswith("--") and len(argv[i]) > 2):
                raise InputError(f"{name} in {source} has no value.", hint=f"Write {name} VALUE.")
            value = argv[i]
            i += 1
        if kind == _INT:
            try:
                value = int(value)
            except ValueError:
                raise InputError(f"{name} {value!r} is not an integer.") from None
        setattr(args, fname, value)
        args.given.append(name)
    _validate_args(args, version)
    return args


def _validate_args(args: LaunchArgs, version: str) -> None:
    """What SGLang itself rejects at start-up, plus deployments with no store to reuse anything."""
    if args.disaggregation_mode not in _DISAGG_MODES:
        raise InputError(
            f"--disaggregation-mode {args.disaggregation_mode!r} is not one of {', '.join(_DISAGG_MODES)}."
        )
    if args.elastic_ep_backend is not None and args.elastic_ep_backend.lower() == "none":
        args.elastic_ep_backend = None
    if args.elastic_ep_backend is not None and args.elastic_ep_backend not in _ELASTIC_EP:
        raise InputError(f"--elastic-ep-backend {args.elastic_ep_backend!r} is not one of mooncake, nixl.")
    if args.encoder_transfer_backend not in _ENCODER_BACKENDS[version]:
        raise InputError(
            f"--encoder-transfer-backend {args.encoder_transfer_backend!r} is not one of "
            f"{', '.join(_ENCODER_BACKENDS[version])} in SGLang {version}."
        )
    for name in ("tp_size", "pp_size", "dp_size", "attn_dp_size", "attn_cp_size", "gpu_id_step", "nnodes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1.")
    if args.base_gpu_id < 0 or not 0 <= args.node_rank < args.nnodes:
        raise InputError(
            f"--base-gpu-id {args.base_gpu_id} / --node-rank {args.node_rank} out of range for --nnodes {args.nnodes}."
        )
    if args.encoder_only and args.language_only:
        raise InputError("--encoder-only and --language-only contradict each other (SGLang refuses both).")
    if args.encoder_only and args.disaggregation_mode != "null":
        raise InputError(
            f"--encoder-only contradicts --disaggregation-mode {args.disaggregation_mode} (SGLang refuses both)."
        )
    if args.enable_dp_attention and version == V0_5_23 and "--attn-dp-size" not in args.given and "--attention-data-parallel-size" not in args.given:
        # 0.5.23 reads `--dp-size N --enable-dp-attention` as attn_dp_size = N, dp_size = 1.
        args.attn_dp_size, args.dp_size = args.dp_size, 1
    elif args.enable_dp_attention and version == V0_5_14:
        args.attn_dp_size = args.dp_size
    attn = args.attn_dp_size * args.attn_cp_size
    if args.tp_size % attn:
        raise InputError(
            f"--tp-size {args.tp_size} is not divisible by attention DP x CP = {attn} (SGLang refuses it)."
        )
    if args.hicache_storage_backend is not None and args.hicache_storage_backend != "mooncake":
        raise InputError(
            f"--hicache-storage-backend is {args.hicache_storage_backend!r}: there is no Mooncake store, so no engine to reuse.",
            hint="te check is about --hicache-storage-backend mooncake.",
        )
    if not args.enable_hierarchical_cache or args.hicache_storage_backend != "mooncake":
        missing = "--enable-hierarchical-cache" if not args.enable_hierarchical_cache else "--hicache-storage-backend mooncake"
        raise InputError(
            f"the server args lack {missing}: SGLang creates no Mooncake store, so nothing can reuse the engine.",
            hint="Pass the deployment's full launch flags (or none, to assume HiCache with the mooncake backend).",
        )


# ---------------------------------------------------------------------------------------------
# Extra-config and the environment
# ---------------------------------------------------------------------------------------------


def load_extra_config(text: str | None, *, where: str) -> dict | None:
    """A JSON object, or "@FILE" (.json, .toml, .yaml/.yml) as SGLang's HiCache controller reads it."""
    if text is None or text == "":
        return None
    if text.startswith("@"):
        path = text[1:]
        ext = os.path.splitext(path)[1].lower()
        try:
            if ext == ".json":
                with open(path, encoding="utf-8") as fh:
                    data = json.load(fh)
            elif ext == ".toml":
                import tomllib

                with open(path, "rb") as fh:
                    data = tomllib.load(fh)
            elif ext in (".yaml", ".yml"):
                try:
                    import yaml
                except ImportError:
                    raise InputError(f"{where} names a YAML file but PyYAML is not installed here.",
                                     hint="Convert it to JSON, or pip install pyyaml.") from None
                with open(path, encoding="utf-8") as fh:
                    data = yaml.safe_load(fh)
            else:
                raise InputError(f"{where} file {path!r} has extension {ext or '(none)'!r}; SGLang reads .json, .toml, .yaml.")
        except FileNotFoundError:
            raise InputError(f"{where} names {path!r}, which does not exist.") from None
        except InputError:
            raise
        except Exception as exc:  # json/toml/yaml decode errors differ by parser
            raise InputError(f"{where} file {path!r} is not valid: {exc}.") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc}).",
                hint='Write a JSON object, e.g. \'{"master_server_address": "10.0.0.1:50051"}\', or @FILE.',
            ) from None
    if not isinstance(data, dict):
        raise InputError(f"{where} must be a JSON object, got {type(data).__name__}.")
    return data


def parse_env_overrides(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name or any(c.isspace() for c in name):
            raise InputError(f"--env {item!r} is not NAME=VALUE.", hint="For example --env MC_FORCE_TCP=1.")
        out[name] = value
    return out


def _env_bool(env: Mapping[str, str], name: str, default: bool, warnings: list[str]) -> bool:
    """sglang.srt.environ.EnvBool: true/1/yes/y, false/0/no/n (any case); otherwise warn, default."""
    if name not in env:
        return default
    low = env[name].lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    warnings.append(f"{name}={env[name]!r} is not a boolean; SGLang warns and uses the default {default}.")
    return default


def rdma_devices() -> list[str]:
    """RDMA devices of this machine (what SGLang's IB validation lists)."""
    try:
        return sorted(os.listdir(IB_SYSFS))
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# The engine's ib device (SGLang's parse of the IB flag, by GPU id)
# ---------------------------------------------------------------------------------------------


def _parse_ib_config(raw: str | None, *, flag: str) -> str | dict[int, str] | None:
    """None/blank -> None; a device list -> it stripped; a JSON map or .json file -> {gpu_id: devices}."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if not text.endswith(".json") and not text.startswith("{"):
        return text
    if text.endswith(".json"):
        try:
            with open(text, encoding="utf-8") as fh:
                mapping = json.load(fh)
        except FileNotFoundError:
            raise InputError(
                f"{flag} names the JSON file {text!r}, which does not exist here (SGLang fails to start without it).",
                hint="Run the check where the file exists, or pass the mapping inline as JSON.",
            ) from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{flag} file {text!r} is not readable JSON ({exc}); SGLang fails to start.") from None
    else:
        try:
            mapping = json.loads(text)
        except ValueError:
            raise InputError(f"{flag} {raw!r} is not valid JSON; SGLang fails to start on it.",
                             hint='Write a map of GPU id to devices, e.g. \'{"0": "mlx5_0", "1": "mlx5_1"}\'.') from None
    if not isinstance(mapping, dict):
        raise InputError(f"{flag} must map GPU ids to device strings; SGLang fails to start on {raw!r}.")
    out: dict[int, str] = {}
    for key, value in mapping.items():
        if not str(key).isdigit() or not isinstance(value, str):
            raise InputError(
                f"{flag} maps {key!r} to {value!r}: keys must be GPU ids and values device strings (SGLang fails to start)."
            )
        out[int(key)] = value.strip()
    if not out:
        raise InputError(f"{flag} is an empty map; SGLang fails to start on it.")
    return out


def _normalise_ib_for_validation(raw: str | None, *, flag: str) -> str | None:
    """SGLang's start-up IB validation (PD/encoder over mooncake): de-duplicated, stripped lists.

    The availability check against /sys/class/infiniband happens on the deployment's machine and
    is not repeated here.
    """
    if raw is None:
        return None
    if not raw.strip():
        raise InputError(f"{flag} is empty; SGLang refuses it when mooncake transfers KV.")

    def group(value: str, context: str) -> str:
        devices = [d.strip() for d in value.split(",") if d.strip()]
        if not devices:
            raise InputError(f"{flag} has no device for {context}; SGLang refuses it.")
        return ",".join(dict.fromkeys(devices))

    parsed = _parse_ib_config(raw, flag=flag)
    if isinstance(parsed, str):
        return group(raw.strip(), "all GPUs")
    assert parsed is not None
    return json.dumps({str(k): group(v, f"GPU {k}") for k, v in parsed.items()}, separators=(",", ":"))


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
    pp_range = range(pp_per_node * (args.node_rank // nnodes_per_pp), pp_per_node * (args.node_rank // nnodes_per_pp + 1))
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
                gpu = args.base_gpu_id + offset + (pp % pp_per_node) * tp_per_node + (tp % tp_per_node) * args.gpu_id_step
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

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "actual": self.actual, "expected": self.expected, "why": self.why}


@dataclass
class RankResult:
    rank: Rank
    store_device: object  # str, or a non-string SGLang would pass through
    engine_ib_device: str | None
    engine_why: str
    eligible: bool

    def to_json(self) -> dict:
        r = self.rank
        return {
            "rank": r.label,
            "dp_rank": r.dp_rank,
            "pp_rank": r.pp_rank,
            "tp_rank": r.tp_rank,
            "store_tp_rank": r.store_tp_rank,
            "gpu_id": r.gpu_id,
            "store_device_name": self.store_device,
            "engine_ib_device": self.engine_ib_device,
            "device_match": self.store_device == self.engine_ib_device,
            "eligible": self.eligible,
        }


@dataclass
class Scenario:
    """One deployment to evaluate: launch args, the environment, the store config (+ overrides)."""

    version: str
    args: LaunchArgs
    env: dict[str, str]
    extra_config: dict | None
    cfg_overrides: dict = field(default_factory=dict)

    def copy(self) -> "Scenario":
        return Scenario(self.version, copy.deepcopy(self.args), dict(self.env), copy.deepcopy(self.extra_config), dict(self.cfg_overrides))


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


def _show(value: object) -> str:
    """None as None, strings quoted: the two values SGLang's == tells apart."""
    return "None" if value is None else json.dumps(value)


def _source(label: str, origin: str = "env") -> str:
    """A StoreConfig source label in words."""
    if label.startswith("env-default:"):
        why = "unset" if origin == "env" else f"the {'extra-config' if origin == 'extra_config' else 'config file'} omits it"
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
                    f"device_name maps tp rank {store_tp_rank} to {value!r}, not a string; SGLang passes it to Mooncake's setup(), which raises TypeError.",
                    hint='Map each rank to a device string, e.g. {"0": "mlx5_0"}.',
                )
            if value in (None, ""):
                msg = f"device_name has no entry for storage tp rank {store_tp_rank}; that rank uses \"\"."
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
            if key == "local_hostname" and cfg.sglang_version == V0_5_23 and raw[key] is None:
                continue  # 0.5.23 falls back to "localhost" when it is null
            raise InputError(
                f"{key} is {json.dumps(raw[key])} in {where}; SGLang passes it to Mooncake's setup(), which raises TypeError at start-up.",
                hint=f'Give {key} as a string (device_name "" for none).',
            )


def _evaluate(sc: Scenario, *, check_metadata: bool = True) -> Evaluation:
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
        disagg_ib = _normalise_ib_for_validation(disagg_ib, flag="--disaggregation-ib-device")
    if args.elastic_ep_backend == "mooncake":
        mooncake_ib = _normalise_ib_for_validation(mooncake_ib, flag="--mooncake-ib-device")

    cfg = resolve_store_config(version, extra_config=sc.extra_config, env=env)
    _check_raw_types(cfg, sc.extra_config)
    if sc.cfg_overrides:
        cfg = dataclasses.replace(cfg, **sc.cfg_overrides)
    warnings.extend(cfg.warnings)
    if check_metadata:
        _check_metadata_static(cfg.metadata_server)

    # 1. does a shared engine exist?
    reuse_te = _env_bool(env, REUSE_ENV, True, warnings)
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
    if version == V0_5_23 and args.elastic_ep_backend == "mooncake" and not args.enable_elastic_expert_backup:
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
            f"{FORCE_TCP_ENV}={env[FORCE_TCP_ENV]!r}: SGLang compares it with \"1\" exactly, so the engine's ib device is not \"\"."
        )
    if args.disaggregation_transfer_backend == "mooncake_tcp" and FORCE_TCP_ENV in sc.env and sc.env[FORCE_TCP_ENV] != "1":
        warnings.append(f"--disaggregation-transfer-backend mooncake_tcp only sets {FORCE_TCP_ENV} when unset; it stays {sc.env[FORCE_TCP_ENV]!r}.")
    raw_ib = disagg_ib or mooncake_ib
    ib_flag = "--disaggregation-ib-device" if disagg_ib else "--mooncake-ib-device"
    parsed_ib = None if force_tcp else _parse_ib_config(raw_ib, flag=ib_flag)
    ranks = node_ranks(args)
    results: list[RankResult] = []
    for rank in ranks:
        if force_tcp:
            ib, why = "", (
                f"{FORCE_TCP_ENV}=1 (set by --disaggregation-transfer-backend mooncake_tcp)"
                if FORCE_TCP_ENV not in sc.env
                else f"{FORCE_TCP_ENV}=1"
            ) + ": the engine passes \"\" (TCP, no HCA selection)"
        elif parsed_ib is None:
            ib, why = None, "no --disaggregation-ib-device or --mooncake-ib-device: SGLang keeps None (Mooncake auto-discovers)"
        elif isinstance(parsed_ib, str):
            ib, why = parsed_ib, f"{ib_flag} {parsed_ib}"
        else:
            if rank.gpu_id not in parsed_ib:
                raise InputError(
                    f"{ib_flag} maps GPUs {sorted(parsed_ib)} but rank {rank.label} runs on GPU {rank.gpu_id}; SGLang fails to start there.",
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
    store_src = f"device_name from {src}" + (" (a JSON map by storage tp rank)" if cfg.device_name.strip().startswith("{") else "")
    if dev_ok:
        dev_why = f"store {store_src} equals the engine's ib device ({first_bad.engine_why})."
    elif first_bad.store_device == "" and first_bad.engine_ib_device is None:
        dev_why = (
            f"store {store_src} is \"\" but the engine's ib device is None ({first_bad.engine_why}); "
            "SGLang compares them with ==, and \"\" == None is false."
        )
    else:
        where = "" if len(results) == 1 else f"rank {first_bad.rank.label} (GPU {first_bad.rank.gpu_id}): "
        dev_why = (
            f"{where}store {store_src} is {_show(first_bad.store_device)} but the engine's ib device is "
            f"{_show(first_bad.engine_ib_device)} ({first_bad.engine_why})."
        )
    for r in results:
        r.eligible = exists and r.store_device == r.engine_ib_device and cfg.metadata_server == P2P and cfg.protocol == RDMA

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
            f"metadata_server from {meta_src}; the shared engine always uses P2PHANDSHAKE, so SGLang only reuses it then.",
        ),
        Condition(
            "protocol_rdma",
            cfg.protocol == RDMA,
            cfg.protocol,
            RDMA,
            f"protocol from {proto_src}; SGLang reuses the engine only for \"rdma\""
            + (f" (the engine itself runs MOONCAKE_PROTOCOL={engine_protocol!r}"
               + (", forced to TCP by MC_FORCE_TCP=1" if force_tcp else "") + ")." if engine_protocol != RDMA or force_tcp else "."),
        ),
    ]
    if engine_protocol != RDMA and cfg.protocol == RDMA and exists:
        warnings.append(
            f"the shared engine runs MOONCAKE_PROTOCOL={engine_protocol!r} while the store's protocol is \"rdma\": "
            "SGLang does not compare them, so the store would use that engine as it is."
        )
    if env.get("SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS", "").lower() in ("1", "true", "yes", "y") and isinstance(parsed_ib, dict):
        warnings.append("SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS re-indexes GPU ids per process; the per-GPU ib map lookup may differ from the ids shown.")
    return Evaluation(cfg, exists, reasons, engine_protocol, force_tcp, results, conditions, warnings)


def _check_metadata_static(value: str) -> None:
    """Refuse what would crash Mooncake (redis://) or is certainly a typo; allow etcd/HTTP (not this rule's concern)."""
    text = (value or "").strip()
    low = text.lower()
    if not text or low.startswith(("redis://", "rediss://")) or (low == "p2phandshake" and text != P2P):
        check_metadata_server(value)  # raises InputError with the reason and the fix


# ---------------------------------------------------------------------------------------------
# The smallest change that makes every rank reuse the engine
# ---------------------------------------------------------------------------------------------


@dataclass
class Change:
    kind: str  # "env" | "flag" | "config"
    name: str
    value: object  # None: unset / remove
    text: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "value": self.value, "text": self.text}


def _config_change(ev: Evaluation, sc: Scenario, key: str, value: object) -> Change:
    """Where to change a store-config field: the source it really came from."""
    cfg = ev.cfg
    source = cfg.sources.get(key, "")
    env_var = {"device_name": "MOONCAKE_DEVICE", "metadata_server": "MOONCAKE_TE_META_DATA_SERVER", "protocol": "MOONCAKE_PROTOCOL"}[key]
    shown = json.dumps(value)
    if source.startswith("env:") or cfg.origin == "env":
        return Change("env", env_var, value, f"export {env_var}={shlex.quote(str(value)) if value != '' else chr(34) * 2}")
    if cfg.origin == "extra_config":
        return Change("config", key, value, f"set \"{key}\": {shown} in --hicache-storage-backend-extra-config")
    return Change("config", key, value, f"set \"{key}\": {shown} in the Mooncake config file {cfg.config_path}")


def _apply(sc: Scenario, ev: Evaluation, change: Change) -> Scenario:
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


def _device_fix(sc: Scenario, ev: Evaluation) -> tuple[list[Change], str | None]:
    """Make the store's device_name and the engine's ib device equal on every rank."""
    results = ev.ranks
    stores = [r.store_device for r in results]
    engines = [r.engine_ib_device for r in results]
    if ev.force_tcp:
        return [_config_change(ev, sc, "device_name", "")], None
    if all(e is None for e in engines):
        # No IB flag: name the store's device(s) on the engine side, keyed by GPU id.
        if all(s == "" for s in stores):
            devs = rdma_devices()
            hca = devs[0] if devs else "mlx5_0"
            here = "this machine's first RDMA device" if devs else "an example name: use your HCA"
            changes = [
                _config_change(ev, sc, "device_name", hca),
                Change("flag", "disaggregation_ib_device", hca, f"add --disaggregation-ib-device {hca} to the launch flags ({here})"),
            ]
            alt = (
                f"On a TCP-only deployment instead: export {FORCE_TCP_ENV}=1 (the engine's ib device becomes \"\", "
                "equal to the default device_name; never on RDMA hardware, where it forces every Mooncake transfer onto TCP)."
            )
            return changes, alt
        if len(set(stores)) == 1:
            dev = stores[0]
            return [Change("flag", "disaggregation_ib_device", dev, f"add --disaggregation-ib-device {shlex.quote(dev)} to the launch flags")], None
        by_gpu = {str(r.rank.gpu_id): r.store_device for r in results}
        text = json.dumps(by_gpu, separators=(",", ":"))
        return [Change("flag", "disaggregation_ib_device", text,
                       f"add --disaggregation-ib-device '{text}' (the store's per-rank devices keyed by GPU id)")], None
    # The engine has devices: give the store the same ones.
    if len(set(engines)) == 1 and engines[0] is not None:
        return [_config_change(ev, sc, "device_name", engines[0])], None
    by_rank: dict[str, object] = {}
    for r in results:
        key = str(r.rank.store_tp_rank)
        if key in by_rank and by_rank[key] != r.engine_ib_device:
            # Ranks sharing a storage tp rank (DP attention) need different devices: fix the flag instead.
            by_gpu = {str(x.rank.gpu_id): x.store_device for x in results}
            text = json.dumps(by_gpu, separators=(",", ":"))
            return [Change("flag", "disaggregation_ib_device", text, f"set --disaggregation-ib-device '{text}' (keyed by GPU id)")], None
        by_rank[key] = r.engine_ib_device
    text = json.dumps(by_rank, separators=(",", ":"))
    return [_config_change(ev, sc, "device_name", text)], None


def find_fix(sc: Scenario, ev: Evaluation) -> dict | None:
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
            cur_sc = _apply(cur_sc, cur, ch)
        cur = _evaluate(cur_sc, check_metadata=False)

    if not cur.engine_exists:
        step([Change("env", REUSE_ENV, None, f"unset {REUSE_ENV} (or set it to true) so HiCache creates the shared engine")])
        notes.append("with no shared engine at all, each rank's store already runs its own Transfer Engine")
    if cur.cfg.metadata_server != P2P:
        step([_config_change(cur, cur_sc, "metadata_server", P2P)])
    if cur.cfg.protocol != RDMA:
        tcp_deployment = cur.cfg.protocol == "tcp" and (cur.engine_protocol == "tcp" or cur.force_tcp)
        new = [_config_change(cur, cur_sc, "protocol", RDMA)]
        if tcp_deployment:
            if cur.engine_protocol != RDMA and new[0].name != "MOONCAKE_PROTOCOL":
                new.append(Change("env", "MOONCAKE_PROTOCOL", None, "unset MOONCAKE_PROTOCOL (the engine's protocol; MC_FORCE_TCP keeps it on TCP)"))
            if not cur.force_tcp:
                new.append(Change("env", FORCE_TCP_ENV, "1", f"export {FORCE_TCP_ENV}=1 so every Mooncake transfer stays on TCP"))
            notes.append("this deployment runs over TCP: protocol \"rdma\" with MC_FORCE_TCP=1 keeps TCP and lets SGLang reuse the engine")
        elif cur.cfg.protocol not in ("tcp",):
            notes.append(f"SGLang never reuses the engine for protocol {cur.cfg.protocol!r}")
        step(new)
    if not all(r.store_device == r.engine_ib_device for r in cur.ranks):
        new, alternative = _device_fix(cur_sc, cur)
        step(new)
    verified = cur.eligible
    summary = "; ".join(c.text for c in changes)
    return {
        "summary": summary,
        "changes": [c.to_json() for c in changes],
        "alternative": alternative,
        "verified": verified,
        "matters": MATTERS + (" " + "; ".join(notes) + "." if notes else ""),
    }


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class TeReport:
    sglang_version: str
    eligible: bool
    conditions: list[Condition]
    ranks: list[RankResult]
    fix: dict | None
    config: StoreConfig
    args: LaunchArgs
    engine_protocol: str
    engine_reasons: list[str]
    warnings: list[str]
    notes: list[str]
    live: dict | None = None

    @property
    def per_rank_differs(self) -> bool:
        return len({(json.dumps(r.store_device), json.dumps(r.engine_ib_device)) for r in self.ranks}) > 1

    def to_json(self) -> dict:
        return {
            "eligible": self.eligible,
            "verdict": "reused" if self.eligible else "not reused",
            "conditions": [c.to_json() for c in self.conditions],
            "fix": self.fix,
            "sglang_version": self.sglang_version,
            "ranks": [r.to_json() for r in self.ranks],
            "engine": {"reasons": self.engine_reasons, "protocol": self.engine_protocol},
            "store_config": {
                "origin": self.config.origin,
                "config_path": self.config.config_path,
                "metadata_server": self.config.metadata_server,
                "protocol": self.config.protocol,
                "device_name": self.config.device_name,
                "master_server_address": self.config.master_server_address,
                "sources": {k: self.config.sources.get(k) for k in ("device_name", "metadata_server", "protocol", "master_server_address")},
            },
            "server_args_assumed": self.args.assumed,
            "warnings": self.warnings,
            "notes": self.notes,
            "live": self.live,
        }


def build_scenario(
    version: str,
    *,
    server_args: str | None = None,
    extra_config: str | dict | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    env_overrides: Mapping[str, str] | None = None,
) -> Scenario:
    validate_version(version)
    args = parse_server_args(server_args, version)
    merged = dict(os.environ if env is None else env)
    merged.update(env_overrides or {})
    from_args = load_extra_config(args.hicache_storage_backend_extra_config, where="--hicache-storage-backend-extra-config")
    given = extra_config if isinstance(extra_config, dict) or extra_config is None else load_extra_config(extra_config, where="--extra-config")
    if from_args is not None and given is not None and from_args != given:
        raise InputError(
            "--extra-config and the server args' --hicache-storage-backend-extra-config differ; SGLang reads only the latter.",
            hint="Give the extra-config once.",
        )
    extra = given if given is not None else from_args
    if config_file is not None:
        current = merged.get(CONFIG_PATH_ENV)
        if current is not None and os.path.abspath(current) != os.path.abspath(config_file):
            raise InputError(
                f"--config {config_file!r} contradicts {CONFIG_PATH_ENV}={current!r}.",
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
    sc = build_scenario(version, server_args=server_args, extra_config=extra_config, config_file=config_file,
                        env=env, env_overrides=env_overrides)
    ev = _evaluate(sc)
    if tp_rank is not None:
        if not any(r.rank.tp_rank == tp_rank for r in ev.ranks):
            have = sorted({r.rank.tp_rank for r in ev.ranks})
            raise InputError(f"--tp-rank {tp_rank} is not a rank of this node (tp ranks {have[0]}..{have[-1]}).")
        keep = [r for r in ev.ranks if r.rank.tp_rank == tp_rank]
        ev = _narrow(ev, keep)
    # A fix is for the whole deployment (a flag or a variable changes every rank).
    fix = None if ev.eligible else find_fix(sc, _evaluate(sc, check_metadata=False) if tp_rank is not None else ev)
    notes: list[str] = []
    if sc.args.assumed:
        notes.append("no server args given: assumed --enable-hierarchical-cache --hicache-storage-backend mooncake and SGLang's defaults.")
    if len(ev.ranks) > 1 and not any(isinstance(x.actual, dict) or isinstance(x.expected, dict) for x in ev.conditions):
        notes.append(f"all {len(ev.ranks)} ranks of this node resolve alike.")
    if ev.eligible:
        notes.append(f"SGLang logs \"{REUSE_LOG_LINE}\" once per rank at start-up; grep for it to confirm.")
    else:
        notes.append("SGLang logs nothing when it does not reuse the engine: the absence of "
                     f"\"{REUSE_LOG_LINE}\" is the only sign.")
    return TeReport(sc.version, ev.eligible, ev.conditions, ev.ranks, fix, ev.cfg, sc.args, ev.engine_protocol,
                    ev.engine_reasons, ev.warnings, notes)


def _narrow(ev: Evaluation, keep: list[RankResult]) -> Evaluation:
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
            cond.why if cond.ok == dev_ok else (
                f"rank {one.rank.label}: store device_name {_show(one.store_device)} vs engine ib device "
                f"{_show(one.engine_ib_device)} ({one.engine_why})."
            ),
        ),
        *ev.conditions[2:],
    ]
    return out


# ---------------------------------------------------------------------------------------------
# --live: a transfer through a store client that uses the shared engine
# ---------------------------------------------------------------------------------------------

LIVE_SEGMENT = 32 << 20
LIVE_OBJECT = 1 << 20
_LINE = "HICACHE_TE "


def live_check(
    report: TeReport,
    *,
    master: str | None = None,
    tcp: bool = False,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    tp_rank: int | None = None,
) -> dict:
    """Initialise a TransferEngine and a store client with `engine=te.get_engine()` in a child
    process, as SGLang's rank would, and move bytes through it both ways.

    `master` HOST:RPC_PORT of a running mooncake_master (UnreachableError when nothing answers);
    None starts an embedded one on loopback. `tcp` runs engine and store over TCP (the only choice
    without RDMA hardware). Returns a dict; raises CheckFailed when the transfer fails or does not
    finish within `timeout` seconds, InputError when rdma is asked for on a machine without RDMA.
    """
    from .mooncake.net import format_host_port, parse_host_port, tcp_probe

    cfg = report.config
    rank = next((r for r in report.ranks if tp_rank is None or r.rank.tp_rank == tp_rank), report.ranks[0])
    run_env = dict(os.environ if env is None else env)
    force_tcp = run_env.get(FORCE_TCP_ENV) == "1"
    engine_protocol = "tcp" if tcp else run_env.get("MOONCAKE_PROTOCOL", "rdma")
    store_protocol = "tcp" if tcp else cfg.protocol
    wants_rdma = not force_tcp and RDMA in (engine_protocol, store_protocol)
    if wants_rdma and not rdma_devices():
        raise InputError(
            f"the live test would use protocol rdma (engine {engine_protocol!r}, store {store_protocol!r}) "
            f"but this machine has no RDMA device ({IB_SYSFS} is missing or empty).",
            hint="Add --tcp to prove the same shared-engine path over TCP on loopback.",
        )
    engine_device = rank.engine_ib_device if rank.engine_ib_device is not None else ""
    store_device = rank.store_device if isinstance(rank.store_device, str) else ""
    if tcp:
        engine_device = store_device = ""
    notes: list[str] = []
    if cfg.metadata_server != P2P:
        notes.append(f"the deployment's metadata_server is {cfg.metadata_server!r}; SGLang reuses the engine only with "
                     "P2PHANDSHAKE, which the live test uses")

    embedded = None
    started = time.monotonic()
    if master is not None:
        host, port = parse_host_port(master, what="--master")
        master = format_host_port(host, port)
        tcp_probe(host, port, timeout=min(2.0, timeout), what="Mooncake master RPC service")
    else:
        from .mooncake.master import EmbeddedMaster

        embedded = EmbeddedMaster(ready_timeout=min(20.0, timeout))
        embedded.start()
        master = embedded.rpc_address
    log_dir = Path(tempfile.mkdtemp(prefix="hicache-te-live-"))
    log_path = log_dir / "child.log"
    child = None
    peer = None
    step = "start"
    key_prefix = f"hicache-te-check-{uuid.uuid4().hex[:12]}_"
    result: dict = {
        "ok": False,
        "master": master,
        "embedded_master": embedded is not None,
        "rank": rank.rank.label,
        "engine": {"protocol": engine_protocol, "device": engine_device, "metadata_server": P2P},
        "store": {"protocol": store_protocol, "device_name": store_device, "segment_bytes": LIVE_SEGMENT},
        "tcp_forced_by_flag": tcp,
        "log": str(log_path),
        "notes": notes,
    }
    if not os.environ.get("HICACHE_DEBUG"):
        os.environ.setdefault("GLOG_minloglevel", "2")  # the peer client's Mooncake INFO lines
    try:
        from .mooncake.store import StoreClient

        deadline = started + timeout
        child_env = dict(run_env)
        child_env.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        child_env.setdefault("MC_RPC_TIMEOUT_MS", "3000")
        child_env.setdefault("MC_RPC_CONNECT_TIMEOUT_MS", "2000")
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-c", "from hicache_ops.te import _live_child_main; _live_child_main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=child_env,
                close_fds=True,
            )
        params = {
            "master": master,
            "engine_protocol": engine_protocol,
            "engine_device": engine_device,
            "store_protocol": store_protocol,
            "store_device": store_device,
            "segment": LIVE_SEGMENT,
            "key": key_prefix + "from_rank",
            "size": LIVE_OBJECT,
        }
        _send(child, {"op": "start", **params})
        step = "engine and store set-up in the child"
        ready = _recv(child, deadline, step)
        if not ready.get("ok"):
            raise CheckFailed(f"the live test failed at {ready.get('step', step)}: {ready.get('error')}.",
                              hint=f"See the Mooncake log: {log_path}")
        result["engine"]["session"] = ready["engine_session"]
        result["store"]["hostname"] = ready["store_hostname"]
        result["uses_shared_engine"] = ready["store_hostname"] == ready["engine_session"]
        step = "the peer client's set-up"
        remaining = max(1.0, deadline - time.monotonic())
        peer = StoreClient.connect(master, segment_size=0, setup_timeout=min(5.0, remaining))
        transfers = []
        step = "reading the rank's object through its shared engine"
        t0 = time.monotonic()
        data = peer.get(params["key"])
        ok = hashlib.sha256(data).hexdigest() == ready["digest"]
        transfers.append({"direction": "rank segment -> peer (read served by the shared engine)", "key": params["key"],
                          "bytes": len(data), "ok": ok, "seconds": round(time.monotonic() - t0, 4)})
        step = "writing into the rank's segment through its shared engine"
        payload = os.urandom(LIVE_OBJECT)
        back_key = key_prefix + "from_peer"
        t0 = time.monotonic()
        peer.put(back_key, payload)
        _send(child, {"op": "verify", "key": back_key, "digest": hashlib.sha256(payload).hexdigest()})
        step = "the rank reading the peer's object"
        answer = _recv(child, deadline, step)
        transfers.append({"direction": "peer -> rank segment (write served by the shared engine)", "key": back_key,
                          "bytes": len(payload), "ok": bool(answer.get("ok")), "seconds": round(time.monotonic() - t0, 4)})
        result["transfers"] = transfers
        result["ok"] = all(t["ok"] for t in transfers) and result["uses_shared_engine"]
        if not result["uses_shared_engine"]:
            result["error"] = "the store client's hostname is not the engine's session: Mooncake did not use the engine passed in"
        elif not result["ok"]:
            result["error"] = answer.get("error") or "the bytes read back differ from the bytes written"
        _send(child, {"op": "close"})
        try:
            child.wait(timeout=max(2.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    except (UnreachableError, InputError):
        raise
    except CheckFailed:
        raise
    except _LiveTimeout:
        raise CheckFailed(
            f"the live test did not finish within {timeout:g} s (stuck at {step}).",
            hint=f"See the Mooncake log: {log_path}",
        ) from None
    except Exception as exc:  # a typed store error from the peer, or a broken child
        result["error"] = f"{step}: {getattr(exc, 'message', None) or exc}"
        raise CheckFailed(f"the live test failed at {step}: {getattr(exc, 'message', None) or exc}.",
                          hint=f"See the Mooncake log: {log_path}") from None
    finally:
        if peer is not None:
            try:
                peer.close()
            except Exception:
                pass
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        if embedded is not None:
            embedded.stop()
        result["seconds"] = round(time.monotonic() - started, 3)
    return result


class _LiveTimeout(Exception):
    pass


def _send(child: subprocess.Popen, message: dict) -> None:
    assert child.stdin is not None
    try:
        child.stdin.write((json.dumps(message) + "\n").encode())
        child.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def _recv(child: subprocess.Popen, deadline: float, step: str) -> dict:
    """The child's next protocol line (Mooncake may print other lines on stdout too)."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _LiveTimeout(step)
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if child.poll() is not None:
                raise CheckFailed(f"the live test's child exited with code {child.returncode} during {step}.")
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise CheckFailed(f"the live test's child exited with code {child.wait()} during {step}.")
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(_LINE):
                return json.loads(text[len(_LINE):])


def _live_child_main() -> None:  # pragma: no cover - runs in the child process
    """The rank side: shared engine, store client with engine passed in, a mounted segment."""
    out = sys.stdout

    def emit(message: dict) -> None:
        out.write(_LINE + json.dumps(message) + "\n")
        out.flush()

    params = json.loads(sys.stdin.readline())
    step = "import mooncake"
    try:
        from mooncake.engine import TransferEngine
        from mooncake.store import MooncakeDistributedStore

        step = "TransferEngine.initialize"
        te = TransferEngine()
        rc = te.initialize("127.0.0.1", P2P, params["engine_protocol"], params["engine_device"])
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc}"})
            return
        session = f"127.0.0.1:{te.get_rpc_port()}"
        step = "store setup with engine=te.get_engine()"
        store = MooncakeDistributedStore()
        rc = store.setup(session, P2P, int(params["segment"]), 16 << 20, params["store_protocol"],
                         params["store_device"], params["master"], te.get_engine())
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc} (master unreachable or parameters rejected)"})
            return
        step = "put"
        data = os.urandom(int(params["size"]))
        rc = store.put(params["key"], data)
        if rc != 0:
            emit({"ok": False, "step": step, "error": f"returned {rc}"})
            return
        emit({"ok": True, "engine_session": session, "store_hostname": str(store.get_hostname()),
              "digest": hashlib.sha256(data).hexdigest()})
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("op") == "verify":
                got = store.get(msg["key"])
                ok = bool(got) and hashlib.sha256(bytes(got)).hexdigest() == msg["digest"]
                emit({"ok": ok, "bytes": len(got), "error": None if ok else "the rank read different bytes"})
            elif msg.get("op") == "close":
                break
        store.close()
    except Exception as exc:
        emit({"ok": False, "step": step, "error": f"{type(exc).__name__}: {exc}"})
