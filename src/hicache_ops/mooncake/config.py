"""The Mooncake store config a deployment really uses, resolved the way SGLang resolves it
(docs/mooncake.md#config-resolution).

    cfg = resolve_store_config("0.5.23", extra_config={"master_server_address": "10.0.0.1:50051"})
    cfg.master_server_address, cfg.sources["protocol"]   # "rdma", "env-default:MOONCAKE_PROTOCOL"
    cfg.segment_size_per_rank(tp_size=2, pp_size=1)      # what each rank mounts
    cfg.device_for_rank(3)                               # device_name, JSON map resolved
    check_client_safe(cfg)                               # InputError for strings that crash or hang Mooncake

Order (SGLang's `MooncakeBaseStore._load_config`):
  1. the storage backend extra-config, when its master_server_address or client_server_address
     is not None;
  2. else the JSON file named by SGLANG_HICACHE_MOONCAKE_CONFIG_PATH (when that variable is set);
  3. else environment variables, which need MOONCAKE_MASTER or MOONCAKE_CLIENT.
A value missing from the extra-config or the file takes the environment variable's *default*, not
its value, except (0.5.23 only) `protocol`, which takes MOONCAKE_PROTOCOL's value, and
`local_hostname`, where MOONCAKE_LOCAL_HOSTNAME, then LOCAL_HOSTNAME, win over the file.
`extra_backend_tag` and `enable_group_semantics` always come from the extra-config.

Each field's origin is recorded in `StoreConfig.sources`:
  "extra_config", "file:<path>", "env:<NAME>", "default", "env-default:<NAME>" (the default of a
  variable that is not set) or "env-invalid:<NAME>" (set but unparsable; SGLang warns and uses
  the default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from hicache_ops.errors import InputError
from hicache_ops.mooncake.net import parse_host_port
from hicache_ops.sglang.versions import V0_5_14, family, validate_version

CONFIG_PATH_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
GIB = 1024**3
DEFAULT_TENANT_ID = "default"

# field -> (environment variable, its default, parser)  -- as in sglang/srt/environ.py
_BOOL_TRUE = ("true", "1", "yes", "y")
_BOOL_FALSE = ("false", "0", "no", "n")


class NoStoreConfig(InputError):
    """The deployment names no Mooncake master or client address anywhere SGLang looks."""


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in _BOOL_TRUE:
        return True
    if low in _BOOL_FALSE:
        return False
    raise ValueError(text)


ENV_FIELDS: dict[str, tuple[str, object, object]] = {
    "local_hostname": ("MOONCAKE_LOCAL_HOSTNAME", "localhost", str),
    "metadata_server": ("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE", str),
    "global_segment_size": ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb", str),
    "protocol": ("MOONCAKE_PROTOCOL", "rdma", str),
    "device_name": ("MOONCAKE_DEVICE", "", str),
    "master_server_address": ("MOONCAKE_MASTER", None, str),
    "master_metrics_port": ("MOONCAKE_MASTER_METRICS_PORT", 9003, int),
    "check_server": ("MOONCAKE_CHECK_SERVER", False, _parse_bool),
    "standalone_storage": ("MOONCAKE_STANDALONE_STORAGE", False, _parse_bool),
    "client_server_address": ("MOONCAKE_CLIENT", None, str),
    "enable_ssd_offload": ("MOONCAKE_ENABLE_SSD_OFFLOAD", False, _parse_bool),
    "ssd_offload_path": ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", None, str),
    "tenant_id": ("MOONCAKE_TENANT_ID", DEFAULT_TENANT_ID, str),
}


@dataclass
class StoreConfig:
    """The resolved MooncakeStoreConfig plus what SGLang reads next to it, and where each came from."""

    sglang_version: str
    origin: str  # "extra_config" | "file" | "env"
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    protocol: str
    device_name: str  # raw: a device list, or a JSON map tp_rank -> device (see device_for_rank)
    master_server_address: str | None
    master_metrics_port: int
    check_server: bool
    standalone_storage: bool
    client_server_address: str | None
    enable_ssd_offload: bool = False
    ssd_offload_path: str | None = None
    tenant_id: str | None = None  # 0.5.23 only ("default" when unset); None for 0.5.14
    extra_backend_tag: str | None = None
    enable_group_semantics: bool = False
    config_path: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def segment_size_per_rank(self, tp_size: int = 1, pp_size: int = 1) -> int:
        """Bytes each rank mounts: // tp_size in 0.5.14, // (tp_size * pp_size) in 0.5.23."""
        if tp_size < 1 or pp_size < 1:
            raise InputError(f"tp-size {tp_size} and pp-size {pp_size} must be >= 1.")
        scale = tp_size if family(self.sglang_version) == V0_5_14 else tp_size * pp_size
        return self.global_segment_size // scale

    def device_for_rank(self, tp_rank: int | None) -> str:
        """The device string a rank passes to setup().

        A device_name starting with "{" is a JSON map tp_rank -> device; SGLang looks the rank up
        (JSON keys are strings) and falls back to "" when the rank is missing or the JSON is bad.
        """
        name = self.device_name
        if not name or not name.strip().startswith("{"):
            return name
        if tp_rank is None:
            return ""
        try:
            table = json.loads(name)
            value = table.get(tp_rank, "") or table.get(str(tp_rank), "")
        except (ValueError, AttributeError):
            return ""
        return value if isinstance(value, str) else str(value)

    @property
    def master_metrics_address(self) -> str | None:
        """HOST:PORT of the master's admin HTTP API (host of master_server_address + metrics port)."""
        if not self.master_server_address:
            return None
        host, _ = parse_host_port(self.master_server_address, what="master_server_address")
        return f"{host}:{self.master_metrics_port}"


