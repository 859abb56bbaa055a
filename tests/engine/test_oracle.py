"""SGLang's own HiCache tree as the oracle for the engine (issue #11, differential tests).

Hypothesis draws the workloads, in a process of their own (oracle_workloads.py says why; profile
"ci": the same ones every run; "deep": fresh ones, 1,000 per family): conversations sharing
system prefixes whose turns carry the whole history, prompts sent again, pools small enough to
evict, several page sizes, LRU and LFU, namespaces. Each workload is replayed through SGLang's
own tree and controller (0.5.23 in this process, tests/engine/oracle_0_5_23.py; 0.5.14 in a child
process, oracle_0_5_14.py, running alongside), with SGLang's file backend as L3 in the storage
families, and through our engine's `request(prompt, output)` (`replay_engine`, the one place that
knows the engine's API), then compared request by request: hits per tier and the state the
request leaves (METRICS; docs/oracle.md says which parts of the comparison are SGLang's code and
which are ours).

Families (FAMILIES) each name what they exist to reach; `test_family_reaches_its_paths` asserts
it per family, write policy and version, and that the roomy families never evict or load back.

Every comparison agrees; none is expected to differ. The `*_minimal_example` tests pin each rule
that once separated the engine from SGLang to a hand-written workload, checked against SGLang's
tree and the engine alike. A failing comparison names the smallest differing workload.

What was found while building this (observations, corrections of earlier notes):
- `pin_memory=False` on the host pool is not the only change 0.5.23 needs on CPU: the "direct"
  I/O backend's `transfer_kv_direct` is a CUDA op too (oracle_0_5_23.py says what replaces it).
- A scheduler allocation in 0.5.23 evicts through `evict_for_alloc`, and both versions' load-back
  evicts inside the tree: counting only what the oracle's own `evict` calls return misses the
  load-back's evictions, so the oracles count every eviction the tree reports.
- The device pool has device_tokens / page_size pages for requests (the allocator's padding page
  comes on top); the host pool int(device_tokens x ratio) // page_size + 1 pages, both versions.
- 0.5.23 with a storage backend needs the process's ranks stated (`get_parallel()`), and builds
  its native page hash (a torch extension) on the first storage key: the oracle builds it before
  the first bounded wait.
- Issue 22 found by the state comparison: 0.5.23 write_back drops a device leaf whose backup gets
  no host page (with its host-only descendants); the engine kept it on the device and refused the
  next prompt ("cannot hold 7 more pages"). Fixed in the engine; pinned by
  `write_back_drop_0_5_23`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import astuple, dataclass
from pathlib import Path

import pytest

from engine.oracle_0_5_23 import OracleConfig
from engine.oracle_workloads import DEEP, FAMILIES, STORAGE_PREFETCH_THRESHOLD, VERSIONS, count

PAGE_SIZE = 4  # the minimal examples' page size; families choose their own
# HiRadixCache releases after 0.5.14 whose tree 0.5.14's child script drives unchanged
# (oracle_0_5_14.replay_jobs(version=...), tests/sglang_release.py): replayed on the minimal
# examples and on the first RELEASE_WORKLOADS workloads of RELEASE_FAMILIES (190 jobs: 70 s measured
# on a loaded 2-core machine, in a child running beside the others).
RELEASE_ORACLES = ("0.5.15",)
RELEASE_FAMILIES = ("pressure", "multi_turn", "page_16", "namespaces")
RELEASE_WORKLOADS = 15
ORACLE_VERSIONS = (*VERSIONS, *RELEASE_ORACLES)
DEEP_STORAGE_CHILDREN = 4
# Per request: hits (device, host, L3), what serving it evicted (device tokens; host tokens freed:
# host eviction, write_back's reclaim and drop) and the state it left (device and
# host pool tokens in use, pages in L3).
HITS = ("device_hit", "host_hit", "storage_hit")
STATE = ("device_evicted", "host_freed", "device_used", "host_used")
METRICS = (*HITS, *STATE, "l3_pages")


# -- the engine side: re-point this when the engine's API changes ------------------------------


def replay_engine(workload: list[dict], config: OracleConfig, version: str) -> list[dict]:
    """Serve each request (its prompt, then its output tokens) through our engine; per request,
    the oracle's metrics.

    The pools are SGLang's: the device allocator hands out device_tokens / page_size pages (its
    padding page comes on top), the host pool int(device_tokens x ratio) // page_size + 1 pages
    (docs/host-pool.md). The L3 answers at once; wait_complete, as the 0.5.14 oracle reads it.
    """
    from hicache_ops.engine.cache import TieredCache
    from hicache_ops.engine.config import CacheConfig
    from hicache_ops.engine.planes import AccountingPlane, MemoryL3
    from hicache_ops.sglang.page_keys import ObjectKeyScheme

    ps = config.page_size
    cfg = CacheConfig(
        page_size=ps,
        device_pages=config.device_tokens // ps,
        host_pages=int(config.device_tokens * config.hicache_ratio) // ps + 1,
        write_policy=config.write_policy,
        sglang_version=version,
        stop_policy="wait_complete",
        prefetch_threshold=config.prefetch_threshold,
        eviction_policy=config.eviction_policy,
    )
    scheme = ObjectKeyScheme(version)
    l3 = MemoryL3([scheme], 1) if config.storage else None
    cache = TieredCache(cfg, AccountingPlane(1), l3)
    results = []
    for request in workload:
        r = cache.request(request["prompt"], request["output"], extra_key=request.get("extra_key"))
        result = {
            "device_hit": r.device_hit,
            "host_hit": r.host_hit,
            "storage_hit": r.storage_hit,
            "device_evicted": r.device_evicted_pages * ps,
            "host_freed": r.host_evicted_pages * ps,
            "device_used": cache.device.used * ps,
            "host_used": cache.host.used * ps,
        }
        if l3 is not None:  # SGLang's file backend keeps one file per page, ours K and V objects
            result["l3_pages"] = len(l3.objects) // len(scheme.suffixes)
        results.append(result)
    return results


# -- workloads (drawn in a process of their own: oracle_workloads.py says why) ------------------


@functools.cache
def _drawn() -> dict[str, list[dict]]:
    script = Path(__file__).with_name("oracle_workloads.py")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"drawing the oracle's workloads failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def generated(family: str) -> list[dict]:
    return _drawn()[family]


def replays(version: str, family: str) -> bool:
    """Whether `version`'s oracle replays `family` (a release oracle: the few RELEASE_FAMILIES)."""
    if version in RELEASE_ORACLES:
        return family in RELEASE_FAMILIES
    return version in FAMILIES[family].versions


