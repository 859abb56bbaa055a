"""The oracle's workloads (tests/engine/test_oracle.py), drawn by Hypothesis in a process of their own.

Why a process of its own: Hypothesis mixes into its draws constants it reads from every local
(non-installed) module in `sys.modules` (hypothesis/internal/conjecture/providers.py,
`_get_local_constants`). In a pytest-xdist worker that already ran other test modules, the same
derandomized strategy therefore drew other workloads than in a run of test_oracle.py alone, and
the assertions that depend on the draw (each family reaches its paths; strict xfails) failed
there only. Run as a script this module imports nothing local but itself, so the "ci" draw is the
same in every context; `make test-deep` (HYPOTHESIS_PROFILE=deep) draws fresh workloads here too.

    python tests/engine/oracle_workloads.py   ->   {"family": [workload, ...], ...} on stdout

Nothing here may import from the repository: an import would change the draw.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

POLICIES = ("write_through", "write_through_selective", "write_back")
VERSIONS = ("0.5.14", "0.5.23")
# `make test` (profile "ci") draws the same workloads every run; `make test-deep`
# (HYPOTHESIS_PROFILE=deep) draws fresh ones, DEEP_WORKLOADS per family, for both versions.
DEEP = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "deep"
DEEP_WORKLOADS = 1000
STORAGE_PREFETCH_THRESHOLD = 8  # tokens: small prompts reach it (page 4)


@dataclass(frozen=True)
class Family:
    """A kind of workload, and the paths of SGLang's code it exists to reach."""

    outputs: bool  # requests generate several tokens that the next turn carries (else one)
    aligned: bool  # prompts may be whole pages (else never: len % page != 0)
    device_units: tuple[int, ...]  # the device pool, in units of max(page, 4) tokens (8: one prompt)
    reaches: tuple[str, ...]  # REACHES entries every (policy, version) of the family must reach
    storage: bool = False  # an L3 tier: SGLang's file backend, read with wait_complete
    hicache_ratios: tuple[float, ...] = (1.5, 2.0, 3.0)
    policies: tuple[str, ...] = POLICIES
    versions: tuple[str, ...] = VERSIONS
    page_size: int = 4
    eviction_policy: str = "lru"
    extra_keys: bool = False  # conversations in namespaces (extra_key), some shared
    shared_prefix: bool = False  # storage revisits: prompts share a first page or two
    # Half the workloads are revisits (distinct prompts cycled through pools too small for them):
    # host hits and host eviction, which conversations alone seldom reach.
    mixed_revisits: bool = False

    def __post_init__(self):
        if self.mixed_revisits and self.hicache_ratios == (1.5, 2.0, 3.0):
            object.__setattr__(self, "hicache_ratios", (1.25, 1.5, 2.0))  # host pressure too

    ci_workloads: int = 200  # generated in the ci profile (the deep one: DEEP_WORKLOADS)

    @property
    def unit(self) -> int:
        return max(self.page_size, 4)


PRESSURE = ("device_hit", "host_hit", "device_evicted", "host_freed")

FAMILIES = {
    # Big pools, one output token, prompts never whole pages: nothing but matching and the write
    # policy is exercised. Never evicts, never loads back (asserted: NEVER).
    "roomy": Family(outputs=False, aligned=False, device_units=(128,), reaches=("device_hit",)),
    # The same with whole-page prompts, some sent again (the len - 1 match cap).
    "aligned": Family(outputs=False, aligned=True, device_units=(128,), reaches=("device_hit",)),
    # Small pools: device eviction, write-back, host eviction and load-back.
    "pressure": Family(outputs=False, aligned=False, device_units=(8, 12, 16), reaches=PRESSURE, mixed_revisits=True),
    # Multi-turn chat: each turn's prompt is the history including the earlier outputs.
    "multi_turn": Family(outputs=True, aligned=True, device_units=(8, 12, 16), reaches=PRESSURE, mixed_revisits=True),
    # Other page sizes (1 has no partial page: every prompt is whole pages).
    "page_1": Family(
        outputs=True,
        aligned=True,
        device_units=(8, 12),
        reaches=PRESSURE,
        page_size=1,
        ci_workloads=60,
        mixed_revisits=True,
    ),
    "page_16": Family(
        outputs=True,
        aligned=False,
        device_units=(8, 12),
        reaches=PRESSURE,
        page_size=16,
        ci_workloads=60,
        mixed_revisits=True,
    ),
    "page_64": Family(
        outputs=False,
        aligned=False,
        device_units=(8, 12),
        reaches=PRESSURE,
        page_size=64,
        # 40 never freed a host page under write_back in the ci draw; 80 do in 19 workloads.
        ci_workloads=80,
        mixed_revisits=True,
    ),
    # LFU eviction (CacheInitParams.eviction_policy): prompts sent again gain hits.
    "lfu": Family(
        outputs=True,
        aligned=False,
        device_units=(8, 12, 16),
        reaches=PRESSURE,
        eviction_policy="lfu",
        ci_workloads=100,
    ),
    # Namespaces: the same tokens under different extra_keys are different prefixes.
    "namespaces": Family(
        outputs=False,
        aligned=False,
        device_units=(8, 12),
        reaches=PRESSURE,
        extra_keys=True,
        ci_workloads=100,
        mixed_revisits=True,
    ),
    # Small pools over an L3 tier: prompts evicted from device and host come back from storage.
    "storage": Family(
        outputs=False,
        aligned=False,
        device_units=(8,),
        reaches=("device_hit", "storage_hit", "device_evicted", "host_freed"),
        storage=True,
        hicache_ratios=(1.25,),
        policies=("write_through", "write_through_selective"),
        ci_workloads=20,
    ),
    # The same with a shared first page or two: the L3 read continues a device or host prefix.
    "storage_anchor": Family(
        outputs=False,
        aligned=False,
        device_units=(8,),
        reaches=("storage_hit", "anchored_storage_hit", "device_evicted", "host_freed"),
        storage=True,
        hicache_ratios=(1.25, 2.0),
        policies=("write_through", "write_through_selective"),
        shared_prefix=True,
        ci_workloads=20,
    ),
    # write_back over L3 (0.5.23 only: with a host pool this tight, 0.5.14's tree fails its own
    # assertion "parent does not have child key" in evict_host, reached from load_back -> evict ->
    # write_backup(write_back=True) -> evict_host, with or without storage; 0.5.23 drops the
    # subtree with a warning instead).
    "storage_write_back": Family(
        outputs=False,
        aligned=False,
        device_units=(8,),
        reaches=("storage_hit", "device_evicted", "host_freed"),
        storage=True,
        hicache_ratios=(1.25, 2.0),
        policies=("write_back",),
        versions=("0.5.23",),
        ci_workloads=20,
    ),
}