def parse_segment_size(value: object, *, where: str = "global_segment_size") -> int:
    """SGLang's global_segment_size: an int, a decimal string, or "<int>gb" (GiB); nothing else."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            if text.endswith("gb"):
                number = text[:-2].strip()
                if not number:
                    raise ValueError
                return int(number) * GIB
            return int(text)
        except ValueError:
            raise InputError(
                f"{where} {value!r} is not a size SGLang understands.",
                hint='Use a byte count (4294967296) or whole GiB with "gb" ("4gb"); SGLang knows no other unit.',
            ) from None
    try:
        if not isinstance(value, (int, float, bytes)):
            raise TypeError
        return int(value)
    except (TypeError, ValueError):
        raise InputError(f"{where} {value!r} is not a size.", hint='Use a byte count or "4gb".') from None


def _normalise_tenant(value: object) -> str:
    if value is None:
        return DEFAULT_TENANT_ID
    text = str(value).strip()
    return text or DEFAULT_TENANT_ID


class _Resolver:
    def __init__(self, version: str, env: Mapping[str, str]):
        self.version = version
        self.env = env
        self.sources: dict[str, str] = {}
        self.warnings: list[str] = []

    def env_value(self, name: str) -> object:
        """EnvField.get(): the parsed variable, else its default (with a warning when unparsable)."""
        var, default, parse = ENV_FIELDS[name]
        if var not in self.env:
            self.sources[name] = f"env-default:{var}"
            return default
        try:
            value = parse(self.env[var])  # type: ignore[operator]
        except ValueError:
            self.warnings.append(f"{var}={self.env[var]!r} is not valid; SGLang uses the default {default!r}.")
            self.sources[name] = f"env-invalid:{var}"
            return default
        self.sources[name] = f"env:{var}"
        return value

    def from_mapping(self, name: str, mapping: Mapping, label: str) -> object:
        """mapping.get(name, <env default>) as SGLang's from_file / load_from_extra_config do."""
        if name in mapping:
            self.sources[name] = label
            return mapping[name]
        var, default, _ = ENV_FIELDS[name]
        self.sources[name] = f"env-default:{var}"
        return default

    def local_hostname(self, mapping: Mapping | None, label: str) -> str:
        env = self.env
        if family(self.version) == V0_5_14:
            if mapping is not None:
                return str(self.from_mapping("local_hostname", mapping, label))
            if "MOONCAKE_LOCAL_HOSTNAME" in env:
                self.sources["local_hostname"] = "env:MOONCAKE_LOCAL_HOSTNAME"
                return env["MOONCAKE_LOCAL_HOSTNAME"]
            if "LOCAL_HOSTNAME" in env:
                self.sources["local_hostname"] = "env:LOCAL_HOSTNAME"
                return env["LOCAL_HOSTNAME"]
            self.sources["local_hostname"] = "env-default:MOONCAKE_LOCAL_HOSTNAME"
            return "localhost"
        # 0.5.23: the process environment wins over the file / extra-config.
        if "MOONCAKE_LOCAL_HOSTNAME" in env:
            self.sources["local_hostname"] = "env:MOONCAKE_LOCAL_HOSTNAME"
            return env["MOONCAKE_LOCAL_HOSTNAME"]
        if env.get("LOCAL_HOSTNAME"):
            self.sources["local_hostname"] = "env:LOCAL_HOSTNAME"
            return env["LOCAL_HOSTNAME"]
        if mapping is not None and mapping.get("local_hostname"):
            self.sources["local_hostname"] = label
            return str(mapping["local_hostname"])
        self.sources["local_hostname"] = "env-default:MOONCAKE_LOCAL_HOSTNAME"
        return "localhost"