def workloads(version: str, family: str) -> list[dict]:
    """The family's workloads `version`'s oracle replays (a release oracle: the first few)."""
    drawn = generated(family)
    return drawn[:RELEASE_WORKLOADS] if version in RELEASE_ORACLES else drawn


# What a family can be required to reach, read from SGLang's results of one workload.
REACHES = {
    "device_hit": lambda reqs: any(r["device_hit"] for r in reqs),
    "host_hit": lambda reqs: any(r["host_hit"] for r in reqs),
    "storage_hit": lambda reqs: any(r["storage_hit"] for r in reqs),
    "device_evicted": lambda reqs: any(r["device_evicted"] for r in reqs),
    "host_freed": lambda reqs: any(r["host_freed"] for r in reqs),
    # A prefetch anchored below the root: an L3 read continuing a device or host prefix.
    "anchored_storage_hit": lambda reqs: any(r["storage_hit"] and r["device_hit"] + r["host_hit"] for r in reqs),
}
# Paths a family's generator does not reach under one write policy in the ci draw (measured; the
# family's other policies reach them): write_through_selective backs a node up only at its second
# hit, so host pressure and L3 copies come late; LFU keeps the revisited prompts.
NOT_REACHED = {
    ("lfu", "write_through"): ("host_freed",),
    ("lfu", "write_through_selective"): ("host_hit", "host_freed"),
    ("lfu", "write_back"): ("host_freed",),
    ("page_64", "write_through_selective"): ("host_freed",),
    # Its 20 ci workloads evict host nodes only under 0.5.14 since allocations ask for a page more
    # than the prompt (SGLang's extend demand): the device evicts earlier and host fills less.
    ("storage_anchor", "write_through_selective"): ("storage_hit", "anchored_storage_hit", "host_freed"),
}
# What a family must never reach, whatever the policy and version (its pools are too big).
NEVER = {"roomy": ("host_hit", "device_evicted", "host_freed"), "aligned": ("host_hit", "device_evicted", "host_freed")}


