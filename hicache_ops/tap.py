"""The tap: SGLang's own MooncakeStore behind a recorder, loaded by a real server as a dynamic backend.

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "hicache_tap",
            "module_path": "hicache_ops.tap", "class_name": "MooncakeTap", "interface_v1": 1,
            "tap_path": "/tmp/hicache-tap.jsonl", "master_server_address": "10.0.0.1:50051", ...}'

`hicache tap` prints these flags (`launch_plan` below); `hicache trace show FILE` reads the file.

SGLang's dynamic-backend contract (sglang/srt/mem_cache/storage/backend_factory.py, 0.5.14 and
0.5.23 alike): the extra-config names `backend_name`, `module_path` and `class_name`; the class must
subclass HiCacheStorage; it is built as `cls(storage_config, kwargs)` -- the host pool is NOT passed
to the constructor but through `register_mem_pool_host()` right after -- and the controller uses
the zero-copy `batch_get_v1`/`batch_set_v1` only when the extra-config has a truthy `interface_v1`
(otherwise it calls the deprecated `batch_get`/`batch_set`, which MooncakeStore does not serve).

The tap builds `MooncakeStore(storage_config, None)` with the very same storage_config (so the same
extra-config keys, model-name prefix, rank suffixes and config resolution apply), hands every call to
it unchanged and returns its result unchanged. Around each call it appends one JSON line to the
recording: method, page keys, page count, result, the Mooncake object keys with their return codes
(seen by a thin spy on the store's client, `tap_objects`), bytes moved, latency, ranks, pid, time.
Recording never raises into SGLang: a failure is logged once and the call still returns.

Importing this module pulls in nothing heavy: the class is built on first access (PEP 562), which
imports SGLang's storage module then. The recording format is documented in the README (`v` 1).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from enum import Enum
from typing import Any

from .errors import InputError

logger = logging.getLogger(__name__)

MODULE_PATH = "hicache_ops.tap"
CLASS_NAME = "MooncakeTap"
BACKEND_NAME = "hicache_tap"
PATH_KEY = "tap_path"
PATH_ENV = "HICACHE_TAP_PATH"
OBJECTS_KEY = "tap_objects"
DEFAULT_FILE = "hicache-tap.jsonl"
RECORD_VERSION = 1

# The keys the tap adds to (or overrides in) a deployment's Mooncake extra-config.
DYNAMIC_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
TAP_KEYS = DYNAMIC_KEYS + (PATH_KEY, OBJECTS_KEY)

# Storage calls: one record each. Meta calls are recorded too, with method names below.
STORAGE_METHODS = (
    "batch_exists",
    "batch_exists_v2",
    "batch_get_v1",
    "batch_set_v1",
    "batch_get_v2",
    "batch_set_v2",
    "exists",
    "get",
    "set",
    "batch_get",
    "batch_set",
    "clear",
)
META_METHODS = ("open", "register_mem_pool_host", "register_mem_host_pool_v2", "on_host_pools_registered", "close")


def default_path() -> str:
    return os.path.join(tempfile.gettempdir(), DEFAULT_FILE)


# ---------------------------------------------------------------------------------------------
# Where a rank records
# ---------------------------------------------------------------------------------------------


def rank_suffix(tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1,
                cp_rank: int = 0, cp_size: int = 1, dp_rank: int = 0) -> str:
    """"" for a single writer, else ".tp{r}" (+ ".pp{p}", ".cp{c}", ".dp{d}" where those vary)."""
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
        int(g("tp_rank", 0) or 0), int(g("tp_size", 1) or 1), int(g("pp_rank", 0) or 0), int(g("pp_size", 1) or 1),
        int(g("attn_cp_rank", 0) or 0), int(g("attn_cp_size", 1) or 1), int(g("dp_rank", 0) or 0),
    )
    return with_suffix(base_path(g("extra_config", None), env), suffix)


def _truthy(value: Any, default: bool = True) -> bool:
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
                    self.path, type(exc).__name__, exc, PATH_ENV,
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
            flags = [all(col) for col in zip(*result.values())]
        if flags is not None:
            out["ok_pages"] = sum(1 for r in flags if r)
            out["prefix_ok"] = _leading_true(list(flags))
    elif method == "exists" and isinstance(result, bool):
        out["hit_pages"] = int(result)
    return out


# ---------------------------------------------------------------------------------------------
# Object-level detail: a spy on the Mooncake client the store uses
# ---------------------------------------------------------------------------------------------

_current = threading.local()  # the record of the storage call running on this thread


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
        rec = getattr(_current, "record", None)
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
        for code, size in zip(entry.get("codes") or [], sizes):
            if code == 0:
                total += int(size)
    for entry in objects.get("get", []):
        for code in entry.get("codes") or []:
            if isinstance(code, int) and code > 0:
                total += code
    return total


# ---------------------------------------------------------------------------------------------
# The backend class (built on first access so importing this module stays light)
# ---------------------------------------------------------------------------------------------


def _sglang_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("sglang")
    except Exception:
        return None


def _build_class() -> type:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    class MooncakeTap(HiCacheStorage):
        """SGLang's MooncakeStore with every call recorded; results untouched."""

        def __init__(self, storage_config: Any = None, kwargs: Any = None):
            from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

            # The dynamic factory passes its **kwargs dict second; the built-in path a host pool.
            mem_pool = kwargs if kwargs is not None and not isinstance(kwargs, Mapping) else None
            self._storage_config = storage_config
            extra = dict(getattr(storage_config, "extra_config", None) or {})
            self._recorder = Recorder(recording_path(storage_config))
            self._spy_objects = _truthy(extra.get(OBJECTS_KEY), True)
            self._seq = itertools.count(1)
            self._page_size: int | None = None
            sc = storage_config
            self._ranks = {
                "tp_rank": getattr(sc, "tp_rank", 0),
                "tp_size": getattr(sc, "tp_size", 1),
                "pp_rank": getattr(sc, "pp_rank", 0),
                "pp_size": getattr(sc, "pp_size", 1),
                "dp_rank": getattr(sc, "dp_rank", 0),
                "cp_rank": getattr(sc, "attn_cp_rank", 0),
            }
            start = time.perf_counter()
            ts = time.time()
            try:
                inner = MooncakeStore(storage_config, mem_pool)
            except BaseException as exc:
                self._record_meta("open", ts, start, error=f"{type(exc).__name__}: {exc}")
                raise
            self._inner = inner
            if self._spy_objects and getattr(inner, "store", None) is not None:
                inner.store = ClientSpy(inner.store)
            self._record_meta("open", ts, start, detail=self._open_detail())
            logger.info("hicache tap: recording MooncakeStore calls to %s", self._recorder.path)

        # -- delegation of everything not named here (attributes, describe_l3_object_layout, ...)

        def __getattr__(self, name: str) -> Any:
            inner = self.__dict__.get("_inner")
            if inner is None:
                raise AttributeError(name)
            return getattr(inner, name)

        @property
        def inner(self) -> Any:
            """The wrapped SGLang MooncakeStore."""
            return self._inner

        @property
        def recording(self) -> str:
            return self._recorder.path

        # -- records ---------------------------------------------------------------------

        def _base(self, method: str, ts: float) -> dict:
            return {
                "v": RECORD_VERSION,
                "seq": next(self._seq),
                "ts": round(ts, 6),
                "pid": os.getpid(),
                "thread": threading.current_thread().name,
                **self._ranks,
                "method": method,
            }

        def _record_meta(self, method: str, ts: float, start: float, detail: dict | None = None,
                         error: str | None = None) -> None:
            try:
                rec = self._base(method, ts)
                if detail:
                    rec.update(detail)
                rec["latency_ms"] = round((time.perf_counter() - start) * 1e3, 3)
                rec["error"] = error
                self._recorder.write(rec)
            except Exception:
                pass

        def _open_detail(self) -> dict:
            inner, sc = self._inner, self._storage_config
            cfg = getattr(inner, "config", None)
            extra = dict(getattr(sc, "extra_config", None) or {})
            detail = {
                "tap": {"path": self._recorder.path, "objects": self._spy_objects, "record_version": RECORD_VERSION},
                "sglang_version": _sglang_version(),
                "model_name": getattr(sc, "model_name", None),
                "is_mla": bool(getattr(sc, "is_mla_model", False)),
                "key_prefix": (f"{inner.config_prefix}_" if getattr(inner, "config_prefix", None) else ""),
                "mha_suffix": to_jsonable(getattr(inner, "mha_suffix", None)),
                "mla_suffix": to_jsonable(getattr(inner, "mla_suffix", None)),
                "extra_config_keys": sorted(extra),
                "storage_config": to_jsonable(sc),
            }
            if cfg is not None:
                detail["mooncake"] = {
                    k: to_jsonable(getattr(cfg, k, None))
                    for k in ("master_server_address", "client_server_address", "metadata_server", "protocol",
                              "device_name", "global_segment_size", "local_hostname", "standalone_storage")
                }
            return detail

        def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
            inner_method = getattr(self._inner, method)
            try:
                ts = time.time()
                rec = self._base(method, ts)
                rec.update(describe_call(method, args, kwargs, self._page_size))
            except Exception:
                rec = None
            previous = getattr(_current, "record", None)
            _current.record = rec
            start = time.perf_counter()
            try:
                result = inner_method(*args, **kwargs)
            except BaseException as exc:
                elapsed = time.perf_counter() - start
                _current.record = previous
                self._finish(rec, method, None, elapsed, error=f"{type(exc).__name__}: {exc}")
                raise
            elapsed = time.perf_counter() - start
            _current.record = previous
            self._finish(rec, method, result, elapsed)
            return result

        def _finish(self, rec: dict | None, method: str, result: Any, elapsed: float, error: str | None = None) -> None:
            if rec is None:
                return
            try:
                if error is None:
                    rec.update(describe_result(method, result, rec))
                else:
                    rec["result"] = None
                rec["bytes"] = object_bytes(rec.get("objects", {}))
                rec["latency_ms"] = round(elapsed * 1e3, 3)
                rec["error"] = error
                self._recorder.write(rec)
            except Exception:
                pass

        # -- registration (recorded as meta lines) ----------------------------------------

        def register_mem_pool_host(self, mem_pool_host: Any) -> Any:
            ts, start = time.time(), time.perf_counter()
            try:
                result = self._inner.register_mem_pool_host(mem_pool_host)
            except BaseException as exc:
                self._record_meta("register_mem_pool_host", ts, start, error=f"{type(exc).__name__}: {exc}")
                raise
            detail: dict[str, Any] = {}
            try:
                self._page_size = int(getattr(mem_pool_host, "page_size", 0) or 0) or None
                buf = getattr(mem_pool_host, "kv_buffer", None)
                detail["host_pool"] = {
                    "class": type(mem_pool_host).__name__,
                    "layout": getattr(mem_pool_host, "layout", None),
                    "page_size": self._page_size,
                    "size_tokens": to_jsonable(getattr(mem_pool_host, "size", None)),
                    "dtype": str(getattr(mem_pool_host, "dtype", None)),
                    "kv_buffer_shape": list(buf.shape) if buf is not None else None,
                    "kv_buffer_bytes": int(buf.numel() * buf.element_size()) if buf is not None else None,
                }
            except Exception:
                pass
            self._record_meta("register_mem_pool_host", ts, start, detail=detail)
            return result

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> Any:
            ts, start = time.time(), time.perf_counter()
            try:
                result = self._inner.register_mem_host_pool_v2(host_pool, host_pool_name)
            except BaseException as exc:
                self._record_meta("register_mem_host_pool_v2", ts, start, error=f"{type(exc).__name__}: {exc}")
                raise
            self._record_meta("register_mem_host_pool_v2", ts, start,
                              detail={"pool": to_jsonable(host_pool_name), "class": type(host_pool).__name__})
            return result

        def on_host_pools_registered(self) -> Any:
            hook = getattr(self._inner, "on_host_pools_registered", None)
            result = hook() if hook is not None else None
            self._record_meta("on_host_pools_registered", time.time(), time.perf_counter())
            return result

        def close(self) -> Any:
            try:
                return self._inner.close()
            finally:
                self._record_meta("close", time.time(), time.perf_counter())
                self._recorder.close()

        def get_stats(self) -> Any:  # polled for metrics: delegated, not recorded
            return self._inner.get_stats()

        # -- storage calls (recorded) -------------------------------------------------------

        def batch_exists(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_exists", args, kwargs)

        def batch_exists_v2(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_exists_v2", args, kwargs)

        def batch_get_v1(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_get_v1", args, kwargs)

        def batch_set_v1(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_set_v1", args, kwargs)

        def batch_get_v2(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_get_v2", args, kwargs)

        def batch_set_v2(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_set_v2", args, kwargs)

        def exists(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("exists", args, kwargs)

        def get(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("get", args, kwargs)

        def set(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("set", args, kwargs)

        def batch_get(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_get", args, kwargs)

        def batch_set(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("batch_set", args, kwargs)

        def clear(self, *args: Any, **kwargs: Any) -> Any:
            return self._call("clear", args, kwargs)

    MooncakeTap.__module__ = __name__
    MooncakeTap.__qualname__ = CLASS_NAME
    return MooncakeTap


_class_lock = threading.Lock()


def __getattr__(name: str) -> Any:  # PEP 562: `getattr(module, "MooncakeTap")` as SGLang's loader does
    if name == CLASS_NAME:
        with _class_lock:
            cls = globals().get(CLASS_NAME)
            if cls is None:
                cls = _build_class()
                globals()[CLASS_NAME] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# `hicache tap`: the launch flags for a deployment
# ---------------------------------------------------------------------------------------------


def parse_extra_config(text: str | None) -> dict:
    """The user's current --hicache-storage-backend-extra-config: JSON text, or @file.json like SGLang."""
    if text is None or not text.strip():
        return {}
    source = "--extra-config"
    body = text
    if text.startswith("@"):
        path = text[1:]
        if not path.lower().endswith(".json"):
            raise InputError(
                f"--extra-config {text!r}: only JSON files are read here.",
                hint="Pass the JSON text itself, or @FILE.json.",
            )
        try:
            with open(path, encoding="utf-8") as f:
                body = f.read()
        except OSError as exc:
            raise InputError(f"cannot read the extra-config file {path!r}: {exc.strerror}.",
                             hint="Check the path after '@'.") from None
        source = path
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise InputError(f"{source} is not valid JSON ({exc}).",
                         hint="Quote it for the shell: --extra-config '{\"master_server_address\": \"HOST:PORT\"}'.") from None
    if not isinstance(data, dict):
        raise InputError(f"{source} must be a JSON object, got {type(data).__name__}.",
                         hint="Pass the same object as --hicache-storage-backend-extra-config.")
    return data


def launch_plan(
    extra_config: Mapping | None = None,
    *,
    path: str | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    objects: bool = True,
) -> dict:
    """The SGLang flags that load the tap, the merged extra-config and where each rank records."""
    import shlex

    if tp_size < 1 or pp_size < 1:
        raise InputError(f"--tp-size {tp_size} and --pp-size {pp_size} must be >= 1.")
    user = dict(extra_config or {})
    if _truthy(user.get("standalone_storage"), False):
        raise InputError(
            "the tap cannot wrap a standalone_storage Mooncake client: SGLang gives the Mooncake host "
            "allocator only to --hicache-storage-backend mooncake, and MooncakeStore refuses any other.",
            hint="Record with standalone_storage false (an embedded client per rank), or drop the tap.",
        )
    tap = {
        "backend_name": BACKEND_NAME,
        "module_path": MODULE_PATH,
        "class_name": CLASS_NAME,
        "interface_v1": 1,
        PATH_KEY: os.path.abspath(os.path.expanduser(path)) if path else default_path(),
    }
    if not objects:
        tap[OBJECTS_KEY] = False
    replaced = sorted(k for k in tap if k in user and user[k] != tap[k])
    kept = [k for k in user if k not in tap]
    merged = {**tap, **{k: user[k] for k in kept}}
    config_json = json.dumps(merged)
    flags = [
        "--enable-hierarchical-cache",
        "--hicache-storage-backend", "dynamic",
        "--hicache-storage-backend-extra-config", config_json,
    ]
    base = tap[PATH_KEY]
    files = []
    for pp in range(pp_size):
        for tp in range(tp_size):
            files.append(with_suffix(base, rank_suffix(tp, tp_size, pp, pp_size)))
    notes = [
        "interface_v1 is required: without it SGLang's controller calls the deprecated batch_get/batch_set, "
        "which MooncakeStore does not serve.",
        "keep --hicache-mem-layout page_first (the default) or page_first_direct: SGLang rewrites layer_first "
        "only for --hicache-storage-backend mooncake, and MooncakeStore rejects an MHA layer_first pool.",
        "the server's Python must import hicache_ops (install hicache-ops in the server's environment).",
        "under the tap SGLang does not reuse a shared Transfer Engine (it creates one only for the built-in "
        "mooncake backend) and /get_hicache_l3_cache_layout reports Mooncake as not attached; "
        "keys, objects and bytes are unchanged.",
    ]
    if not any(user.get(k) is not None for k in ("master_server_address", "client_server_address")):
        notes.append(
            "the extra-config names no master_server_address: MooncakeStore will read the file at "
            "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH, else MOONCAKE_MASTER and the other MOONCAKE_* variables, "
            "in the server's environment."
        )
    if tp_size * pp_size > 1:
        notes.append("each rank appends to its own file (rank suffix before .jsonl); "
                     "pass them all to `hicache trace show`.")
    if replaced:
        notes.append(f"replaced from your extra-config: {', '.join(replaced)}.")
    return {
        "flags": flags,
        "command_line": " ".join(shlex.quote(f) for f in flags),
        "extra_config": merged,
        "kept_keys": kept,
        "replaced_keys": replaced,
        "tap_keys": [k for k in tap],
        "recording": {
            "path": base,
            "env": PATH_ENV,
            "per_rank": tp_size * pp_size > 1,
            "files": files,
        },
        "show": "hicache trace show " + " ".join(shlex.quote(f) for f in files),
        "notes": notes,
    }
