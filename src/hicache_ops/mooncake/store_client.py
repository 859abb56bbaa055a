"""A Mooncake store client with bounded set-up, typed errors and prefix-scoped removal.

    client = StoreClient.connect("127.0.0.1:50051")                    # short-lived: mounts nothing
    owner = StoreClient.connect(addr, segment_size=1 << 30)            # long-lived segment owner
    owner.register_buffer(ptr, nbytes)                                 # host pool, once
    codes = owner.batch_put_from(keys, ptrs, sizes)                    # per key: 0 or a negative code
    present = client.batch_is_exist(keys)                              # per key: bool
    got = owner.batch_get_into(keys, ptrs, sizes)                      # per key: bytes read or < 0
    client.remove_prefix("Qwen-Qwen3-0.6B_")                           # never outside a prefix

Why the rules (docs/mooncake.md#segments-and-ttl, #client-setup):
- Objects live in the segment of the client that mounted them; a client that closes takes its
  objects with it. So exactly one long-lived process owns a segment (`segment_size > 0`) and
  short-lived commands mount none (`segment_size=0`, the default here).
- Mooncake's own set-up retries a wrong master for ~90 s. `connect` probes the RPC port first
  (a refused port fails at once) and runs set-up with MC_STORE_CLIENT_SETUP_RETRIES=1 and short
  MC_RPC_*_TIMEOUT_MS, so an unreachable or silent master ends in UnreachableError within
  about `setup_timeout` seconds (default 2.5). Values the caller already set in the
  environment are respected.
- Mooncake reports errors as return codes, never exceptions; here a failure of the whole call
  raises a typed error (RpcFailure when the master is gone), and per-key outcomes come back as
  Mooncake's codes so a batch can partly succeed. `raise_for_codes` turns them into errors.
- `put` on an existing key returns 0 and does NOT overwrite; `upsert=True` replaces.
- Segment full (-200) is transient (eviction is asynchronous): puts retry only the keys that
  hit it, with exponential backoff, before returning the code.

After a master death every Mooncake call costs ~4 s of reconnect attempts (and Mooncake's
health_check keeps answering 0 for a while); once one call has failed with an RPC error, the next
calls probe the master's RPC port first and fail at once while nothing listens there (clients
re-mount by themselves when the master comes back).
Closing a segment owner whose master is dead takes Mooncake ~15 s (a client without a segment:
~1 s).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hicache_ops.errors import HicacheError, InputError, UnreachableError
from hicache_ops.mooncake.config import StoreConfig, check_client_safe, check_metadata_server
from hicache_ops.mooncake.net import format_host_port, is_loopback, parse_host_port, tcp_probe

DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024  # what SGLang passes; zero-copy I/O does not use it

# Mooncake return codes (mooncake-store ErrorCode) this client tells apart.
SEGMENT_FULL = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
LEASE_HELD = -706
RPC_FAILED = -900
RPC_TIMEOUT = -901
RPC_CODES = frozenset({RPC_FAILED, RPC_TIMEOUT})

CODE_NAMES = {
    -1: "FAILED",
    SEGMENT_FULL: "SEGMENT_FULL (no space; eviction is asynchronous)",
    INVALID_PARAMS: "INVALID_PARAMS",
    OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
    LEASE_HELD: "OBJECT_HAS_LEASE (a reader holds a lease)",
    RPC_FAILED: "RPC_FAIL (master unreachable)",
    RPC_TIMEOUT: "RPC_TIMEOUT (master did not answer in time)",
}


def code_name(code: int) -> str:
    return CODE_NAMES.get(code, f"code {code}")


# ---------------------------------------------------------------------------------------------
# Typed errors
# ---------------------------------------------------------------------------------------------


class StoreError(HicacheError):
    """A Mooncake store call failed; `rc` is Mooncake's return code, `key` the object if one."""

    exit_code = 1
    code = "store_error"

    def __init__(self, message: str, hint: str | None = None, *, rc: int | None = None, key: str | None = None):
        super().__init__(message, hint)
        self.rc = rc
        self.key = key


class ObjectNotFound(StoreError):
    code = "object_not_found"


class LeaseHeld(StoreError):
    code = "lease_held"


class SegmentFull(StoreError):
    code = "segment_full"


class InvalidParams(StoreError):
    exit_code = 2
    code = "invalid_params"


class RpcFailure(UnreachableError, StoreError):
    """The master did not answer (died, restarted or unreachable): exit 3."""

    code = "unreachable"