# 0.5.14's tree fails its own assertion "parent does not have child key" in evict_host (load_back
# -> evict -> write_backup(write_back=True) -> evict_host) when write_back meets a host pool of
# 1.25 x the device: families that 0.5.14 replays give write_back at least this ratio.
WRITE_BACK_MIN_RATIO_0_5_14 = 1.5


def _config(workload: dict, policy: str, family: str) -> OracleConfig:
    f = FAMILIES[family]
    ratio = workload["hicache_ratio"]
    if policy == "write_back" and "0.5.14" in f.versions:
        ratio = max(ratio, WRITE_BACK_MIN_RATIO_0_5_14)
    return OracleConfig(
        f.page_size,
        workload["device_tokens"],
        ratio,
        policy,
        storage=f.storage,
        prefetch_threshold=STORAGE_PREFETCH_THRESHOLD if f.storage else 256,
        eviction_policy=f.eviction_policy,
    )


def _request(prompt, outputs: int) -> dict:
    return {"prompt": list(prompt), "output": [3000 + i for i in range(outputs)]}


@dataclass(frozen=True)
class Example:
    """A minimal workload pinning one rule: SGLang's value of `metric` at request `at`."""

    config: OracleConfig
    requests: tuple
    at: int
    metric: str
    sglang: dict  # version -> the value SGLang's tree gives


