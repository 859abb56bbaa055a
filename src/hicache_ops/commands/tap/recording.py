"""The tap's recording: where each rank records, what one call looks like, and the spy on Mooncake.

    rec = Recorder(recording_path(storage_config))
    rec.write({**describe_call("batch_get_v1", args, kwargs, page_size), **describe_result(...)})

A recording is JSON Lines, one object per storage call (format `v` RECORD_VERSION, described in the
README): method, page keys, page count, result, the Mooncake object keys with their return codes
(seen by ClientSpy on the store's client), bytes moved, latency, ranks, pid, time. `trace show`
reads it back with the method groups defined here. Nothing here imports sglang, torch or mooncake.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from enum import Enum
from typing import Any

logger = logging.getLogger(__name__)

PATH_KEY = "tap_path"
PATH_ENV = "HICACHE_TAP_PATH"
OBJECTS_KEY = "tap_objects"
DEFAULT_FILE = "hicache-tap.jsonl"
RECORD_VERSION = 1

# The storage calls the tap records (one line each), grouped as `trace show` reads them.
QUERY_METHODS = ("batch_exists", "batch_exists_v2", "exists")
READ_METHODS = ("batch_get_v1", "batch_get_v2", "get", "batch_get")
WRITE_METHODS = ("batch_set_v1", "batch_set_v2", "set", "batch_set")
STORAGE_METHODS = QUERY_METHODS + READ_METHODS + WRITE_METHODS + ("clear",)
# Lines that are not storage calls: the store's construction, pool registration, close.
META_METHODS = ("open", "register_mem_pool_host", "register_mem_host_pool_v2", "on_host_pools_registered", "close")


def default_path() -> str:
    return os.path.join(tempfile.gettempdir(), DEFAULT_FILE)


# ---------------------------------------------------------------------------------------------
# Where a rank records
# ---------------------------------------------------------------------------------------------


def rank_suffix(
    tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1, cp_rank: int = 0, cp_size: int = 1, dp_rank: int = 0
) -> str:
    """ "" for a single writer, else ".tp{r}" (+ ".pp{p}", ".cp{c}", ".dp{d}" where those vary)."""
    if tp_size * pp_size * cp_size <= 1 and dp_rank == 0:
        return ""
    parts = [f"tp{tp_rank}"]
    if pp_size > 1:
        parts.append(f"pp{pp_rank}")
    if cp_size > 1:
        parts.append(f"cp{cp_rank}")
    if dp_rank:
        parts.append(f"dp{dp_rank}")
    return "." + ".".join(parts)


def with_suffix(path: str, suffix: str) -> str:
    """`/x/tap.jsonl` + `.tp1` -> `/x/tap.tp1.jsonl` (the suffix goes before a .jsonl/.json ending)."""
    if not suffix:
        return path
    for ending in (".jsonl", ".json", ".ndjson"):
        if path.endswith(ending):
            return path[: -len(ending)] + suffix + ending
    return path + suffix


def base_path(extra_config: Mapping | None, env: Mapping[str, str] | None = None) -> str:
    """The recording path before the rank suffix: extra-config `tap_path`, else $HICACHE_TAP_PATH, else tmp."""
    env = os.environ if env is None else env
    value = (extra_config or {}).get(PATH_KEY) or env.get(PATH_ENV) or default_path()
    return os.path.abspath(os.path.expanduser(str(value)))


def recording_path(storage_config: Any, env: Mapping[str, str] | None = None) -> str:
    """The file one rank appends to, from its HiCacheStorageConfig (any object with those fields)."""
    g = lambda name, default: getattr(storage_config, name, default) if storage_config is not None else default  # noqa: E731
    suffix = rank_suffix(
        int(g("tp_rank", 0) or 0),
        int(g("tp_size", 1) or 1),
        int(g("pp_rank", 0) or 0),
        int(g("pp_size", 1) or 1),
        int(g("attn_cp_rank", 0) or 0),
        int(g("attn_cp_size", 1) or 1),
        int(g("dp_rank", 0) or 0),
    )
    return with_suffix(base_path(g("extra_config", None), env), suffix)


def truthy(value: Any, default: bool = True) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)


# ---------------------------------------------------------------------------------------------
# The recorder: one write() per line, O_APPEND, never raises
# ---------------------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """JSON-safe form of SGLang/torch values found in arguments and results (best effort, no raise)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Enum):
        return to_jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": len(value)}
    tolist = getattr(value, "tolist", None)  # torch tensors, numpy arrays and scalars
    if callable(tolist):
        try:
            return to_jsonable(tolist())
        except Exception:
            pass
    fields = getattr(value, "__dataclass_fields__", None)
    if fields:
        return {name: to_jsonable(getattr(value, name, None)) for name in fields}
    return str(value)


