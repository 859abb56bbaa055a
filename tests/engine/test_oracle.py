"""SGLang's own HiCache tree as the oracle for the engine (issue #11, differential tests).

Hypothesis generates multi-turn workloads (conversations sharing system prefixes, each turn's
prompt is the whole history: earlier prompts, their outputs and a new user message; small pools so
device and host evictions happen). Each workload is replayed through SGLang's tree (0.5.23
in-process, tests/engine/oracle_0_5_23.py; 0.5.14 in its child process, oracle_0_5_14.py, all
workloads of all policies in one child call) and through our engine (`replay_engine`, the one
place that knows the engine's API), then compared request by request.

Two families of workloads:
- `prompt_only`: every request generates one token, so SGLang keeps exactly the prompt's KV at
  finish, which is all the engine models; differences are differences of the cache rules.
- `multi_turn`: outputs of several tokens that the next turn's prompt carries.

The workloads are generated once per session (hypothesis, derandomized: the same ones every run)
and replayed in batches; a failing comparison names the smallest differing workload.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine.oracle_0_5_23 import OracleConfig

PAGE_SIZE = 4
POLICIES = ("write_through", "write_through_selective", "write_back")
VERSIONS = ("0.5.14", "0.5.23")
WORKLOADS_PER_FAMILY = 200
METRICS = ("device_hit", "host_hit", "device_evicted")


# -- the engine side: re-point this when the engine's API changes ------------------------------


def replay_engine(workload: list[dict], config: OracleConfig, version: str) -> list[dict]:
    """Serve each request's prompt through our engine; per request, the oracle's metrics.

    The engine has no notion of output tokens: a request is `prefill(prompt)`.
    """
    from hicache_ops.engine.builder import EngineSpec, build_accounting

    spec = EngineSpec(
        page_size=config.page_size, device_tokens=config.device_tokens, hicache_ratio=config.hicache_ratio,
        write_policy=config.write_policy, sglang_version=version,
    )
    cache = build_accounting(spec, l3=False)
    results = []
    for request in workload:
        evicted_before = cache.stats.device_evictions
        r = cache.prefill(request["prompt"])
        results.append({
            "device_hit": r.device_hit,
            "host_hit": r.host_hit,
            "storage_hit": r.storage_hit,
            "device_evicted": (cache.stats.device_evictions - evicted_before) * config.page_size,
        })
    return results


# -- workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A kind of workload: which of the engine's simplifications it can reach."""

    outputs: bool  # requests generate several tokens that the next turn carries (else one)
    aligned: bool  # prompts may be whole pages (else never: len % page != 0)
    device_tokens: tuple[int, ...]  # small pools force device and host eviction


FAMILIES = {
    # Big pools, one output token, prompts never whole pages: nothing but matching and the write
    # policy is exercised, where the engine is meant to agree with SGLang.
    "roomy": Family(outputs=False, aligned=False, device_tokens=(512,)),
    # The same with whole-page prompts, some sent again.
    "aligned": Family(outputs=False, aligned=True, device_tokens=(512,)),
    # Small pools: device eviction, write-back, host eviction and load-back.
    "pressure": Family(outputs=False, aligned=False, device_tokens=(32, 48, 64)),
    # Multi-turn chat: each turn's prompt is the history including the earlier outputs.
    "multi_turn": Family(outputs=True, aligned=True, device_tokens=(32, 48, 64)),
}


@st.composite
def workloads(draw, family: Family):
    device_tokens = draw(st.sampled_from(family.device_tokens))
    hicache_ratio = draw(st.sampled_from([1.5, 2.0, 3.0]))
    limit = 32  # a prompt plus its output always fits in the smallest device pool

    def unaligned(tokens):
        return tokens if family.aligned or len(tokens) % PAGE_SIZE else tokens + [999]

    prefixes = [
        draw(st.lists(st.integers(1000, 1009), min_size=0, max_size=12)) for _ in range(draw(st.integers(1, 2)))
    ]
    histories = [list(draw(st.sampled_from(prefixes))) for _ in range(draw(st.integers(1, 3)))]
    requests = []
    for _ in range(draw(st.integers(2, 10))):
        c = draw(st.integers(0, len(histories) - 1))
        user = draw(st.lists(st.integers(1, 40), min_size=1, max_size=10))
        repeat = draw(st.booleans()) and requests  # a prompt sent again (a retry, a shared question)
        n_out = draw(st.integers(2, 8)) if family.outputs else 1
        if repeat:
            prompt = list(requests[draw(st.integers(0, len(requests) - 1))]["prompt"])
        else:
            prompt = unaligned(histories[c] + user)
            if len(prompt) + n_out > limit:
                histories[c] = list(draw(st.sampled_from(prefixes)))  # the conversation ends, a new one starts
                prompt = unaligned((histories[c] + user)[: limit - n_out - 1])
        output = [2000 + len(requests) * 10 + i for i in range(n_out)]
        requests.append({"prompt": prompt, "output": output})
        if not repeat:
            histories[c] = prompt + output
    return {"device_tokens": device_tokens, "hicache_ratio": hicache_ratio, "requests": requests}


