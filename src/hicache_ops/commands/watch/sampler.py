"""Scrape SGLang servers' and a Mooncake master's /metrics, and keep a sliding window of samples.

A sample is the parsed exposition text of one target at one moment (docs/metrics.md). Rates are
taken between the oldest and the newest sample inside the window, never since the start; a
counter that went down between two samples was reset, and counts from zero again.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hicache_ops.errors import InputError, SettingError, UnreachableError

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    """One scrape: sample name -> {labels: value}, and when it was taken (monotonic seconds)."""

    at: float
    values: dict[str, dict[Labels, float]]

    def series(self, name: str, **match) -> dict[Labels, float]:
        """The label sets of `name` whose labels equal `match` (a callable value: a test of the label)."""
        found = self.values.get(name, {})
        if not match:
            return dict(found)

        def ok(labels: Labels) -> bool:
            have = dict(labels)
            return all(want(have.get(a)) if callable(want) else have.get(a) == str(want) for a, want in match.items())

        return {k: v for k, v in found.items() if ok(k)}

    def has(self, name: str) -> bool:
        return name in self.values


def parse_exposition(text: str, source: str) -> dict[str, dict[Labels, float]]:
    """Prometheus text exposition -> sample name -> {sorted label pairs: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, dict[Labels, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                values.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise InputError(f"{source} is not Prometheus exposition text ({exc}).") from None
    return values


def _base(url: str, what: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(
            f"{what} {url!r} must start with http:// or https://.", hint="For example http://127.0.0.1:30000."
        )
    return url.rstrip("/")


def master_url(address: str) -> str:
    """HOST:PORT (the master's --metrics_port) or a URL -> the base URL."""
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SettingError("master", f"{address!r} must be HOST:PORT (the master's metrics port).")
    return f"http://{address}"


def fetch_text(client, base: str, route: str, what: str, timeout: float) -> str:
    import httpx

    try:
        response = client.get(base + route)
    except httpx.TimeoutException:
        raise UnreachableError(f"{what} at {base} did not answer {route} within {timeout:g} s.") from None
    except httpx.TransportError as exc:
        raise UnreachableError(
            f"nothing answers at {base} ({type(exc).__name__}): {what} is down or the address is wrong."
        ) from None
    if response.status_code == 404 and what.startswith("the SGLang"):
        raise UnreachableError(
            f"{what} at {base} has no {route} (HTTP 404): SGLang serves it only with --enable-metrics."
        )
    if response.status_code != 200:
        raise UnreachableError(f"{what} at {base} answered {route} with HTTP {response.status_code}.")
    return response.text


def fetch_version(client, base: str) -> dict | None:
    """SGLang's /server_info (or the older /get_server_info) body, None when neither answers JSON."""
    import httpx

    for route in ("/server_info", "/get_server_info"):
        try:
            response = client.get(base + route)
        except httpx.HTTPError:
            return None
        if response.status_code == 200:
            try:
                body = response.json()
            except ValueError:
                return None
            return body if isinstance(body, dict) else None
    return None


@dataclass
class Target:
    """One scraped endpoint and its window of samples."""

    kind: str  # "sglang" or "master"
    url: str
    window: float
    samples: deque = field(default_factory=deque)
    info: dict | None = None  # SGLang's /server_info body, when it answered
    error: str | None = None  # the last scrape's failure, if it failed

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        # Keep the newest sample that is at least `window` old as the window's start.
        while len(self.samples) > 2 and sample.at - self.samples[1].at >= self.window:
            self.samples.popleft()

    @property
    def first(self) -> Sample | None:
        return self.samples[0] if self.samples else None

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None


class Sampler:
    """Scrapes every target once per `scrape()`, all at the same time, each within `timeout`."""

    def __init__(
        self,
        sglang_urls: Iterable[str],
        master: str | None = None,
        *,
        window: float = 60.0,
        timeout: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        urls = list(sglang_urls)
        if not urls:
            raise InputError("give at least one --sglang-url.")
        if not timeout > 0:
            raise InputError(f"timeout {timeout:g} s must be positive.")
        if not window > 0:
            raise InputError(f"window {window:g} s must be positive.")
        self.timeout = timeout
        self.clock = clock
        self.targets = [Target("sglang", _base(u, "SGLang URL"), window) for u in urls]
        if master is not None:
            self.targets.append(Target("master", master_url(master), window))
        self.rounds = 0

    @property
    def sglang(self) -> list[Target]:
        return [t for t in self.targets if t.kind == "sglang"]

    @property
    def master(self) -> Target | None:
        return next((t for t in self.targets if t.kind == "master"), None)

    def _scrape_one(self, client, target: Target) -> None:
        what = "the SGLang server" if target.kind == "sglang" else "the Mooncake master"
        if target.kind == "sglang" and target.info is None:
            target.info = fetch_version(client, target.url)
        text = fetch_text(client, target.url, "/metrics", what, self.timeout)
        target.add(Sample(self.clock(), parse_exposition(text, f"{target.url}/metrics")))

    def scrape(self, *, strict: bool = False) -> list[str]:
        """One round. Returns the failures (one sentence each); with `strict` the first one raises."""
        import httpx

        with httpx.Client(timeout=httpx.Timeout(self.timeout), follow_redirects=False) as client:
            with ThreadPoolExecutor(max_workers=len(self.targets)) as pool:
                futures = [(t, pool.submit(self._scrape_one, client, t)) for t in self.targets]
                failures = []
                for target, future in futures:
                    try:
                        future.result()
                        target.error = None
                    except (UnreachableError, InputError) as err:
                        if strict:
                            raise
                        target.error = err.message
                        failures.append(err.message)
        self.rounds += 1
        return failures