class Recorder:
    """Appends JSON lines to one file. Safe across threads and processes; never raises.

    Each line is a single os.write() on an O_APPEND descriptor, so lines from several ranks or
    processes sharing a file never interleave. The file is opened on first use and reopened in a
    forked child. The first failure is logged (once); later lines are still attempted.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._fd_pid: int | None = None
        self._lock = threading.Lock()
        self._warned = False
        self.failures = 0
        self.lines = 0

    def _open(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._fd_pid != pid:
            parent = os.path.dirname(self.path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._fd_pid = pid
        return self._fd

    def write(self, record: Mapping) -> bool:
        try:
            data = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode("utf-8")
            with self._lock:
                fd = self._open()
                written = os.write(fd, data)
                while written < len(data):  # only on a full disk or a signal: finish the line
                    written += os.write(fd, data[written:])
                self.lines += 1
            return True
        except Exception as exc:  # never into SGLang's storage threads
            self.failures += 1
            if not self._warned:
                self._warned = True
                logger.warning(
                    "hicache tap: cannot append to the recording %s (%s: %s); storage calls go on "
                    "unrecorded. Point tap_path / %s at a writable file.",
                    self.path,
                    type(exc).__name__,
                    exc,
                    PATH_ENV,
                )
            return False

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None and self._fd_pid == os.getpid():
                try:
                    os.close(fd)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# What one call's arguments and result look like in the recording
# ---------------------------------------------------------------------------------------------

_PARAMS = {
    "batch_exists": ("keys", "extra_info"),
    "batch_exists_v2": ("keys", "pool_transfers", "extra_info"),
    "batch_get_v1": ("keys", "host_indices", "extra_info"),
    "batch_set_v1": ("keys", "host_indices", "extra_info"),
    "batch_get_v2": ("transfers", "extra_info"),
    "batch_set_v2": ("transfers", "extra_info"),
    "exists": ("key",),
    "get": ("key", "target_location", "target_sizes"),
    "set": ("key", "value", "target_location", "target_sizes"),
    "batch_get": ("keys", "target_locations", "target_sizes"),
    "batch_set": ("keys", "values", "target_locations", "target_sizes"),
    "clear": (),
}


def _arg(method: str, args: tuple, kwargs: Mapping, name: str) -> Any:
    names = _PARAMS.get(method, ())
    if name in kwargs:
        return kwargs[name]
    if name in names:
        i = names.index(name)
        if i < len(args):
            return args[i]
    return None


def _leading_true(flags: list) -> int:
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def _transfer_json(t: Any) -> dict:
    keys = list(getattr(t, "keys", None) or [])
    return {
        "name": to_jsonable(getattr(t, "name", None)),
        "pages": len(keys),
        "keys": keys,
        "hit_policy": to_jsonable(getattr(t, "hit_policy", None)),
    }


def describe_call(method: str, args: tuple, kwargs: Mapping, page_size: int | None) -> dict:
    """The argument part of a record: page keys as given, page count, host slots, prefix length."""
    rec: dict[str, Any] = {}
    keys = _arg(method, args, kwargs, "keys")
    key = _arg(method, args, kwargs, "key")
    if keys is not None:
        rec["keys"] = [str(k) for k in keys]
        rec["pages"] = len(rec["keys"])
    elif key is not None:
        rec["keys"] = [str(key)]
        rec["pages"] = 1
    transfers = _arg(method, args, kwargs, "transfers") or _arg(method, args, kwargs, "pool_transfers")
    if transfers:
        rec["transfers"] = [_transfer_json(t) for t in transfers]
        if "keys" not in rec:  # batch_get_v2/batch_set_v2: the KV pool's keys, else the first pool's
            kv = next((t for t in rec["transfers"] if t["name"] == "kv"), rec["transfers"][0])
            rec["keys"] = kv["keys"]
            rec["pages"] = kv["pages"]
    host_indices = _arg(method, args, kwargs, "host_indices")
    if host_indices is not None and page_size:
        try:
            if str(getattr(host_indices, "device", "cpu")) == "cpu":
                rec["host_pages"] = [int(i) // page_size for i in host_indices[::page_size].tolist()]
        except Exception:
            pass
    extra_info = _arg(method, args, kwargs, "extra_info")
    prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    if prefix is not None:
        rec["prefix_pages"] = len(prefix)
    return rec


def describe_result(method: str, result: Any, rec: dict) -> dict:
    """The result part: the value itself plus the derived counts `trace show` reads."""
    out: dict[str, Any] = {"result": to_jsonable(result)}
    if method == "batch_exists" and isinstance(result, int):
        out["hit_pages"] = result
    elif method == "batch_exists_v2":
        hit = getattr(result, "kv_hit_pages", None)
        if hit is not None:
            out["hit_pages"] = int(hit)
    elif method in ("batch_get_v1", "batch_set_v1") and isinstance(result, list):
        out["ok_pages"] = sum(1 for r in result if r)
        out["prefix_ok"] = _leading_true(result)
    elif method in ("batch_get_v2", "batch_set_v2") and isinstance(result, Mapping):
        flags = result.get("kv")
        if flags is None:
            for name, value in result.items():
                if to_jsonable(name) == "kv":
                    flags = value
        if flags is None and result:
            flags = [all(col) for col in zip(*result.values(), strict=False)]
        if flags is not None:
            out["ok_pages"] = sum(1 for r in flags if r)
            out["prefix_ok"] = _leading_true(list(flags))
    elif method == "exists" and isinstance(result, bool):
        out["hit_pages"] = int(result)
    return out


# ---------------------------------------------------------------------------------------------
# Object-level detail: a spy on the Mooncake client the store uses
# ---------------------------------------------------------------------------------------------

current_call = threading.local()  # the record of the storage call running on this thread


def _sizes_total(size: Any) -> int:
    if isinstance(size, (list, tuple)):
        return sum(int(s) for s in size)
    return int(size)


class ClientSpy:
    """Stands in for MooncakeDistributedStore: forwards everything, notes the batch calls' keys and codes.

    Notes go to the record of the tapped call running on the same thread (storage calls run on
    several SGLang threads at once); calls outside a tapped call (warm-up, stats) are not noted.
    """

    _NOTED = {
        "batch_is_exist": "exist",
        "batch_put_from": "put",
        "batch_put_from_multi_buffers": "put",
        "batch_upsert_from": "put",
        "batch_get_into": "get",
        "batch_get_into_multi_buffers": "get",
    }

    def __init__(self, client: Any):
        object.__setattr__(self, "_client", client)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        kind = self._NOTED.get(name)
        if kind is None or not callable(attr):
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            _note(kind, args, result)
            return result

        return noted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._client, name, value)


def _note(kind: str, args: tuple, result: Any) -> None:
    try:
        rec = getattr(current_call, "record", None)
        if rec is None:
            return
        keys = [str(k) for k in (args[0] if args else [])]
        codes = [int(c) for c in result] if isinstance(result, (list, tuple)) else to_jsonable(result)
        entry: dict[str, Any] = {"keys": keys, "codes": codes}
        if kind in ("put", "get") and len(args) >= 3:
            entry["sizes"] = [_sizes_total(s) for s in args[2]]
        rec.setdefault("objects", {}).setdefault(kind, []).append(entry)
    except Exception:  # the spy must not disturb the call
        pass


def object_bytes(objects: Mapping) -> int:
    """Bytes a call moved: sizes of puts that returned 0, plus bytes every get returned."""
    total = 0
    for entry in objects.get("put", []):
        sizes = entry.get("sizes") or []
        for code, size in zip(entry.get("codes") or [], sizes, strict=False):
            if code == 0:
                total += int(size)
    for entry in objects.get("get", []):
        for code in entry.get("codes") or []:
            if isinstance(code, int) and code > 0:
                total += code
    return total
