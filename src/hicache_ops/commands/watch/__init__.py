"""`hicache watch`: live figures and verdicts from SGLang's and a Mooncake master's /metrics (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from hicache_ops.commands.watch.figures import instance_figures, master_figures
from hicache_ops.commands.watch.sampler import Sampler
from hicache_ops.commands.watch.verdicts import all_verdicts


def report(sampler: Sampler, sglang_version: str | None = None) -> dict[str, Any]:
    """The report of the sampler's current windows: verdicts first."""
    instances = [instance_figures(t, sglang_version) for t in sampler.sglang]
    master = master_figures(sampler.master) if sampler.master is not None else None
    return {
        "verdicts": all_verdicts(instances, master),
        "window_s": sampler.targets[0].window,
        "rounds": sampler.rounds,
        "instances": instances,
        "master": master,
    }


__all__ = ["Sampler", "report"]