def error_for(code: int, *, op: str, key: str | None = None, master: str = "") -> StoreError:
    """The typed error for one Mooncake return code."""
    about = f" for {key!r}" if key is not None else ""
    where = f" at {master}" if master else ""
    if code == OBJECT_NOT_FOUND:
        return ObjectNotFound(f"{op}: object{about} not found{where}.", rc=code, key=key)
    if code == LEASE_HELD:
        return LeaseHeld(
            f"{op}: object{about} is leased by a recent read and cannot be removed yet.",
            hint="Retry after the lease expires (default 5-10 s), or remove with force.",
            rc=code,
            key=key,
        )
    if code == SEGMENT_FULL:
        return SegmentFull(
            f"{op}: no space left in the mounted segments{where}{about}.",
            hint="Mount a larger segment (global_segment_size) or let eviction catch up.",
            rc=code,
            key=key,
        )
    if code == INVALID_PARAMS:
        return InvalidParams(f"{op}: Mooncake rejected the parameters{about} (INVALID_PARAMS).", rc=code, key=key)
    if code in RPC_CODES:
        return RpcFailure(
            f"{op}: the Mooncake master{where} did not answer (RPC failure).",
            hint="The master died or restarted; check it (hicache inspect store) and retry.",
            rc=code,
            key=key,
        )
    return StoreError(f"{op}{about} failed{where}: {code_name(code)}.", rc=code, key=key)


def raise_for_codes(codes: Sequence[int], keys: Sequence[str], *, op: str, master: str = "") -> None:
    """Raise the typed error of the first negative code (put: 0 is ok; get: bytes read >= 0 is ok)."""
    for key, code in zip(keys, codes, strict=True):
        if code < 0:
            raise error_for(code, op=op, key=key, master=master)


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Mooncake allocates a segment whole at set-up; one larger than this machine's memory fails
    there in a way that looks like an unreachable master, so refuse it first (InputError)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if nbytes > total:
        raise InputError(
            f"{what} needs {nbytes / 2**30:.1f} GiB, more than this machine's {total / 2**30:.1f} GiB of memory.",
            hint="Use a smaller size.",
        )


def ecma_escape(text: str) -> str:
    """Escape `text` for an ECMAScript regex (Mooncake's remove_by_regex) so it matches literally."""
    return "".join("\\" + ch if ch in "\\^$.|?*+()[]{}/" else ch for ch in text)


# ---------------------------------------------------------------------------------------------
# Set-up bounded in time
# ---------------------------------------------------------------------------------------------

_ENV_LOCK = threading.Lock()
_ABANDONED: list[Any] = []  # Mooncake clients whose close would hang (see StoreClient.abandon)


@contextmanager
def _bounded_setup_env(timeout_s: float) -> Iterator[None]:
    """Mooncake reads these at set-up; caller-set values win; restored afterwards."""
    values = {
        "MC_STORE_CLIENT_SETUP_RETRIES": "1",
        "MC_RPC_TIMEOUT_MS": str(max(200, int(timeout_s * 1000 * 0.7))),
        "MC_RPC_CONNECT_TIMEOUT_MS": str(max(200, int(timeout_s * 1000 * 0.4))),
    }
    with _ENV_LOCK:
        added = [name for name in values if name not in os.environ]
        for name in added:
            os.environ[name] = values[name]
        try:
            yield
        finally:
            for name in added:
                os.environ.pop(name, None)