_A13 = list(range(1, 14))
EXAMPLES = {
    # A repeated whole-page prompt: the match stops at len - 1, the last page is recomputed.
    "match_cap": Example(
        OracleConfig(PAGE_SIZE, 512, 2.0, "write_through"),
        (_request([1, 2, 3, 4], 1),) * 2,
        1,
        "device_hit",
        {"0.5.14": 0, "0.5.15": 0, "0.5.23": 0},
    ),
    # 8 device pages; 19 tokens leave 4 pages in the tree; 17 unrelated tokens need 5 pages.
    "device_room": Example(
        OracleConfig(PAGE_SIZE, 32, 2.0, "write_through"),
        (_request(range(100, 119), 1), _request(range(200, 217), 1)),
        1,
        "device_evicted",
        {"0.5.14": 16, "0.5.15": 16, "0.5.23": 16},
    ),
    # A second turn carries the first turn's prompt and 3 of its 4 output tokens (9 cached tokens).
    "outputs": Example(
        OracleConfig(PAGE_SIZE, 512, 2.0, "write_through"),
        (_request(range(1, 7), 4), _request(list(range(1, 7)) + [3000, 3001, 3002, 3003, 50], 1)),
        1,
        "device_hit",
        {"0.5.14": 8, "0.5.15": 8, "0.5.23": 8},
    ),
    # 13 tokens and 2 output tokens: 3 pages; an unrelated 21-token prompt evicts them; the first
    # prompt again. 0.5.14 backed the 3 pages up at the first request's finish (its second insert).
    "selective_0_5_14": Example(
        OracleConfig(PAGE_SIZE, 32, 2.0, "write_through_selective"),
        (_request(_A13, 2), _request(range(100, 121), 1), _request(_A13, 1)),
        2,
        "host_hit",
        {"0.5.14": 12, "0.5.15": 12, "0.5.23": 0},
    ),
    # 11 host pages. 4- and 3-page prompts, then a 6-page one evicts both from the device; its
    # backup finds 4 host pages free. 0.5.14 asks host eviction for all 6 pages (both prompts go),
    # 0.5.23 for the 2 missing (the older prompt goes): the 3-page prompt again.
    "host_eviction_0_5_14": Example(
        OracleConfig(PAGE_SIZE, 32, 1.25, "write_through"),
        (
            _request(range(300, 318), 1),
            _request(range(400, 414), 1),
            _request(range(100, 127), 1),
            _request(range(400, 414), 1),
        ),
        3,
        "host_hit",
        {"0.5.14": 0, "0.5.15": 0, "0.5.23": 12},
    ),
    # 9 device pages. A 5-page prompt leaves the device for a 3-page one (whose allocation asks
    # for its 4 pages and one more); a 2-page one leaves 4 pages free; the first prompt's 5 host
    # pages load back: 0.5.14 evicts as much as it loads (both resident prompts), 0.5.23 the page
    # missing (the older one, 3 pages), and its last partial page then fits without eviction.
    "load_back_0_5_14": Example(
        OracleConfig(PAGE_SIZE, 36, 3.0, "write_through"),
        (
            _request(range(500, 523), 1),
            _request(range(100, 115), 1),
            _request(range(200, 209), 1),
            _request(range(500, 523), 1),
        ),
        3,
        "device_evicted",
        {"0.5.14": 20, "0.5.15": 20, "0.5.23": 12},
    ),
    # Issue 22, divergence 5. A 3-page prompt, an unrelated 2-page one, then a prompt sharing the
    # first one's first page: the match splits it, and SGLang stamps the split-off 2-page tail as
    # accessed. An unrelated prompt then needs 2 pages: the older unrelated prompt leaves (not the
    # tail), so sending it again finds nothing on the device.
    "split_tail_stamp": Example(
        OracleConfig(PAGE_SIZE, 32, 2.0, "write_through"),
        (
            _request(range(1, 14), 1),
            _request(range(100, 109), 1),
            _request([1, 2, 3, 4, *range(200, 209)], 1),
            _request(range(300, 309), 1),
            _request(range(100, 109), 1),
        ),
        4,
        "device_hit",
        {"0.5.14": 0, "0.5.15": 0, "0.5.23": 0},
    ),
    # 8 device pages, 11 host pages, write_back. A 6-page prompt leaves the device for another
    # (backed up as it leaves: 6 host pages); the first comes back from host, and the second can
    # get no host page as it leaves (5 free, host eviction finds only the locked load-back): from
    # 0.5.15 SGLang drops it from the tree (`_drop_subtree_no_host`: 0.5.15's HiRadixCache, 0.5.23's
    # UnifiedRadixCache) rather than keep it on the device, so it is computed again. (0.5.14 fails
    # its own assertion in evict_host on this workload.)
    "write_back_drop_0_5_23": Example(
        OracleConfig(PAGE_SIZE, 32, 1.25, "write_back"),
        (
            _request(range(100, 126), 1),
            _request(range(300, 325), 1),
            _request(range(100, 126), 1),
            _request(range(300, 325), 1),
        ),
        3,
        "host_hit",
        {"0.5.15": 0, "0.5.23": 0},
    ),
    # 8 device pages, 12 host pages, write_back. A (5 pages + 3 tokens), B and C (2 + 2 each), D
    # (5 + 3), then A again, whose load-back's device eviction backs up what it evicts. SGLang
    # 0.5.14 does not protect the host copy it is loading, so evict_host may free A's own copy
    # (36 tokens freed at A's second request; the load then reads host slots another backup was
    # given). 0.5.15 protects the loading nodes (`protect_host`): 16. 0.5.23 asks host eviction
    # for the shortfall only: 8. The engine follows 0.5.15 for 0.5.14 (16; strict xfail in the
    # engine's test, ENGINE_EXAMPLE_DIVERGENCES): it protects A, as 0.5.15 does.
    "load_back_frees_its_own_host_copy_0_5_14": Example(
        OracleConfig(PAGE_SIZE, 32, 1.5, "write_back"),
        (
            _request(range(100, 123), 1),
            _request(range(200, 210), 1),
            _request(range(300, 310), 1),
            _request(range(400, 423), 1),
            _request(range(100, 123), 1),
            _request(range(300, 310), 1),
        ),
        4,
        "host_freed",
        {"0.5.14": 36, "0.5.15": 16, "0.5.23": 8},
    ),
    # 8 device pages, 10 host pages, write_back. A (6 pages + 3 tokens), then B and C (3 pages + 2
    # each) push it to host (6 host pages); A again: its load-back evicts B and C, backed up as
    # they leave, with 4 host pages free. 0.5.15 holds B's fresh copy out of host eviction for
    # the rest of the pass (`_evict_write_back`, `protect_host`), so host eviction frees nothing
    # for C's backup (0). 0.5.23 demotes each victim at once, and C's backup frees B's copy (12).
    # Without the held victims (policy.defers_write_back_victims) the engine freed it under
    # 0.5.15 too (12). (0.5.14 frees 24 here, its load-back bug above; the engine 12.)
    "write_back_victims_held_for_the_pass": Example(
        OracleConfig(PAGE_SIZE, 32, 1.25, "write_back"),
        (
            _request(range(100, 127), 1),
            _request(range(200, 214), 1),
            _request(range(400, 414), 1),
            _request(range(100, 127), 1),
        ),
        3,
        "host_freed",
        {"0.5.15": 0, "0.5.23": 12},
    ),
    # Page 1, 32 device tokens, 49 host tokens, write_back. A (25 tokens), then B (27) pushes A to
    # host; B again splits B into P (26) and its 1-token tail C. A again: its load-back evicts C
    # (backed up: 23 host tokens left) and then P, whose backup finds no host room (host eviction
    # sees only A, being loaded, and C, held for the pass). 0.5.15 releases the pass's held victims
    # before it drops (`flush_staged` before `_drop_subtree_no_host`): P and C leave the tree and A
    # loads back (24). Holding C to the pass's end would make the drop decline, P stay, and the
    # load-back find no room (0). 0.5.23 drops too (24). 0.5.14 drops nothing yet serves A from
    # host; the engine refuses the prompt there (strict xfail: the 0.5.14 page_1 divergence).
    "write_back_drop_releases_held_victims": Example(
        OracleConfig(1, 32, 1.5, "write_back"),
        (
            _request(range(5000, 5025), 1),
            _request(range(4000, 4027), 1),
            _request(range(4000, 4027), 1),
            _request(range(5000, 5025), 1),
        ),
        3,
        "host_hit",
        {"0.5.14": 24, "0.5.15": 24, "0.5.23": 24},
    ),
}


