"""The multi-turn benchmark (docs/workloads.md#multi-turn-workload), run against the embedded tiered cache.

The workload, its pools and the ceiling h_max(r): multiturn_workload.py.

Each configuration, and how a request goes through the engine in it: multiturn_config_run.py.
The same workload runs side by side in three configurations of the same engine code: L1 only,
L1+L2, L1+L2+L3; in accounting mode each in a process of its own (multiturn_workers.py).

A stop request (Ctrl-C, hicache_ops/interrupt.py) ends each configuration after the round in
progress; configurations not yet started are not run. The result then covers the rounds finished,
per configuration, and its totals the rounds every configuration finished.

Pure library: no typer, no rich; torch and mooncake are imported only by the real-bytes mode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.commands.bench.multiturn_config_run import ConfigRun, Progress, run_config
from hicache_ops.commands.bench.multiturn_workers import available_cpus, run_parallel
from hicache_ops.commands.bench.multiturn_workload import (
    CONFIGS,
    LABELS,
    MultiturnSpec,
    MultiturnWorkload,
    workload_tokens,
)
from hicache_ops.errors import InputError
from hicache_ops.results import Result

# ---------------------------------------------------------------------------------------------
# Three configurations side by side
# ---------------------------------------------------------------------------------------------


@dataclass
class MultiturnResult:
    spec: MultiturnSpec
    runs: dict[str, ConfigRun]
    workers: int
    wall_s: float
    interrupted: bool = False  # a stop request ended some configuration early or left one unstarted

    @property
    def rounds_reported(self) -> int:
        """Rounds with a figure for at least one configuration."""
        return max((run.rounds_done for run in self.runs.values()), default=0)

    @property
    def rounds_totalled(self) -> int:
        """Rounds every configuration finished: the totals cover these, so they compare like with like."""
        return min((run.rounds_done for run in self.runs.values()), default=0)

    @property
    def mode(self) -> str:
        return "accounting" if self.spec.accounting_only else "bytes"

    def prompt_tokens(self, r: int) -> int:
        return self.spec.clients * self.spec.prompt_tokens(r)

    def hit_rate(self, config: str, r: int) -> float:
        return self.runs[config].cached[r] / self.prompt_tokens(r)

    def prefilled(self, config: str, r: int) -> int:
        return self.prompt_tokens(r) - self.runs[config].cached[r]

    def ceiling_tokens(self, r: int) -> int:
        """The most a page-granular cache can hit in round r, over all clients."""
        return self.spec.clients * self.spec.history_pages(r) * self.spec.page_size

    def cliffs(self) -> dict[str, dict]:
        """Per configuration: the predicted cliff, the first round below the (paged) ceiling, and
        the first round from which the hit rate stays at zero to the end."""
        predicted = self.spec.predicted_cliffs()
        out = {}
        for name, run in self.runs.items():
            rounds = range(run.rounds_done)
            leaves = next((r for r in rounds if run.cached[r] < self.ceiling_tokens(r)), None)
            zero_from = None
            for r in reversed(rounds):
                if r == 0 or run.cached[r] != 0:
                    break
                zero_from = r
            out[name] = {"predicted": predicted.get(name), "leaves_ceiling": leaves, "zero_from": zero_from}
        return out

    def result(self) -> MultiturnReport:
        spec = self.spec
        rounds = []
        for r in range(self.rounds_reported):
            entry: dict[str, Any] = {
                "round": r,
                "prompt_tokens": self.prompt_tokens(r),
                "ceiling": spec.ceiling(r),
                "ceiling_paged": spec.ceiling_paged(r),
            }
            done = [name for name, run in self.runs.items() if r < run.rounds_done]
            entry.update({name: self.hit_rate(name, r) if name in done else None for name in self.runs})
            entry["prefilled_tokens"] = {name: self.prefilled(name, r) if name in done else None for name in self.runs}
            rounds.append(entry)
        totalled = range(self.rounds_totalled)
        total_prompt = sum(self.prompt_tokens(r) for r in totalled)
        prefilled = {name: sum(self.prefilled(name, r) for r in totalled) for name in self.runs}
        prefilled["ceiling"] = total_prompt - sum(self.ceiling_tokens(r) for r in totalled)
        configurations = {}
        for name, run in self.runs.items():
            s = run.stats
            configurations[name] = {
                "label": LABELS[name],
                "device_pages": run.device_pages,
                "host_pages": run.host_pages,
                "l3": name == "l1_l2_l3",
                "cached_tokens": sum(run.cached),
                "device_hit_tokens": sum(run.device_hit),
                "host_hit_tokens": sum(run.host_hit),
                "storage_hit_tokens": sum(run.storage_hit),
                "bytes": {
                    "device_to_host": s.get("bytes_d2h", 0),
                    "host_to_device": s.get("bytes_h2d", 0),
                    "host_to_l3": s.get("bytes_l3_write", 0),
                    "l3_to_host": s.get("bytes_l3_read", 0),
                },
                "device_evictions": s.get("device_evictions", 0),
                "host_evictions": s.get("host_evictions", 0),
                "mismatched_pages": s.get("mismatched_pages", 0),
                "elapsed_s": run.elapsed_s,
                "cpu_s": run.cpu_s,
                "prefetches": {
                    "issued": s.get("prefetches_issued", 0),
                    "rate_limited": s.get("prefetches_rate_limited", 0),
                    "revoked": s.get("prefetches_revoked", 0),
                },
                "waves": run.waves,
                "rounds_done": run.rounds_done,
            }
        return MultiturnReport(
            mode=self.mode,
            workload=spec.workload(),
            pools={
                "device_pages": spec.device_pages,
                "device_tokens": spec.device_tokens,
                "l1_rounds": spec.l1_rounds_effective,
                "host_pages": spec.host_pages,
                "host_tokens": spec.host_pages * spec.page_size,
                "hicache_ratio": spec.hicache_ratio,
                "write_policy": spec.write_policy,
            },
            rounds=rounds,
            prompt_tokens=total_prompt,
            prefilled_tokens=prefilled,
            cliffs=self.cliffs(),
            configurations=configurations,
            workers=self.workers,
            wall_s=self.wall_s,
            in_flight_rule=_in_flight_rule(spec),
            interrupted=self.interrupted,
            rounds_totalled=self.rounds_totalled,
        )


class MultiturnReport(Result):
    """`hicache bench multiturn --json`."""

    omit_if_none = ("plot",)

    mode: str = Field(description="`accounting` (the engine's bookkeeping only) or `real` (bytes moved)")
    workload: MultiturnWorkload = Field(
        description="the workload: clients, rounds, new and output tokens, page size, seed, ..."
    )
    pools: dict = Field(description="L1 and L2 sizes in pages and tokens, hicache_ratio, write_policy")
    rounds: list[dict] = Field(
        description="per round: `round`, `prompt_tokens`, `ceiling`, `ceiling_paged`, each configuration's hit "
        "rate (`null` when not run) and `prefilled_tokens` per configuration"
    )
    prompt_tokens: int = Field(description="prompt tokens over the rounds totalled")
    prefilled_tokens: dict[str, int] = Field(description="tokens prefilled per configuration, and at the ceiling")
    cliffs: dict[str, dict] = Field(
        description="per configuration: the `predicted` cliff, the round it `leaves_ceiling`, and `zero_from`"
    )
    configurations: dict[str, dict] = Field(
        description="per configuration (`l1`, `l1_l2`, `l1_l2_l3`): pool pages, hit tokens per tier, bytes per "
        "direction, evictions, prefetches, timings, rounds_done"
    )
    workers: int = Field(description="processes the configurations ran in")
    wall_s: float = Field(description="the run's wall-clock seconds")
    in_flight_rule: str = Field(description="the in-flight prefetch limit SGLang applies to these pools")
    interrupted: bool = Field(description="a stop request ended the run early")
    rounds_totalled: int = Field(description="rounds every configuration finished: the totals cover these")
    plot: str | None = Field(None, description="with --plot: the image written")


def _in_flight_rule(spec: MultiturnSpec) -> str:
    """The in-flight prefetch limit SGLang applies to these pools (docs/controller.md#in-flight-limit)."""
    from hicache_ops.sglang import policy as pol

    limit = pol.prefetch_limit_tokens(spec.sglang_version, spec.host_pages * spec.page_size, spec.device_tokens)
    return (
        f"limit {limit:,} tokens, {pol.prefetch_limit_rule(spec.sglang_version)}; {pol.retry_rule(spec.sglang_version)}"
    )


def run_multiturn(
    spec: MultiturnSpec,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
    configs: tuple[str, ...] = CONFIGS,
) -> MultiturnResult:
    """Run the workload in each configuration; accounting mode spreads them over processes.

    `workers` None: one process per configuration, up to the CPUs available, in accounting mode;
    1 (and always in real-bytes mode) runs them one after another in this process.
    """
    spec.validate()
    for name in configs:
        if name not in CONFIGS:
            raise InputError(f"configuration {name!r} is unknown.", hint=f"Use one of: {', '.join(CONFIGS)}.")
    if workers is None:
        # One process per configuration as soon as there are two CPUs: three processes on two
        # CPUs finish sooner than two at a time, since the configurations take unequal times.
        workers = len(configs) if spec.accounting_only and available_cpus() >= 2 else 1
    if not spec.accounting_only:
        workers = 1
    workers = max(1, min(workers, len(configs)))
    t0 = time.perf_counter()
    if workers == 1:
        tokens = workload_tokens(spec)
        runs = {}
        for name in configs:
            if interrupt.requested():
                break
            runs[name] = run_config(spec, name, progress, tokens)
    else:
        runs = run_parallel(spec, configs, workers, progress)
    runs = {name: runs[name] for name in configs if name in runs and runs[name].rounds_done}
    interrupted = len(runs) < len(configs) or any(run.interrupted for run in runs.values())
    if not runs:  # stopped before any round ended: no figure to report
        raise interrupt.Interrupted(
            f"bench multiturn stopped on {interrupt.reason()} before its first round ended: nothing was measured."
        )
    return MultiturnResult(spec, runs, workers, time.perf_counter() - t0, interrupted)
