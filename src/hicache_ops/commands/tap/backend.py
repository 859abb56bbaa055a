"""The code that runs inside SGLang: `MooncakeTap`, SGLang's own MooncakeStore behind a recorder.

SGLang's dynamic-backend contract (sglang/srt/mem_cache/storage/backend_factory.py, 0.5.14 and
0.5.23 alike): the extra-config names `backend_name`, `module_path` and `class_name`; the class
must subclass HiCacheStorage; it is built as
`cls(storage_config, kwargs)` -- the host pool is NOT passed to the constructor but through
`register_mem_pool_host()` right after -- and the controller uses the zero-copy
`batch_get_v1`/`batch_set_v1` only when the extra-config has a truthy `interface_v1` (otherwise it
calls the deprecated `batch_get`/`batch_set`, which MooncakeStore does not serve).

The tap builds `MooncakeStore(storage_config, None)` with the very same storage_config (so the same
extra-config keys, model-name prefix, rank suffixes and config resolution apply), hands every call to
it unchanged and returns its result unchanged, appending one line per call to the recording
(`recording`). Recording never raises into SGLang: a failure is logged once and the call still
returns. The class subclasses SGLang's HiCacheStorage, so it is built on first use (`build_class`,
called by `hicache_ops.commands.tap.__getattr__`): importing this module imports nothing heavy.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from hicache_ops.commands.tap.recording import (
    OBJECTS_KEY,
    RECORD_VERSION,
    ClientSpy,
    Recorder,
    current_call,
    describe_call,
    describe_result,
    object_bytes,
    recording_path,
    to_jsonable,
    truthy,
)

logger = logging.getLogger(__name__)

# What SGLang's dynamic-backend factory is told to load.
MODULE_PATH = "hicache_ops.commands.tap"
CLASS_NAME = "MooncakeTap"
BACKEND_NAME = "hicache_tap"


def _sglang_version() -> str | None:
    try:
        from importlib import metadata

        return metadata.version("sglang")
    except Exception:
        return None


def build_class() -> type:
    """The MooncakeTap class (imports SGLang's storage module)."""
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
            self._spy_objects = truthy(extra.get(OBJECTS_KEY), True)
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

        def _record_meta(
            self, method: str, ts: float, start: float, detail: dict | None = None, error: str | None = None
        ) -> None:
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
                    for k in (
                        "master_server_address",
                        "client_server_address",
                        "metadata_server",
                        "protocol",
                        "device_name",
                        "global_segment_size",
                        "local_hostname",
                        "standalone_storage",
                    )
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
            previous = getattr(current_call, "record", None)
            current_call.record = rec
            start = time.perf_counter()
            try:
                result = inner_method(*args, **kwargs)
            except BaseException as exc:
                elapsed = time.perf_counter() - start
                current_call.record = previous
                self._finish(rec, method, None, elapsed, error=f"{type(exc).__name__}: {exc}")
                raise
            elapsed = time.perf_counter() - start
            current_call.record = previous
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
            self._record_meta(
                "register_mem_host_pool_v2",
                ts,
                start,
                detail={"pool": to_jsonable(host_pool_name), "class": type(host_pool).__name__},
            )
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

    MooncakeTap.__module__ = MODULE_PATH
    MooncakeTap.__qualname__ = CLASS_NAME
    return MooncakeTap