def _oracle_jobs(version: str):
    keys, jobs = [], []
    for family, f in FAMILIES.items():
        if not replays(version, family):
            continue
        for policy in f.policies:
            for i, wl in enumerate(workloads(version, family)):
                keys.append((family, policy, i))
                jobs.append((_config(wl, policy, family), [wl["requests"]]))
    for name, example in EXAMPLES.items():
        if version not in example.sglang:
            continue
        keys.append(("example", name, 0))
        jobs.append((example.config, [list(example.requests)]))
    return keys, jobs


@functools.cache
def _oracle_0_5_14_future():
    """0.5.14's child runs in the background (it waits on a subprocess) while 0.5.23 replays here."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.oracle_0_5_14 import replay_jobs

    keys, jobs = _oracle_jobs("0.5.14")
    # The deep profile splits the storage jobs over DEEP_STORAGE_CHILDREN more children: 0.5.14's
    # controller spends about a second per cache with a storage backend mostly waiting.
    parts = [[k for k, job in enumerate(jobs) if not job[0].storage]]
    storage = [k for k, job in enumerate(jobs) if job[0].storage]
    if DEEP:
        parts += [storage[i::DEEP_STORAGE_CHILDREN] for i in range(DEEP_STORAGE_CHILDREN)]
    else:
        parts[0] += storage
    timeout = 4 * 3600 if DEEP else 900

    def run(part):
        results = replay_jobs([jobs[k] for k in part], timeout=timeout)
        return {keys[k]: r[0] for k, r in zip(part, results, strict=True)}

    pool = ThreadPoolExecutor(max_workers=len(parts))
    futures = [pool.submit(run, part) for part in parts if part]
    future = pool.submit(lambda: {key: r for f in futures for key, r in f.result().items()})
    pool.shutdown(wait=False)
    return future


@functools.cache
def _release_future(version: str):
    """A release oracle's child (0.5.14's script on that release's tree), in the background."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.oracle_0_5_14 import replay_jobs

    keys, jobs = _oracle_jobs(version)
    pool = ThreadPoolExecutor(max_workers=1)

    def run():
        results = replay_jobs(jobs, timeout=900, version=version)
        return {key: r[0] for key, r in zip(keys, results, strict=True)}

    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


