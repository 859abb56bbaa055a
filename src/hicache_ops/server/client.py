"""The Python client for a running `hicache serve` (used by warm, prefetch, trace and playbooks)."""

from __future__ import annotations

from typing import Any

import httpx

from hicache_ops.errors import HicacheError, InputError, UnreachableError, transport_reason

DEFAULT_URL = "http://127.0.0.1:18080"
DEFAULT_TIMEOUT_S = 3.0  # the same default as the master commands' --timeout
# A prefill, prefetch or trace may take a while on a busy serve; past this, /health says whether
# the serve is slow (answers) or silent.
WORK_TIMEOUT_S = 60.0


class ServeError(HicacheError):
    """The serve instance answered with an error."""

    code = "serve_error"


def check_timeout(timeout_s: float, what: str = "--timeout") -> float:
    if not timeout_s > 0 or timeout_s == float("inf"):
        raise InputError(f"{what} {timeout_s:g} must be a number of seconds > 0.", hint="For example --timeout 3.")
    return float(timeout_s)


def check_http_url(url: str, what: str) -> str:
    """An http(s)://HOST:PORT URL, or InputError naming `what` (e.g. --serve)."""
    if not url.startswith(("http://", "https://")):
        raise InputError(f"{what} {url!r} must start with http:// or https://.", hint=f"For example {DEFAULT_URL}.")
    try:
        parsed = httpx.URL(url)
        parsed.port  # noqa: B018 - a port that is not a number raises here
    except (httpx.InvalidURL, ValueError) as exc:
        raise InputError(f"{what} {url!r} is not a valid URL ({exc}).", hint=f"For example {DEFAULT_URL}.") from None
    if not parsed.host:
        raise InputError(f"{what} {url!r} names no host.", hint=f"For example {DEFAULT_URL}.")
    return url.rstrip("/")


class ServeClient:
    """Every call is bounded: connecting and the control calls (stats, health, layout, metrics,
    flush) by `timeout_s`; prefill, prefetch and trace by `work_timeout_s`, after which /health
    tells a slow serve from a silent one. Failures name the address (UnreachableError, exit 3)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        work_timeout_s: float | None = None,
        what: str = "--serve",
    ):
        self.url = check_http_url(url, what)
        self.timeout_s = check_timeout(timeout_s)
        self.work_timeout_s = (
            max(self.timeout_s, WORK_TIMEOUT_S) if work_timeout_s is None else check_timeout(work_timeout_s)
        )
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(self.timeout_s))

    @classmethod
    def open(cls, url: str = DEFAULT_URL, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs) -> ServeClient:
        """A client whose serve answered /health within `timeout_s` (a silent one fails here)."""
        client = cls(url, timeout_s, **kwargs)
        try:
            client.health()
        except BaseException:
            client.close()
            raise
        return client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, ok_statuses: tuple[int, ...] = (), work: bool = False, **kwargs) -> Any:
        timeout = httpx.Timeout(self.work_timeout_s if work else self.timeout_s, connect=self.timeout_s)
        try:
            response = self._http.request(method, path, timeout=timeout, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UnreachableError(
                f"no hicache serve answers at {self.url} ({transport_reason(exc, self.timeout_s)}).",
                hint="Start one with `hicache serve` or pass the right --serve URL.",
            ) from None
        except httpx.TimeoutException:
            if work and self._alive():
                raise UnreachableError(
                    f"hicache serve at {self.url} is alive (it answers /health) but did not finish {path} "
                    f"within {self.work_timeout_s:g} s: it is overloaded or stuck on L3.",
                    hint="Check its /v1/stats (l3) and log; retry with fewer prompts in flight.",
                ) from None
            raise UnreachableError(
                f"hicache serve at {self.url} accepted the connection but did not answer {path} "
                f"within {timeout.read:g} s.",
                hint="The process is stuck or stopped (SIGSTOP?); check it, or raise --timeout if it is only slow.",
            ) from None
        except httpx.TransportError as exc:
            raise UnreachableError(
                f"the connection to hicache serve at {self.url} failed: {transport_reason(exc, self.timeout_s)}.",
                hint="Is --serve the URL of a hicache serve?",
            ) from None
        if response.status_code >= 400 and response.status_code not in ok_statuses:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"message": response.text.strip() or f"HTTP {response.status_code}", "hint": None}
            cls: type[HicacheError] = InputError if response.status_code < 500 else ServeError
            if response.status_code == 503:
                cls = UnreachableError
            raise cls(error.get("message") or f"HTTP {response.status_code}", hint=error.get("hint"))
        if path == "/metrics":
            return response.text
        try:
            return response.json()
        except ValueError:
            raise UnreachableError(
                f"{self.url}{path} answered HTTP {response.status_code} with something that is not JSON.",
                hint="Is --serve the URL of a hicache serve?",
            ) from None

    def _alive(self) -> bool:
        try:
            self._http.get("/health", timeout=self.timeout_s)
        except httpx.HTTPError:
            return False
        return True

    def prefill(
        self,
        input_ids: list[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        return_keys: bool = False,
        backup: bool = False,
    ) -> dict:
        body = {
            "input_ids": list(map(int, input_ids)),
            "extra_key": extra_key,
            "cache_salt": cache_salt,
            "return_keys": return_keys,
            "backup": backup,
        }
        return self._call("POST", "/v1/prefill", work=True, json=body)

    def prefetch(self, input_ids: list[int], extra_key: str | None = None, cache_salt: str | None = None) -> dict:
        body = {"input_ids": list(map(int, input_ids)), "extra_key": extra_key, "cache_salt": cache_salt}
        return self._call("POST", "/v1/prefetch", work=True, json=body)

    def trace(
        self,
        kind: str,
        input_ids: list[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        flush: bool = False,
        observe: bool = False,
    ) -> dict:
        body = {
            "input_ids": list(map(int, input_ids)),
            "extra_key": extra_key,
            "cache_salt": cache_salt,
            "flush": flush,
            "observe": observe,
        }
        return self._call("POST", f"/v1/trace/{kind}", work=True, json=body)

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
