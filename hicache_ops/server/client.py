"""The Python client for a running `hicache serve` (used by warm, prefetch, trace and playbooks)."""

from __future__ import annotations

from typing import Any

import httpx

from ..errors import HicacheError, InputError, UnreachableError

DEFAULT_URL = "http://127.0.0.1:18080"


class ServeError(HicacheError):
    """The serve instance answered with an error."""

    code = "serve_error"


class ServeClient:
    def __init__(self, url: str = DEFAULT_URL, timeout_s: float = 30.0):
        if not url.startswith(("http://", "https://")):
            raise InputError(f"serve URL {url!r} must start with http:// or https://.", hint=f"For example {DEFAULT_URL}.")
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=3.0))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, ok_statuses: tuple[int, ...] = (), **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UnreachableError(
                f"no hicache serve answers at {self.url} ({type(exc).__name__}).",
                hint="Start one with `hicache serve` or pass the right --serve URL.",
            ) from None
        except httpx.TimeoutException:
            raise UnreachableError(f"hicache serve at {self.url} did not answer {path} in time.") from None
        except httpx.TransportError as exc:
            raise UnreachableError(f"the connection to hicache serve at {self.url} failed: {exc}.") from None
        if response.status_code >= 400 and response.status_code not in ok_statuses:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"message": response.text.strip() or f"HTTP {response.status_code}", "hint": None}
            cls = InputError if response.status_code < 500 else ServeError
            if response.status_code == 503:
                cls = UnreachableError
            raise cls(error.get("message") or f"HTTP {response.status_code}", hint=error.get("hint"))
        if path == "/metrics":
            return response.text
        return response.json()

    def prefill(
        self, input_ids: list[int], extra_key: str | None = None, cache_salt: str | None = None,
        return_keys: bool = False, backup: bool = False,
    ) -> dict:
        body = {
            "input_ids": list(map(int, input_ids)), "extra_key": extra_key, "cache_salt": cache_salt,
            "return_keys": return_keys, "backup": backup,
        }
        return self._call("POST", "/v1/prefill", json=body)

    def prefetch(self, input_ids: list[int], extra_key: str | None = None, cache_salt: str | None = None) -> dict:
        body = {"input_ids": list(map(int, input_ids)), "extra_key": extra_key, "cache_salt": cache_salt}
        return self._call("POST", "/v1/prefetch", json=body)

    def trace(self, kind: str, input_ids: list[int], extra_key: str | None = None, cache_salt: str | None = None, flush: bool = False) -> dict:
        body = {"input_ids": list(map(int, input_ids)), "extra_key": extra_key, "cache_salt": cache_salt, "flush": flush}
        return self._call("POST", f"/v1/trace/{kind}", json=body)

    def flush(self) -> dict:
        return self._call("POST", "/flush_cache")

    def stats(self) -> dict:
        return self._call("GET", "/v1/stats")

    def layout(self) -> dict:
        return self._call("GET", "/v1/layout")

    def metrics(self) -> str:
        return self._call("GET", "/metrics")

    def health(self) -> dict:
        """/health: {"status": "ok", "l3": ...}, or {"status": "degraded", "l3": "down", ...} (HTTP 503)."""
        return self._call("GET", "/health", ok_statuses=(503,))