def _generate(family: Family) -> list[dict]:
    found: list[dict] = []

    @settings(
        max_examples=WORKLOADS_PER_FAMILY, derandomize=True, deadline=None, database=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck),
    )
    @given(workloads(family))
    def collect(workload):
        found.append(workload)

    collect()
    return found


@functools.cache
def generated(family: str) -> list[dict]:
    return _generate(FAMILIES[family])


def _config(workload: dict, policy: str) -> OracleConfig:
    return OracleConfig(PAGE_SIZE, workload["device_tokens"], workload["hicache_ratio"], policy)


def _oracle_jobs():
    keys, jobs = [], []
    for family in FAMILIES:
        for policy in POLICIES:
            for i, wl in enumerate(generated(family)):
                keys.append((family, policy, i))
                jobs.append((_config(wl, policy), [wl["requests"]]))
    return keys, jobs


@functools.cache
def _oracle_0_5_14_future():
    """0.5.14's child runs in the background (it waits on a subprocess) while 0.5.23 replays here."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.oracle_0_5_14 import replay_jobs

    keys, jobs = _oracle_jobs()
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(lambda: dict(zip(keys, (job[0] for job in replay_jobs(jobs)))))
    pool.shutdown(wait=False)
    return future


@functools.cache
def oracle_results(version: str) -> dict:
    """{(family, policy, index): per-request results} for every generated workload."""
    future = _oracle_0_5_14_future()
    if version == "0.5.14":
        return future.result()
    from engine.oracle_0_5_23 import replay

    keys, jobs = _oracle_jobs()
    return dict(zip(keys, (replay(workloads, config)[0] for config, workloads in jobs)))


@functools.cache
def engine_results(version: str, family: str, policy: str) -> list[list[dict]]:
    return [replay_engine(wl["requests"], _config(wl, policy), version) for wl in generated(family)]


# -- comparison -------------------------------------------------------------------------------


@dataclass
class Difference:
    index: int
    request: int
    metric: str
    sglang: int
    engine: int
    workload: dict

    def describe(self) -> str:
        reqs = self.workload["requests"]
        shown = "\n".join(
            f"  #{j}: prompt={r['prompt']} output={len(r['output'])} tokens" for j, r in enumerate(reqs[: self.request + 1])
        )
        return (
            f"workload {self.index} (device {self.workload['device_tokens']} tokens, ratio "
            f"{self.workload['hicache_ratio']}, page {PAGE_SIZE}), request #{self.request}: {self.metric} "
            f"SGLang {self.sglang} vs engine {self.engine}\n{shown}"
        )


def differences(version: str, family: str, policy: str, metric: str) -> list[Difference]:
    oracle = oracle_results(version)
    engine = engine_results(version, family, policy)
    found = []
    for i, wl in enumerate(generated(family)):
        ours, theirs = engine[i], oracle[(family, policy, i)]
        for j, (a, b) in enumerate(zip(theirs, ours)):
            if a[metric] != b[metric]:
                found.append(Difference(i, j, metric, a[metric], b[metric], wl))
                break
    return found


def check(version: str, family: str, policy: str, metric: str) -> None:
    found = differences(version, family, policy, metric)
    if found:
        smallest = min(found, key=lambda d: (d.request, sum(len(r["prompt"]) for r in d.workload["requests"][: d.request + 1])))
        pytest.fail(
            f"{len(found)} of {len(generated(family))} workloads differ from SGLang {version} ({policy}, {metric}); "
            f"the smallest:\n{smallest.describe()}",
            pytrace=False,
        )


# -- the generator itself ---------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_workloads_exercise_the_tiers(family):
    """The generated workloads hit the device and host tiers and evict under SGLang 0.5.23; a
    generator that drifted into trivial workloads would make every comparison below vacuous."""
    oracle = oracle_results("0.5.23")
    totals = {m: 0 for m in METRICS}
    for policy in POLICIES:
        for i in range(len(generated(family))):
            for r in oracle[(family, policy, i)]:
                for m in METRICS:
                    totals[m] += r[m]
    assert len(generated(family)) >= WORKLOADS_PER_FAMILY
    assert all(totals[m] > 0 for m in METRICS), totals