@functools.cache
def oracle_results(version: str) -> dict:
    """{(family, policy, index): per-request results} for every generated workload."""
    future = _oracle_0_5_14_future()
    releases = {v: _release_future(v) for v in RELEASE_ORACLES}
    if version in releases:
        oracle_results("0.5.23")  # replayed here while the children run
        return releases[version].result()
    if version == "0.5.14":
        oracle_results("0.5.23")  # replayed here while the 0.5.14 child runs
        return future.result()
    from engine.oracle_0_5_23 import replay

    keys, jobs = _oracle_jobs(version)
    # Grouped by configuration: the process-wide server arguments are published once per group.
    order = sorted(range(len(jobs)), key=lambda k: astuple(jobs[k][0]))
    return {keys[k]: replay(jobs[k][1], jobs[k][0])[0] for k in order}


@functools.cache
def engine_results(version: str, family: str, policy: str) -> list[list[dict]]:
    return [replay_engine(wl["requests"], _config(wl, policy, family), version) for wl in workloads(version, family)]


# -- comparison -------------------------------------------------------------------------------


def _runs_of(tokens: list[int]) -> str:
    """Token ids with runs of consecutive ids shown as first..last (a 400-token prompt on one line)."""
    parts: list[str] = []
    start = 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or tokens[i] != tokens[i - 1] + 1:
            run = tokens[start:i]
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}..{run[-1]}")
            start = i
    return "[" + ", ".join(parts) + "]"


@dataclass
class Difference:
    index: int
    request: int
    metric: str
    sglang: int
    engine: int
    workload: dict
    page_size: int

    def describe(self) -> str:
        reqs = self.workload["requests"]
        shown = "\n".join(
            f"  #{j}: prompt={_runs_of(r['prompt'])} output={len(r['output'])} tokens"
            + (f" extra_key={r['extra_key']}" if "extra_key" in r else "")
            for j, r in enumerate(reqs[: self.request + 1])
        )
        return (
            f"workload {self.index} (device {self.workload['device_tokens']} tokens, ratio "
            f"{self.workload['hicache_ratio']}, page {self.page_size}), request #{self.request}: {self.metric} "
            f"SGLang {self.sglang} vs engine {self.engine}\n{shown}"
        )


