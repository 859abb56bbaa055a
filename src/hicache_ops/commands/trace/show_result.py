"""The result model of `hicache trace show` (its --json): a tap recording summarised."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from hicache_ops.results import Result


class TapSource(Result):
    """What was read: the files, their records and the processes and ranks that wrote them."""

    files: list[str] = Field(description="the recording files read")
    records: int = Field(description="records read")
    storage_calls: int = Field(description="records of storage calls (not open / pool registration)")
    pids: list[int] = Field(description="processes that recorded")
    ranks: list[str] = Field(description="rank labels (`tp0`, `tp0_pp1`, ...)")
    first_ts: float | None = Field(description="first record's time (Unix), null without timestamps")
    last_ts: float | None = Field(description="last record's time (Unix)")
    span_s: float | None = Field(description="seconds between them")
    opens: list[dict[str, Any]] = Field(description="each rank's store open: prefix, version, master, error")
    host_pools: list[dict[str, Any]] = Field(description="each rank's registered host pool")


class TapFailures(Result):
    """Pages the store reported failed."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True, validate_by_name=True)

    count: int = Field(description="failed pages")
    by_kind: dict[str, int] = Field(description="failed pages by kind (get, set, raised, ...)")
    failed: list[dict[str, Any]] = Field(
        alias="list", description="each failure: rank, method, page, object codes and what they mean"
    )


class TapSummary(Result):
    """`hicache trace show --json`."""

    source: TapSource = Field(description="what was read")
    methods: dict[str, Any] = Field(description="per storage method: calls, pages, failures, latency percentiles")
    ranks: dict[str, Any] = Field(description="the same table per rank")
    queries: dict[str, Any] = Field(description="existence queries: pages asked, hits, the hit prefix")
    failures: TapFailures = Field(description="pages the store reported failed")
    keys: dict[str, Any] = Field(description="page keys written, read and queried, and whether reads found writes")
