"""The `bench replay` report: one configuration, or one per capacity of a swept tier, each replayed
through the tiered cache (replay.py) with its block LRU beside it (replay_baseline.py), and the
ceiling and the unbounded block LRU once over the requests replayed; `--sweep` parsed here.

Pure library: no typer, no rich.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hicache_ops import interrupt
from hicache_ops.commands.bench import replay_baseline
from hicache_ops.commands.bench.replay import Progress, ReplayRun, ReplaySpec, check_fits, replay
from hicache_ops.commands.bench.replay_trace import TokenSource, Trace
from hicache_ops.errors import SettingError

MAX_SWEEP_STEPS = 50


def parse_sweep(text: str, page_size: int) -> list[int]:
    """FROM:TO:STEPS -> STEPS capacities in tokens, log-spaced, whole pages, distinct."""
    parts = str(text).split(":")
    try:
        low, high, steps = int(float(parts[0])), int(float(parts[1])), int(parts[2])
        if len(parts) != 3:
            raise ValueError
    except (ValueError, IndexError, OverflowError):
        raise SettingError("sweep", f"range {text!r} must be FROM:TO:STEPS, e.g. 500000:20000000:8.") from None
    if not (page_size <= low < high) or not 2 <= steps <= MAX_SWEEP_STEPS:
        raise SettingError(
            "sweep", f"range {text!r} needs {page_size} <= FROM < TO and 2 <= STEPS <= {MAX_SWEEP_STEPS}."
        )
    points = []
    for i in range(steps):
        tokens = round(low * (high / low) ** (i / (steps - 1))) // page_size * page_size
        if tokens not in points:
            points.append(tokens)
    return points


# Sweep-point fields the top level states elsewhere (trace, baseline, wall_s).
_POINT_ONLY = ("capacity_tokens", "baseline_hit_rate", "requests", "prompt_tokens", "elapsed_s")


@dataclass
class ReplayReport:
    trace: Trace
    spec: ReplaySpec
    runs: list[ReplayRun]
    ceiling: replay_baseline.ReferenceRun
    baseline_unbounded: replay_baseline.ReferenceRun
    sweep_tier: str | None = None
    wall_s: float = 0.0
    reference_s: float = 0.0
    stopped_between_runs: bool = False  # a sweep's later capacities were not run

    @property
    def interrupted(self) -> bool:
        return self.stopped_between_runs or any(run.interrupted for run in self.runs)

    def _point(self, run: ReplayRun, bytes_per_token: int) -> dict:
        prompt = run.prompt_tokens
        baseline = run.baseline
        return {
            "capacity_tokens": run.pools[self.sweep_tier] if self.sweep_tier else None,
            "hit_rate": run.hit_rate,
            "hit_rate_of_ceiling": run.hit_rate / self.ceiling.hit_rate if self.ceiling.hit_rate else None,
            "cached_tokens": run.cached_tokens,
            "prefilled_tokens": prompt - run.cached_tokens,
            "prefilled_tokens_saved": run.cached_tokens,
            "tiers": run.tiers_json(bytes_per_token),
            "baseline_hit_rate": baseline.hit_rate if baseline else None,
            "requests": run.requests,
            "prompt_tokens": prompt,
            "elapsed_s": run.elapsed_s,
            "interrupted": run.interrupted,
        }

    def to_json(self) -> dict:
        from hicache_ops.sglang.geometry import preset

        geometry = preset(self.spec.preset)
        bytes_per_token = geometry.bytes_per_token()
        last = self.runs[-1]
        first = self.runs[0]
        points = [self._point(run, bytes_per_token) for run in self.runs]
        data = {
            "trace": {
                "path": self.trace.path,
                "format": self.trace.format,
                "requests": len(self.trace.requests),
                "requests_replayed": last.requests,
                "prompt_tokens": last.prompt_tokens,
                "span_s": (self.trace.requests[-1].timestamp - self.trace.requests[0].timestamp) / 1000,
            },
            "config": {
                **self.spec.to_json(),
                "bytes_per_token": bytes_per_token,
                "mode": "accounting",
                "l3_eviction": "mooncake master: lease-expired objects, oldest lease first, above a 0.90 watermark"
                if isinstance(self.spec.l3, int)
                else None,
            },
            # One configuration: its figures; a sweep: the largest capacity's (the last point).
            **{k: v for k, v in points[-1].items() if k not in _POINT_ONLY},
            "ceiling_hit_rate": self.ceiling.hit_rate,
            "ceiling_cached_tokens": self.ceiling.cached_tokens,
            "baseline": {
                "policy": "block LRU, 512-token blocks, longest cached prefix",
                "capacity_tokens": first.spec.baseline_capacity() if not self.sweep_tier else None,
                "hit_rate": last.baseline.hit_rate if last.baseline else None,
                "evictions": last.baseline.evictions if last.baseline else None,
                "unbounded_hit_rate": self.baseline_unbounded.hit_rate,
            },
            "wall_s": self.wall_s,
            "replay_s": sum(run.elapsed_s for run in self.runs),
            "reference_s": self.reference_s,
            "interrupted": self.interrupted,
        }
        if self.sweep_tier:
            data["sweep"] = self.sweep_tier
            data["points"] = points
        return data


def run_report(
    spec: ReplaySpec,
    trace: Trace,
    *,
    sweep_tier: str | None = None,
    capacities: list[int] | None = None,
    progress: Progress | None = None,
) -> ReplayReport:
    """One configuration, or one per capacity of `sweep_tier`; each with its block LRU beside it,
    and the ceiling and the unbounded block LRU once over the requests replayed."""
    t0 = time.perf_counter()
    specs = [spec] if sweep_tier is None else [spec.with_tier(sweep_tier, c) for c in capacities]
    for s in specs:
        s.validate()
        check_fits(s, trace)
    tokens = TokenSource(trace)
    runs: list[ReplayRun] = []
    reference_s = 0.0
    stopped_between_runs = False
    for number, s in enumerate(specs, 1):
        run = replay(s, trace, tokens, progress, (number, len(specs)))
        replayed = trace.head(run.requests)
        t = time.perf_counter()
        run.baseline = replay_baseline.block_lru(replayed, s.baseline_capacity())
        reference_s += time.perf_counter() - t
        runs.append(run)
        if run.interrupted:
            break
        if interrupt.requested() and number < len(specs):
            stopped_between_runs = True
            break
    replayed = trace.head(runs[-1].requests)
    t = time.perf_counter()
    ceiling = replay_baseline.ceiling(replayed, spec.page_size)
    unbounded = replay_baseline.block_lru(replayed, None)
    reference_s += time.perf_counter() - t
    return ReplayReport(
        trace,
        spec,
        runs,
        ceiling,
        unbounded,
        sweep_tier,
        wall_s=time.perf_counter() - t0,
        reference_s=reference_s,
        stopped_between_runs=stopped_between_runs,
    )