def differences(version: str, family: str, policy: str, metric: str) -> list[Difference]:
    oracle = oracle_results(version)
    engine = engine_results(version, family, policy)
    found = []
    for i, wl in enumerate(workloads(version, family)):
        ours, theirs = engine[i], oracle[(family, policy, i)]
        if isinstance(theirs, dict):  # SGLang 0.5.14 failed its own assertion on this workload
            continue
        for j, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            if a[metric] != b[metric]:
                found.append(Difference(i, j, metric, a[metric], b[metric], wl, FAMILIES[family].page_size))
                break
    return found


def check(version: str, family: str, policy: str, metric: str) -> None:
    found = differences(version, family, policy, metric)
    total = len(workloads(version, family))
    if found:
        smallest = min(
            found, key=lambda d: (d.request, sum(len(r["prompt"]) for r in d.workload["requests"][: d.request + 1]))
        )
        pytest.fail(
            f"{len(found)} of {total} workloads differ from SGLang {version} ({policy}, {metric}); "
            f"the smallest:\n{smallest.describe()}",
            pytrace=False,
        )


def _runs():
    for version in ORACLE_VERSIONS:
        for family, f in FAMILIES.items():
            if replays(version, family):
                for policy in f.policies:
                    yield version, family, policy


# -- the generator itself ---------------------------------------------------------------------


@pytest.mark.parametrize("version, family, policy", [pytest.param(*r, id="-".join(r)) for r in _runs()])
def test_family_reaches_its_paths(version, family, policy):
    """Per family, write policy and version (not summed): SGLang's own code reaches every path the
    family exists for on some workload, and a family whose pools are roomy never evicts or loads
    back. A generator that drifted into trivial workloads would make the comparisons vacuous. A
    release oracle's few workloads are summed over the family's write policies."""
    f = FAMILIES[family]
    oracle = oracle_results(version)
    results = [oracle[(family, policy, i)] for i in range(len(workloads(version, family)))]
    assert len(results) == (RELEASE_WORKLOADS if version in RELEASE_ORACLES else count(f))
    runs = [r for r in results if not isinstance(r, dict)]
    # 0.5.14's tree fails its own evict_host assertion on some write_back workloads (the child
    # accepts only that failure): they are left out of the comparison, never most of them.
    assert len(runs) * 2 > len(results), f"SGLang failed {len(results) - len(runs)} of {len(results)} workloads"
    if version in RELEASE_ORACLES:  # a small draw: the family's policies together reach its paths
        runs = [r for p in f.policies for i in range(len(results)) if not isinstance(r := oracle[(family, p, i)], dict)]
    reached = {path: sum(REACHES[path](reqs) for reqs in runs) for path in REACHES}
    missing = [path for path in f.reaches if not reached[path] and path not in NOT_REACHED.get((family, policy), ())]
    assert not missing, f"{family} ({policy}, SGLang {version}) never reaches {missing}; workloads per path: {reached}"
    unexpected = [path for path in NEVER.get(family, ()) if reached[path]]
    assert not unexpected, f"{family} ({policy}, SGLang {version}) reaches {unexpected}: {reached}"


# -- SGLang vs the engine ---------------------------------------------------------------------


def _metrics(family: str) -> tuple[str, ...]:
    return METRICS if FAMILIES[family].storage else (*HITS[:2], *STATE)


