"""`hicache watch`: live figures and verdicts from SGLang's and a Mooncake master's /metrics (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hicache_ops.commands.watch.figures import instance_figures, master_figures
from hicache_ops.commands.watch.sampler import Sampler
from hicache_ops.commands.watch.verdicts import all_verdicts
from hicache_ops.results import Result


class WatchReport(Result):
    """`hicache watch --json`: one report of the sampler's current windows, verdicts first."""

    omit_if_none = ("stopped",)

    verdicts: list[dict[str, Any]] = Field(
        description="what the window shows wrong: kind, severity, where, message (docs/metrics.md)"
    )
    window_s: float = Field(description="the sliding window rates are taken over, in seconds")
    rounds: int = Field(description="scrapes taken so far")
    instances: list[dict[str, Any]] = Field(
        description="per SGLang server: meanings, token hit rates per tier, prefetch, backup, host pool figures"
    )
    master: dict[str, Any] | None = Field(description="the Mooncake master's figures, null without --master")
    stopped: str | None = Field(
        default=None, description="why live mode stopped (the signal); only in the summary printed on stop"
    )


def report(sampler: Sampler, sglang_version: str | None = None) -> WatchReport:
    """The report of the sampler's current windows: verdicts first."""
    instances = [instance_figures(t, sglang_version) for t in sampler.sglang]
    master = master_figures(sampler.master) if sampler.master is not None else None
    return WatchReport(
        verdicts=all_verdicts(instances, master),
        window_s=sampler.targets[0].window,
        rounds=sampler.rounds,
        instances=instances,
        master=master,
    )


__all__ = ["Sampler", "WatchReport", "report"]