class StoreClient:
    """One MooncakeDistributedStore, owned by this object. Thread-compatible, not thread-safe."""

    # store: a mooncake.store.MooncakeDistributedStore (mooncake ships no type information)
    def __init__(self, store: Any, *, master: str, segment_size: int, hostname: str, metadata_server: str):
        self._store = store
        self.master = master
        self.segment_size = segment_size
        self.hostname = hostname
        self.metadata_server = metadata_server
        self._suspect = False  # an RPC failure was seen: check health before the next call
        self._down_reason: str | None = None  # set by a watcher that saw the master die
        self._closed = False
        self._registered: dict[int, int] = {}

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        master: str,
        *,
        segment_size: int = 0,
        local_hostname: str = "127.0.0.1",
        metadata_server: str = "P2PHANDSHAKE",
        protocol: str = "tcp",
        device_name: str = "",
        local_buffer_size: int = DEFAULT_LOCAL_BUFFER_SIZE,
        setup_timeout: float = 2.5,
        tenant_id: str | None = None,
    ) -> StoreClient:
        """Set up a client of the master at `master` (HOST:RPC_PORT).

        `segment_size` bytes are mounted for objects this client puts (0: mount none; puts from a
        client without a segment land in other clients' segments). Raises InputError for a
        malformed address or a metadata string Mooncake cannot survive, UnreachableError when no
        master answers within about `setup_timeout` seconds.
        """
        host, port = parse_host_port(master, what="master address")
        master = format_host_port(host, port)
        check_metadata_server(metadata_server)
        if segment_size < 0:
            raise InputError(f"segment size {segment_size} is negative.")
        tcp_probe(host, port, timeout=min(1.0, setup_timeout), what="Mooncake master RPC service")
        if metadata_server.lower().startswith("http") and is_loopback(local_hostname):
            # Otherwise peers dial the first non-loopback address (docs/mooncake.md#client-setup).
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

        from mooncake.store import MooncakeDistributedStore

        store = MooncakeDistributedStore()
        kwargs = {} if tenant_id in (None, "default") else {"tenant_id": tenant_id}
        with _bounded_setup_env(setup_timeout):
            started = time.monotonic()
            try:
                rc = store.setup(
                    local_hostname,
                    metadata_server,
                    int(segment_size),
                    int(local_buffer_size),
                    protocol,
                    device_name,
                    master,
                    None,
                    **kwargs,
                )
            except TypeError as exc:
                raise InputError(f"this Mooncake build rejects the set-up arguments: {exc}.") from None
        if rc != 0:
            waited = time.monotonic() - started
            raise UnreachableError(
                f"Mooncake client set-up against the master at {master} failed "
                f"(code {rc} after {waited:.1f} s): the master did not answer, or rejected "
                f"protocol {protocol!r} / device {device_name!r} / segment {segment_size} bytes.",
                hint="Check the master (hicache inspect store --master HOST:METRICS_PORT) and the protocol/device.",
            )
        return cls(
            store,
            master=master,
            segment_size=int(segment_size),
            hostname=str(store.get_hostname()),
            metadata_server=metadata_server,
        )

    @classmethod
    def from_config(
        cls,
        cfg: StoreConfig,
        *,
        tp_rank: int | None = 0,
        tp_size: int = 1,
        pp_size: int = 1,
        segment_size: int | None = 0,
        setup_timeout: float = 2.5,
    ) -> StoreClient:
        """A client as SGLang's rank `tp_rank` would set it up from `cfg` (validated first).

        `segment_size=None` mounts what that rank mounts (cfg.segment_size_per_rank); the default 0
        mounts nothing, which is right for anything short-lived.
        """
        check_client_safe(cfg)
        size = cfg.segment_size_per_rank(tp_size, pp_size) if segment_size is None else segment_size
        return cls.connect(
            cfg.master_server_address or "",
            segment_size=size,
            local_hostname=cfg.local_hostname,
            metadata_server=cfg.metadata_server,
            protocol=cfg.protocol,
            device_name=cfg.device_for_rank(tp_rank),
            setup_timeout=setup_timeout,
            tenant_id=cfg.tenant_id,
        )

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def raw(self) -> Any:
        """The underlying mooncake.store.MooncakeDistributedStore (for benchmarks and cross-checks)."""
        return self._store

    def _ready(self, op: str) -> None:
        if self._closed:
            raise StoreError(f"{op}: this store client is closed.")
        if self._down_reason is not None:
            raise RpcFailure(
                f"{op}: the Mooncake master at {self.master} is down ({self._down_reason}).",
                hint="Restart the master (or the serve); clients re-mount when it answers again.",
                rc=RPC_FAILED,
            )
        if self._suspect:
            # Mooncake's health_check still says 0 right after the master died, and each call
            # spends ~4 s reconnecting: probe the RPC port ourselves (a refused port answers at once).
            host, port = parse_host_port(self.master)
            try:
                tcp_probe(host, port, timeout=0.5, what="Mooncake master RPC service")
            except UnreachableError:
                raise error_for(RPC_FAILED, op=op, master=self.master) from None
            self._suspect = False

    def _rpc_failed(self, op: str) -> RpcFailure:
        self._suspect = True
        return error_for(RPC_FAILED, op=op, master=self.master)  # type: ignore[return-value]

    def _check_all_failed(self, codes: Sequence[int], op: str) -> None:
        """A whole-call failure shows as every key carrying the same RPC error."""
        if codes and codes[0] in RPC_CODES and all(c == codes[0] for c in codes):
            raise self._rpc_failed(op)

    @staticmethod
    def _check_lengths(op: str, keys: Sequence[object], *others: Sequence[object]) -> None:
        for other in others:
            if len(other) != len(keys):
                raise InputError(f"{op}: {len(keys)} keys but {len(other)} pointers/sizes; give one per key.")

    def mark_down(self, reason: str | None) -> None:
        """While `reason` is set every call fails at once with RpcFailure instead of spending
        Mooncake's reconnect attempts (a watcher saw the master die); None clears it."""
        self._down_reason = reason

    def health(self) -> int:
        """Mooncake's health_check: 0 healthy, 1 not initialised/closed, 2 master unreachable."""
        return 1 if self._closed else int(self._store.health_check())

    # -- buffers -------------------------------------------------------------------------------

    def register_buffer(self, ptr: int, size: int) -> None:
        """Register host memory for zero-copy batch_put_from / batch_get_into (once per buffer)."""
        self._ready("register_buffer")
        if size <= 0:
            return
        rc = self._store.register_buffer(int(ptr), int(size))
        if rc != 0:
            raise StoreError(f"register_buffer of {size} bytes at {ptr:#x} failed: {code_name(rc)}.", rc=rc)
        self._registered[int(ptr)] = int(size)

    def unregister_buffer(self, ptr: int) -> None:
        self._ready("unregister_buffer")
        rc = self._store.unregister_buffer(int(ptr))
        self._registered.pop(int(ptr), None)
        if rc != 0:
            raise StoreError(f"unregister_buffer at {ptr:#x} failed: {code_name(rc)}.", rc=rc)

    # -- batch zero-copy I/O -------------------------------------------------------------------

    def batch_is_exist(self, keys: Sequence[str]) -> list[bool]:
        """Per key: whether the object exists. Raises RpcFailure when the master does not answer."""
        if not keys:
            return []
        self._ready("batch_is_exist")
        codes = self._store.batch_is_exist(list(keys))
        out = []
        for key, code in zip(keys, codes, strict=True):
            if code < 0:
                if code in RPC_CODES or code == -1:
                    raise self._rpc_failed("batch_is_exist")
                raise error_for(code, op="batch_is_exist", key=key, master=self.master)
            out.append(code == 1)
        return out

    def batch_put_from(
        self,
        keys: Sequence[str],
        ptrs: Sequence[int],
        sizes: Sequence[int],
        *,
        upsert: bool = False,
        retries: int = 5,
        backoff: float = 0.05,
    ) -> list[int]:
        """Write each key from registered memory; per key 0 or a negative Mooncake code.

        Without `upsert` an existing key is left as it is (and reports 0), as Mooncake does.
        Keys that hit SEGMENT_FULL are retried up to `retries` times, waiting `backoff` seconds
        doubled each time (eviction frees space asynchronously). Raises RpcFailure when the
        master does not answer at all.
        """
        self._check_lengths("batch_put_from", keys, ptrs, sizes)
        if not keys:
            return []
        self._ready("batch_put_from")
        call = self._store.batch_upsert_from if upsert else self._store.batch_put_from
        keys = keys if isinstance(keys, list) else list(keys)
        ptrs = ptrs if isinstance(ptrs, list) else list(ptrs)
        sizes = sizes if isinstance(sizes, list) else list(sizes)
        codes = list(call(keys, ptrs, sizes))
        self._check_all_failed(codes, "batch_put_from")
        wait = backoff
        for _ in range(retries):
            if SEGMENT_FULL not in codes:
                break
            todo = [i for i, c in enumerate(codes) if c == SEGMENT_FULL]
            time.sleep(wait)
            wait = min(wait * 2, 1.0)
            again = call([keys[i] for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo])
            for i, code in zip(todo, again, strict=True):
                codes[i] = code
            self._check_all_failed(again, "batch_put_from")
        return codes

    def batch_get_into(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Read each key into registered memory; per key bytes read (> 0) or a negative code
        (OBJECT_NOT_FOUND -704 for a missing key). Raises RpcFailure when the master is gone."""
        self._check_lengths("batch_get_into", keys, ptrs, sizes)
        if not keys:
            return []
        self._ready("batch_get_into")
        codes: list[int] = self._store.batch_get_into(
            keys if isinstance(keys, list) else list(keys),
            ptrs if isinstance(ptrs, list) else list(ptrs),
            sizes if isinstance(sizes, list) else list(sizes),
        )
        self._check_all_failed(codes, "batch_get_into")
        return codes

    # -- single objects, bytes -----------------------------------------------------------------

    def put(self, key: str, data: bytes, *, upsert: bool = False, retries: int = 5, backoff: float = 0.05) -> None:
        """Store `data` under `key` (kept as is if the key exists, unless `upsert`); typed errors."""
        self._ready("put")
        if not data:
            raise InputError(f"put {key!r}: Mooncake stores no empty objects.")
        call = self._store.upsert if upsert else self._store.put
        wait = backoff
        for attempt in range(retries + 1):
            rc = call(key, data)
            if rc != SEGMENT_FULL or attempt == retries:
                break
            time.sleep(wait)
            wait = min(wait * 2, 1.0)
        if rc in RPC_CODES:
            raise self._rpc_failed("put")
        if rc != 0:
            raise error_for(rc, op="put", key=key, master=self.master)

    def get(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound when missing, RpcFailure when the master is gone."""
        self._ready("get")
        data = self._store.get(key)
        if data:
            return bytes(data)
        # Mooncake answers b"" for a missing key and for a failure alike: ask which it was.
        rc = self._store.is_exist(key)
        if rc == 1:
            raise StoreError(f"get {key!r}: the object exists but could not be read.", key=key)
        if rc == 0:
            raise ObjectNotFound(f"get: object {key!r} not found at {self.master}.", rc=OBJECT_NOT_FOUND, key=key)
        raise self._rpc_failed("get")

    def exists(self, key: str) -> bool:
        return self.batch_is_exist([key])[0]

    # -- removal, always scoped ----------------------------------------------------------------

    def remove_prefix(self, prefix: str, *, force: bool = False) -> int:
        """Remove every object whose key starts with `prefix`; returns how many were removed.

        An empty prefix is refused (that is remove_all). `force` also removes leased objects.
        """
        if not prefix:
            raise InputError(
                "refusing to remove with an empty prefix: that would remove every object.",
                hint="Give the key prefix (e.g. the model prefix), or use remove_all(force=True).",
            )
        self._ready("remove_prefix")
        rc = self._store.remove_by_regex("^" + ecma_escape(prefix), bool(force))
        if rc < 0:
            if rc in RPC_CODES:
                raise self._rpc_failed("remove_prefix")
            raise error_for(rc, op=f"remove_prefix {prefix!r}", master=self.master)
        return int(rc)

    def remove_keys(self, keys: Sequence[str], *, prefix: str, force: bool = False) -> list[int]:
        """Remove these keys, each of which must start with `prefix` (InputError otherwise);
        per key 0, OBJECT_NOT_FOUND or LEASE_HELD (unless `force`)."""
        if not prefix:
            raise InputError("remove_keys needs the key prefix the keys belong to.")
        outside = [k for k in keys if not k.startswith(prefix)]
        if outside:
            raise InputError(
                f"refusing to remove {outside[0]!r}: it is outside the prefix {prefix!r}.",
                hint="Removal is scoped to one key prefix; pass the right --prefix.",
            )
        if not keys:
            return []
        self._ready("remove_keys")
        codes = list(self._store.batch_remove(list(keys), bool(force)))
        self._check_all_failed(codes, "remove_keys")
        return codes

    def remove_all(self, *, force: bool = False) -> int:
        """Remove every object of every client in the cluster: only with force=True."""
        if not force:
            raise InputError(
                "remove_all removes every object of every client of this master (cluster-wide).",
                hint="Remove by prefix instead, or pass --force if you mean the whole cluster.",
            )
        self._ready("remove_all")
        rc = self._store.remove_all(True)
        if rc < 0:
            if rc in RPC_CODES:
                raise self._rpc_failed("remove_all")
            raise error_for(rc, op="remove_all", master=self.master)
        return int(rc)

    # -- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmount and disconnect. Objects in this client's segment disappear with it."""
        if self._closed:
            return
        self._closed = True
        self._store.close()

    def abandon(self) -> None:
        """Stop using this client without closing it: Mooncake's close against a dead master
        takes ~15 s holding the GIL. The Mooncake object is kept referenced so no destructor
        runs it later; the caller ends the process with os._exit."""
        if self._closed:
            return
        self._closed = True
        _ABANDONED.append(self._store)

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StoreClient(master={self.master}, segment={self.segment_size}, hostname={self.hostname})"
