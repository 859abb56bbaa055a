"""The master's admin HTTP API (the metrics port), with short timeouts and typed failures.

    admin = AdminClient("127.0.0.1:9003")
    admin.health()              # {"status": "ok", "role": "leader", "service_ready": true, ...}
    admin.get_all_keys()        # every key (the only listing the master offers)
    admin.exists(keys)          # per key bool, through /batch_query_keys in chunks
    admin.segments_detail()     # [{"segment_name", "size_bytes", "allocator_used_bytes", ...}]
    admin.metrics()             # Prometheus text parsed into {name: value}

Response formats, as measured against mooncake_master 0.3.13.post1:
  /health             JSON {"status","role","ha_state","service_ready","leader_address","view_version"}
  /get_all_keys       text/plain, one key per line (empty body when there are none)
  /get_all_segments   text/plain, one segment name per line
  /get_segments_detail JSON {"total_segments", "segments": [{"segment_name","segment_id","client_id",
                      "base_address","size_bytes","size_human","te_endpoint","protocol","status",
                      "allocator_used_bytes","allocator_capacity_bytes","allocator_usage_percent"}]}
  /query_key?key=K    200 {"success":true,"data":[{"size_","buffer_address_","protocol_",
                      "transport_endpoint_"}]} or 404 {"success":false,"error_code":-704,...};
                      the value is taken raw (no percent-decoding)
  /batch_query_keys?keys=a,b  200 {"success":true,"data":{key: {"ok", "error", "values", ...}}};
                      percent-decoded ("+" reads as a space), split on "," -- so keys are sent
                      percent-encoded, and a key holding a comma goes through /query_key
  /metrics            Prometheus text (master_key_count, master_allocated_bytes, ...)

Connection refused, a timeout or a dropped connection raise UnreachableError naming the address;
a malformed HOST:PORT raises InputError.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

from hicache_ops.errors import InputError, SettingError, UnreachableError, transport_reason
from hicache_ops.mooncake.net import format_host_port, parse_host_port

DEFAULT_TIMEOUT = 3.0
QUERY_CHUNK = 512  # keys per /batch_query_keys request (URLs stay well under 64 KiB)
_RAW_QUERY_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~,:!*'()@/")


class AdminClient:
    """Client of one master's admin HTTP API. Keeps one connection alive between calls."""

    def __init__(self, address: str, *, timeout: float = DEFAULT_TIMEOUT, what: str = "--master"):
        self.host, self.port = parse_host_port(address, what=what)
        self.address = format_host_port(self.host, self.port)
        if not 0 < timeout < float("inf"):
            # 0 would make the socket non-blocking (BlockingIOError), a negative one is refused by Python.
            raise SettingError(
                "timeout", f"{timeout:g} must be a number of seconds > 0.", hint="For example --timeout 3."
            )
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    # -- transport -----------------------------------------------------------------------------

    def _unreachable(self, exc: BaseException, path: str) -> UnreachableError:
        self.close()
        if isinstance(exc, (socket.timeout, TimeoutError)):
            reason = f"no answer within {self.timeout:g} s"
        elif isinstance(exc, ConnectionRefusedError):
            reason = "connection refused"
        elif isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)):
            reason = "the connection was dropped (did the master die?)"
        elif isinstance(exc, socket.gaierror):
            reason = f"cannot resolve {self.host!r}"
        else:
            reason = transport_reason(exc, self.timeout)  # never the peer's raw bytes
        return UnreachableError(
            f"the Mooncake master admin API at {self.address} did not answer {path.split('?')[0]} ({reason}).",
            hint="Check that mooncake_master runs and that --master is HOST:METRICS_PORT (default port 9003), "
            "not the RPC port.",
        )

    def _request(self, path: str, method: str = "GET") -> tuple[int, bytes]:
        for attempt in (0, 1):
            fresh = self._conn is None
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            conn = self._conn
            try:
                conn.request(method, path)
                resp = conn.getresponse()
                body = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    self.close()
                return resp.status, body
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                # A kept-alive connection may have been closed by the server between calls:
                # retry once on a fresh one before calling the master unreachable.
                self.close()
                if fresh or attempt:
                    raise self._unreachable(exc, path) from None
            except (OSError, http.client.HTTPException) as exc:
                raise self._unreachable(exc, path) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _json(self, path: str, *, ok_statuses: Iterable[int] = (200,)) -> object:
        status, body = self._request(path)
        try:
            data = json.loads(body) if body else None
        except ValueError:
            raise UnreachableError(
                f"{self.address}{path.split('?')[0]} answered HTTP {status} with something that is not JSON.",
                hint="Is --master the Mooncake master's metrics port?",
            ) from None
        if status not in ok_statuses:
            raise UnreachableError(f"{self.address}{path.split('?')[0]} answered HTTP {status}.")
        return data

    def _text(self, path: str) -> str:
        status, body = self._request(path)
        if status != 200:
            raise UnreachableError(
                f"{self.address}{path.split('?')[0]} answered HTTP {status}.",
                hint="Is --master the Mooncake master's metrics port?",
            )
        return body.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- endpoints -----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """/health as a dict; answers (HTTP 200 or 503) even when the service is not ready."""
        data = self._json("/health", ok_statuses=(200, 503))
        if not isinstance(data, dict):
            raise UnreachableError(
                f"{self.address}/health did not answer a JSON object.",
                hint="Is --master the Mooncake master's metrics port?",
            )
        return data

    def get_all_keys(self) -> list[str]:
        return [line for line in self._text("/get_all_keys").splitlines() if line]

    def get_all_segments(self) -> list[str]:
        return [line for line in self._text("/get_all_segments").splitlines() if line]

    def segments_detail(self) -> list[dict[str, Any]]:
        data = self._json("/get_segments_detail")
        if isinstance(data, dict) and isinstance(data.get("segments"), list):
            segments: list[dict[str, Any]] = data["segments"]  # the master's segment objects
            return segments
        return []

    def query_key(self, key: str) -> list[dict[str, Any]] | None:
        """The replica descriptors of one object, or None when it does not exist.

        The master reads this parameter raw (no percent-decoding), so keys holding characters
        that a URL query cannot carry raw are refused with an InputError (use exists()).
        """
        if any(ch not in _RAW_QUERY_SAFE for ch in key):
            raise InputError(f"/query_key cannot carry the key {key!r} (the master does not percent-decode it).")
        data = self._json("/query_key?key=" + key, ok_statuses=(200, 404))
        if isinstance(data, dict) and data.get("success"):
            replicas: list[dict[str, Any]] = data.get("data") or []  # the master's replica descriptors
            return replicas
        return None

    def batch_query_keys(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """/batch_query_keys for keys without commas: {key: {"ok": bool, "error", "values", ...}}."""
        if not keys:
            return {}
        if any("," in k for k in keys):
            raise InputError("batch_query_keys cannot carry keys with a comma; use exists().")
        path = "/batch_query_keys?keys=" + ",".join(quote(k, safe="") for k in keys)
        data = self._json(path, ok_statuses=(200, 404))
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
            return {}
        answers: dict[str, dict[str, Any]] = data["data"]  # per key, the master's answer object
        return answers

    def exists(self, keys: Sequence[str], *, chunk: int = QUERY_CHUNK) -> list[bool]:
        """Per key whether the object exists: /batch_query_keys in chunks, no round trip per key."""
        out: list[bool] = []
        listing: set[str] | None = None
        plain = [k for k in keys if "," not in k]
        found: set[str] = set()
        for start in range(0, len(plain), chunk):
            part = plain[start : start + chunk]
            answer = self.batch_query_keys(part)
            found.update(k for k in part if isinstance(answer.get(k), dict) and answer[k].get("ok"))
        for key in keys:
            if "," not in key:
                out.append(key in found)
            elif all(ch in _RAW_QUERY_SAFE for ch in key):
                out.append(self.query_key(key) is not None)
            else:  # neither endpoint can carry it: look it up in the full listing (once)
                if listing is None:
                    listing = set(self.get_all_keys())
                out.append(key in listing)
        return out

    def metrics_text(self) -> str:
        return self._text("/metrics")

    def metrics(self) -> dict[str, float]:
        """Unlabelled Prometheus samples as {name: value} (labelled ones keep their labels in the name)."""
        out: dict[str, float] = {}
        for line in self.metrics_text().splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                out[name.strip()] = float(value)
            except ValueError:
                continue
        return out