@st.composite
def workloads(draw, family: Family):
    ps, u = family.page_size, family.unit
    device_tokens = draw(st.sampled_from(family.device_units)) * u
    hicache_ratio = draw(st.sampled_from(family.hicache_ratios))
    limit = 8 * u  # a prompt plus its output always fits in the smallest device pool

    def unaligned(tokens):
        return tokens if family.aligned or ps == 1 or len(tokens) % ps else tokens + [999]

    prefixes = [
        draw(st.lists(st.integers(1000, 1009), min_size=0, max_size=3 * u)) for _ in range(draw(st.integers(1, 2)))
    ]
    namespaces = [None, "tenant-a", "tenant-b"] if family.extra_keys else [None]
    histories = [list(draw(st.sampled_from(prefixes))) for _ in range(draw(st.integers(1, 3)))]
    keys = [draw(st.sampled_from(namespaces)) for _ in histories]
    requests = []
    for _ in range(draw(st.integers(2, 10))):
        c = draw(st.integers(0, len(histories) - 1))
        user = draw(st.lists(st.integers(1, 40), min_size=1, max_size=10 * u // 4))
        repeat = draw(st.booleans()) and requests  # a prompt sent again (a retry, a shared question)
        n_out = draw(st.integers(2, 2 * u)) if family.outputs else 1
        if repeat:
            again = requests[draw(st.integers(0, len(requests) - 1))]
            prompt, key = list(again["prompt"]), again.get("extra_key")
            n_out = max(1, min(n_out, limit - len(prompt)))
        else:
            key = keys[c]
            prompt = unaligned(histories[c] + user)
            if len(prompt) + n_out > limit:
                histories[c] = list(draw(st.sampled_from(prefixes)))  # the conversation ends, a new one starts
                keys[c] = key = draw(st.sampled_from(namespaces))
                prompt = unaligned((histories[c] + user)[: limit - n_out - 1])
        output = [2000 + len(requests) * 10 + i for i in range(n_out)]
        request = {"prompt": prompt, "output": output}
        if key is not None:
            request["extra_key"] = key
        requests.append(request)
        if not repeat:
            histories[c] = prompt + output
    return {"device_tokens": device_tokens, "hicache_ratio": hicache_ratio, "requests": requests}


@st.composite
def revisits(draw, family: Family):
    """Distinct prompts sent again after others pushed them out of the device and host pools
    (with `shared_prefix`, behind one common first page or two)."""
    ps, u = family.page_size, family.unit
    distinct = draw(st.integers(3, 5))
    shared = [900 + i for i in range(draw(st.sampled_from((ps, 2 * ps))))] if family.shared_prefix else []
    prompts = []
    for k in range(distinct):
        n = draw(st.integers(2 * u + 1, 7 * u - 1 - len(shared)).filter(lambda n: ps == 1 or (n + len(shared)) % ps))
        prompts.append(shared + [1000 * (k + 1) + i for i in range(n)])
    order = draw(st.lists(st.integers(0, distinct - 1), min_size=4, max_size=16))
    return {
        "device_tokens": draw(st.sampled_from(family.device_units)) * family.unit,
        "hicache_ratio": draw(st.sampled_from(family.hicache_ratios)),
        "requests": [{"prompt": prompts[k], "output": [2000]} for k in order],
    }


def count(family: Family) -> int:
    return DEEP_WORKLOADS if DEEP else family.ci_workloads


def _generate(family: Family) -> list[dict]:
    found: list[dict] = []
    # The storage families keep their busiest workloads (SGLang 0.5.14 takes about a second to
    # start a cache with a storage backend: a thread join in its controller).
    wanted = count(family) * (5 if family.storage and not DEEP else 1)
    if family.storage:
        strategy = revisits(family)
    elif family.mixed_revisits:
        strategy = st.one_of(workloads(family), revisits(family))
    else:
        strategy = workloads(family)

    @settings(
        max_examples=wanted,
        derandomize=not DEEP,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(workload):
        found.append(workload)

    collect()
    return found


def generated(family: str) -> list[dict]:
    workloads = _generate(FAMILIES[family])
    if FAMILIES[family].storage:
        workloads = sorted(workloads, key=lambda wl: -sum(len(r["prompt"]) for r in wl["requests"]))
    return workloads[: count(FAMILIES[family])]


def main() -> None:
    json.dump({name: generated(name) for name in FAMILIES}, sys.stdout)


if __name__ == "__main__":
    main()
