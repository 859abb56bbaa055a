"""The `bench replay` report: one configuration, or one per capacity of a swept tier, each replayed
through the tiered cache (replay.py) with its block LRU beside it (replay_baseline.py), and the
ceiling and the unbounded block LRU once over the requests replayed; `--sweep` parsed here.

Pure library: no typer, no rich.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.commands.bench import replay_baseline
from hicache_ops.commands.bench.replay import Progress, ReplayRun, ReplaySpec, ReplayTiers, check_fits, replay
from hicache_ops.commands.bench.replay_trace import TokenSource, Trace
from hicache_ops.errors import InputError, SettingError
from hicache_ops.results import Result

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


class ReplayTrace(Result):
    """The trace a `bench replay` ran."""

    path: str = Field(description="the trace file")
    format: str = Field(description="`mooncake` (hash_ids) or `tokens` (input_ids)")
    requests: int = Field(description="requests in the file (after --limit)")
    requests_replayed: int = Field(description="requests replayed (fewer when stopped)")
    prompt_tokens: int = Field(description="prompt tokens of the requests replayed")
    span_s: float = Field(description="seconds from the first request's timestamp to the last's")


class ReplayConfig(Result):
    """The configuration a `bench replay` ran (a sweep: the swept tier at its first capacity)."""

    page_size: int = Field(description="tokens per page")
    l1_tokens: int = Field(description="the device pool in tokens (whole pages)")
    hicache_ratio: float | None = Field(description="host pool / device pool; `null` without L2")
    l3: str | int = Field(description="`none`, `unbounded` or a capacity in tokens")
    write_policy: str = Field(description="SGLang's --hicache-write-policy")
    sglang_version: str = Field(description="the SGLang release whose rules apply")
    preset: str = Field(description="the model geometry behind the byte counts")
    bytes_per_token: int = Field(description="KV bytes per token of the preset")
    mode: str = Field(description="`accounting`: bytes counted, none moved")
    l3_eviction: str | None = Field(description="how a bounded L3 evicts; `null` when L3 is unbounded or none")


class ReplayBaseline(Result):
    """The published-style block LRU over the same requests."""

    policy: str = Field(description="the baseline's rule")
    capacity_tokens: int | None = Field(description="its one tier's size; `null`: unbounded, or a sweep")
    hit_rate: float | None = Field(description="its hit rate at that capacity (a sweep: the last point's)")
    evictions: int | None = Field(description="blocks it evicted")
    unbounded_hit_rate: float = Field(description="its hit rate without a capacity")


class ReplayPoint(Result):
    """One capacity of a `--sweep`."""

    capacity_tokens: int | None = Field(description="the swept tier's capacity in tokens")
    hit_rate: float = Field(description="cached / prompt tokens, all tiers")
    hit_rate_of_ceiling: float | None = Field(description="hit_rate / the unbounded ceiling")
    cached_tokens: int = Field(description="prompt tokens served from a cache tier")
    prefilled_tokens: int = Field(description="prompt tokens computed")
    prefilled_tokens_saved: int = Field(description="prompt tokens not computed (= cached_tokens)")
    tiers: ReplayTiers = Field(description="per tier: capacity, cached tokens, hit rate, evictions, bytes in and out")
    baseline_hit_rate: float | None = Field(description="the block LRU at the same capacity")
    requests: int = Field(description="requests replayed at this capacity")
    prompt_tokens: int = Field(description="their prompt tokens")
    elapsed_s: float = Field(description="seconds this capacity's replay took")
    interrupted: bool = Field(description="a stop request ended this capacity's replay early")


class ReplayResult(Result):
    """`hicache bench replay --json`. A sweep's top-level figures are its last (largest) point's."""

    omit_if_none = ("sweep", "points", "plot")

    trace: ReplayTrace = Field(description="the trace: path, format, requests, those replayed, prompt tokens, span")
    config: ReplayConfig = Field(description="page size, pools, write policy, release, preset, bytes per token, mode")
    hit_rate: float = Field(description="cached / prompt tokens, all tiers")
    hit_rate_of_ceiling: float | None = Field(description="hit_rate / ceiling_hit_rate; `null` when the ceiling is 0")
    cached_tokens: int = Field(description="prompt tokens served from a cache tier")
    prefilled_tokens: int = Field(description="prompt tokens computed")
    prefilled_tokens_saved: int = Field(description="prompt tokens not computed (= cached_tokens)")
    tiers: ReplayTiers = Field(description="per tier: capacity, cached tokens, hit rate, evictions, bytes in and out")
    interrupted: bool = Field(description="a stop request ended the replay (or the sweep) early")
    ceiling_hit_rate: float = Field(description="an unbounded cache with SGLang's page rules, same requests")
    ceiling_cached_tokens: int = Field(description="prompt tokens that unbounded cache serves")
    baseline: ReplayBaseline = Field(description="the published-style block LRU")
    wall_s: float = Field(description="the run's wall-clock seconds")
    replay_s: float = Field(description="seconds in the engine, all capacities")
    reference_s: float = Field(description="seconds for the ceiling and the block LRU")
    sweep: str | None = Field(None, description="with --sweep: the swept tier")
    points: list[ReplayPoint] | None = Field(None, description="with --sweep: one entry per capacity, smallest first")
    plot: str | None = Field(None, description="with --plot: the image written")


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

    def _point(self, run: ReplayRun, bytes_per_token: int) -> ReplayPoint:
        prompt = run.prompt_tokens
        baseline = run.baseline
        return ReplayPoint(
            capacity_tokens=run.pools[self.sweep_tier] if self.sweep_tier else None,
            hit_rate=run.hit_rate,
            hit_rate_of_ceiling=run.hit_rate / self.ceiling.hit_rate if self.ceiling.hit_rate else None,
            cached_tokens=run.cached_tokens,
            prefilled_tokens=prompt - run.cached_tokens,
            prefilled_tokens_saved=run.cached_tokens,
            tiers=run.tiers(bytes_per_token),
            baseline_hit_rate=baseline.hit_rate if baseline else None,
            requests=run.requests,
            prompt_tokens=prompt,
            elapsed_s=run.elapsed_s,
            interrupted=run.interrupted,
        )

    def result(self) -> ReplayResult:
        from hicache_ops.sglang.geometry import preset

        spec = self.spec
        bytes_per_token = preset(spec.preset).bytes_per_token()
        last = self.runs[-1]
        first = self.runs[0]
        points = [self._point(run, bytes_per_token) for run in self.runs]
        top = points[-1]  # one configuration: its figures; a sweep: the largest capacity's (the last point)
        requests = self.trace.requests
        return ReplayResult(
            trace=ReplayTrace(
                path=self.trace.path,
                format=self.trace.format,
                requests=len(requests),
                requests_replayed=last.requests,
                prompt_tokens=last.prompt_tokens,
                span_s=(requests[-1].timestamp - requests[0].timestamp) / 1000,
            ),
            config=ReplayConfig(
                page_size=spec.page_size,
                l1_tokens=spec.device_tokens,
                hicache_ratio=None if not spec.enable_l2 else spec.ratio,
                l3=spec.l3,
                write_policy=spec.write_policy,
                sglang_version=spec.sglang_version,
                preset=spec.preset,
                bytes_per_token=bytes_per_token,
                mode="accounting",
                l3_eviction="mooncake master: lease-expired objects, oldest lease first, above a 0.90 watermark"
                if isinstance(spec.l3, int)
                else None,
            ),
            hit_rate=top.hit_rate,
            hit_rate_of_ceiling=top.hit_rate_of_ceiling,
            cached_tokens=top.cached_tokens,
            prefilled_tokens=top.prefilled_tokens,
            prefilled_tokens_saved=top.prefilled_tokens_saved,
            tiers=top.tiers,
            interrupted=self.interrupted,
            ceiling_hit_rate=self.ceiling.hit_rate,
            ceiling_cached_tokens=self.ceiling.cached_tokens,
            baseline=ReplayBaseline(
                policy="block LRU, 512-token blocks, longest cached prefix",
                capacity_tokens=first.spec.baseline_capacity() if not self.sweep_tier else None,
                hit_rate=last.baseline.hit_rate if last.baseline else None,
                evictions=last.baseline.evictions if last.baseline else None,
                unbounded_hit_rate=self.baseline_unbounded.hit_rate,
            ),
            wall_s=self.wall_s,
            replay_s=sum(run.elapsed_s for run in self.runs),
            reference_s=self.reference_s,
            sweep=self.sweep_tier,
            points=points if self.sweep_tier else None,
        )


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
    if sweep_tier is not None and not capacities:
        raise InputError("a sweep needs at least one capacity.")
    specs = [spec] if sweep_tier is None else [spec.with_tier(sweep_tier, c) for c in capacities or ()]
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