def _load_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise InputError(
            f"{CONFIG_PATH_ENV} names {path!r}, which does not exist.",
            hint=f"Fix the path or unset {CONFIG_PATH_ENV}.",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the Mooncake config file {path!r}: {exc}.") from None
    except ValueError as exc:
        raise InputError(f"the Mooncake config file {path!r} is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise InputError(f"the Mooncake config file {path!r} holds {type(data).__name__}, not a JSON object.")
    return data


def resolve_store_config(
    version: str,
    *,
    extra_config: Mapping | None = None,
    env: Mapping[str, str] | None = None,
) -> StoreConfig:
    """Resolve the store config of one SGLang rank exactly as SGLang `version` does.

    `extra_config` is the parsed --hicache-storage-backend-extra-config (a dict or None);
    `env` defaults to os.environ. Raises InputError where SGLang would fail (no master/client
    address, unreadable file, bad global_segment_size), naming the value and the fix.
    """
    version = validate_version(version)
    env = os.environ if env is None else env
    if extra_config is not None and not isinstance(extra_config, Mapping):
        raise InputError(f"the extra-config must be a JSON object, got {type(extra_config).__name__}.")
    r = _Resolver(version, env)
    config_path: str | None = None

    mapping: Mapping | None
    if extra_config and (
        extra_config.get("master_server_address") is not None or extra_config.get("client_server_address") is not None
    ):
        origin, mapping, label = "extra_config", extra_config, "extra_config"
    elif CONFIG_PATH_ENV in env:
        config_path = env[CONFIG_PATH_ENV]
        data = _load_file(config_path)
        if "master_server_address" not in data and "client_server_address" not in data:
            raise InputError(
                f"the Mooncake config file {config_path!r} has neither master_server_address nor "
                "client_server_address.",
                hint="Add master_server_address (HOST:RPC_PORT of the mooncake_master).",
            )
        origin, mapping, label = "file", data, f"file:{config_path}"
    else:
        if "MOONCAKE_MASTER" not in env and "MOONCAKE_CLIENT" not in env:
            raise NoStoreConfig(
                "no Mooncake config: the extra-config has no master_server_address, "
                f"{CONFIG_PATH_ENV} is not set, and neither MOONCAKE_MASTER nor MOONCAKE_CLIENT is set.",
                hint="Set MOONCAKE_MASTER=HOST:RPC_PORT, or pass an extra-config with master_server_address.",
            )
        origin, mapping, label = "env", None, "env"

    values: dict[str, object] = {}
    for name in ENV_FIELDS:
        if name == "local_hostname":
            values[name] = r.local_hostname(mapping, label)
        elif mapping is None:
            values[name] = r.env_value(name)
        elif name == "protocol" and family(version) != V0_5_14 and name not in mapping:
            values[name] = r.env_value(name)  # 0.5.23 honours MOONCAKE_PROTOCOL when the file omits it
        else:
            values[name] = r.from_mapping(name, mapping, label)

    master = values["master_server_address"]
    if master is not None and str(master).strip():
        # Mooncake cannot dial a master without HOST:PORT; refused here rather than judged.
        parse_host_port(str(master), what="master_server_address" if mapping is not None else "MOONCAKE_MASTER")
    size_where = "global_segment_size" if mapping is not None else "MOONCAKE_GLOBAL_SEGMENT_SIZE"
    segment_size = parse_segment_size(values["global_segment_size"], where=size_where)
    values["global_segment_size"] = segment_size
    port = values["master_metrics_port"]
    try:
        if not isinstance(port, (int, float, str, bytes)):
            raise TypeError
        metrics_port = int(port)
    except (TypeError, ValueError):
        raise InputError(f"master_metrics_port {port!r} is not a port number.") from None
    values["master_metrics_port"] = metrics_port
    if family(version) == V0_5_14:
        values["tenant_id"] = None
        r.sources.pop("tenant_id", None)
    else:
        values["tenant_id"] = _normalise_tenant(values["tenant_id"])

    tag = None
    if extra_config:
        if family(version) == V0_5_14:
            if "extra_backend_tag" in extra_config:
                tag = extra_config["extra_backend_tag"]
        elif extra_config.get("extra_backend_tag") is not None:
            tag = str(extra_config["extra_backend_tag"])
    r.sources["extra_backend_tag"] = (
        "extra_config" if extra_config and "extra_backend_tag" in extra_config else "default"
    )
    group = bool(extra_config.get("enable_group_semantics", False)) if extra_config else False
    r.sources["enable_group_semantics"] = (
        "extra_config" if extra_config and "enable_group_semantics" in extra_config else "default"
    )

    return StoreConfig(
        sglang_version=version,
        origin=origin,
        config_path=config_path,
        local_hostname=str(values["local_hostname"]),
        metadata_server=str(values["metadata_server"]),
        global_segment_size=segment_size,
        protocol=str(values["protocol"]),
        device_name="" if values["device_name"] is None else str(values["device_name"]),
        master_server_address=None if values["master_server_address"] is None else str(values["master_server_address"]),
        master_metrics_port=metrics_port,
        check_server=bool(values["check_server"]),
        standalone_storage=bool(values["standalone_storage"]),
        client_server_address=None if values["client_server_address"] is None else str(values["client_server_address"]),
        enable_ssd_offload=bool(values["enable_ssd_offload"]),
        ssd_offload_path=None if values["ssd_offload_path"] is None else str(values["ssd_offload_path"]),
        tenant_id=values["tenant_id"],  # type: ignore[arg-type]
        extra_backend_tag=tag,
        enable_group_semantics=group,
        sources=r.sources,
        warnings=r.warnings,
    )


# ---------------------------------------------------------------------------------------------
# What Mooncake must never see
# ---------------------------------------------------------------------------------------------


def check_metadata_server(value: str) -> str:
    """Accept P2PHANDSHAKE or an http(s):// URL; refuse strings that abort or hang a Mooncake client.

    docs/mooncake.md#client-setup: "redis://..." ends the whole process (glog FATAL); "etcd://...", a bare HOST:PORT
    (read as etcd) or a misspelt P2PHANDSHAKE hangs ~10 s in setup and then fails.
    """
    text = (value or "").strip()
    if text == "P2PHANDSHAKE":
        return text
    low = text.lower()
    if low.startswith(("http://", "https://")):
        rest = text.split("://", 1)[1]
        if not rest or rest.startswith("/"):
            raise InputError(f"metadata_server {value!r} has no host.", hint="Use http://HOST:PORT/metadata.")
        return text
    if low == "p2phandshake":
        raise InputError(
            f"metadata_server {value!r} is misspelt: Mooncake matches P2PHANDSHAKE case-sensitively "
            "and reads anything else as an etcd address (a ~10 s hang, then failure).",
            hint="Write P2PHANDSHAKE in capitals.",
        )
    if low.startswith("redis://") or low.startswith("rediss://"):
        raise InputError(
            f"metadata_server {value!r} is a Redis address; this Mooncake build aborts the whole process on it.",
            hint="Use P2PHANDSHAKE (the SGLang default) or the master's HTTP metadata server (http://HOST:PORT/metadata).",
        )
    if not text:
        raise InputError("metadata_server is empty.", hint="Use P2PHANDSHAKE (the SGLang default).")
    raise InputError(
        f"metadata_server {value!r} would be read as an etcd address; with no etcd here the client hangs ~10 s and "
        "fails.",
        hint="Use P2PHANDSHAKE (the SGLang default) or http://HOST:PORT/metadata.",
    )


def check_client_safe(cfg: StoreConfig) -> None:
    """Raise InputError for anything in `cfg` that would crash or hang a Mooncake client here."""
    check_metadata_server(cfg.metadata_server)
    if not cfg.master_server_address:
        raise InputError(
            "the config has no master_server_address (only a client_server_address for standalone storage).",
            hint="Set MOONCAKE_MASTER=HOST:RPC_PORT or master_server_address.",
        )
    parse_host_port(cfg.master_server_address, what="master_server_address")
    if cfg.global_segment_size < 0:
        raise InputError(f"global_segment_size {cfg.global_segment_size} is negative.")