# Divergences the state comparison found and this branch does not fix (reported on issue 22): the
# comparison still runs and must fail (strict xfail) until the engine follows SGLang.
_LOAD_BACK_FREES_ITS_OWN_HOST_COPY_0_5_14 = (
    "SGLang 0.5.14 write_back: a load-back's own device eviction can free the host copy it is loading "
    "(no protect_host before evict; fixed in 0.5.15); the engine protects it "
    "(docs/oracle.md#known-divergences)"
)
_HOST_EVICTION_WRITE_BACK = (
    "write_back under host pressure: the engine frees other host nodes than SGLang when a write_back "
    "backup or a load-back needs host pages (docs/oracle.md#known-divergences)"
)
_REFUSED_WRITE_BACK_0_5_14 = (
    "0.5.14 write_back under host pressure: the engine refuses a prompt (CapacityError, no device "
    "leaf it can evict) that SGLang 0.5.14 serves (docs/oracle.md#known-divergences)"
)
_HOST_STATE = ("host_freed", "host_used")
_ALL = ("device_hit", "host_hit", "device_evicted", "host_freed", "device_used", "host_used")
KNOWN_DIVERGENCES = {
    **{
        ("0.5.14", f, "write_back", m): _LOAD_BACK_FREES_ITS_OWN_HOST_COPY_0_5_14
        for f in ("pressure", "multi_turn", "page_16")
        for m in ("host_freed", "host_used")
    },
    **{("0.5.14", "namespaces", "write_back", m): _LOAD_BACK_FREES_ITS_OWN_HOST_COPY_0_5_14 for m in _ALL},
    **{("0.5.14", "page_64", "write_back", m): _LOAD_BACK_FREES_ITS_OWN_HOST_COPY_0_5_14 for m in _HOST_STATE},
    **{("0.5.14", "page_1", "write_back", m): _REFUSED_WRITE_BACK_0_5_14 for m in _ALL},
    **{("0.5.23", "page_1", "write_back", m): _HOST_EVICTION_WRITE_BACK for m in ("host_freed", "host_used")},
}


def _cases():
    for version, family, policy in _runs():
        for metric in _metrics(family):
            known = KNOWN_DIVERGENCES.get((version, family, policy, metric))
            # Strict in the ci draw (a case that starts to agree must leave the list); the deep
            # draw's fresh workloads may or may not hit a listed divergence.
            marks = [pytest.mark.xfail(strict=not DEEP, reason=known)] if known else []
            yield pytest.param(version, family, policy, metric, id=f"{version}-{family}-{policy}-{metric}", marks=marks)


@pytest.mark.parametrize("version, family, policy, metric", list(_cases()))
def test_engine_matches_sglang(version, family, policy, metric):
    """Request by request, the engine's metric equals SGLang's own tree's on every workload."""
    check(version, family, policy, metric)


# -- minimal examples -------------------------------------------------------------------------


_EXAMPLE_CASES = [
    pytest.param(n, v, id=f"{n}-{v}") for n, e in EXAMPLES.items() for v in ORACLE_VERSIONS if v in e.sglang
]
# Examples that pin an SGLang behaviour the engine does not follow (strict: must keep failing).
ENGINE_EXAMPLE_DIVERGENCES = {
    ("load_back_frees_its_own_host_copy_0_5_14", "0.5.14"): _LOAD_BACK_FREES_ITS_OWN_HOST_COPY_0_5_14,
    ("write_back_drop_releases_held_victims", "0.5.14"): _REFUSED_WRITE_BACK_0_5_14,
}
_ENGINE_EXAMPLE_CASES = [
    pytest.param(
        *case.values,
        id=case.id,
        marks=[pytest.mark.xfail(strict=True, reason=ENGINE_EXAMPLE_DIVERGENCES[case.values])]
        if case.values in ENGINE_EXAMPLE_DIVERGENCES
        else [],
    )
    for case in _EXAMPLE_CASES
]


@pytest.mark.parametrize("name, version", _EXAMPLE_CASES)
def test_sglang_minimal_example(name, version):
    """SGLang's tree gives the value each example names (the rule its comment states)."""
    example = EXAMPLES[name]
    got = oracle_results(version)[("example", name, 0)][example.at][example.metric]
    assert got == example.sglang[version]


@pytest.mark.parametrize("name, version", _ENGINE_EXAMPLE_CASES)
def test_engine_minimal_example(name, version):
    """The engine follows the rule each example pins."""
    example = EXAMPLES[name]
    ours = replay_engine(list(example.requests), example.config, version)[example.at][example.metric]
    assert ours == example.sglang[version]
