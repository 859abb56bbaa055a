"""Issue 22, the oracle: the admission check's stop decision on an unfinished prefetch, asked of
SGLang's own code and of the engine's `stop_verdict` (docs/controller.md#stop-policies,
#timeout-budget, docs/oracle.md#scheduler-level-code).

0.5.23: the tree's `_can_terminate_prefetch` (best_effort, wait_complete, timeout with
`_prefetch_deadline_expired`), and `_start_storage_prefetch_wait`, which check_prefetch_progress
calls at the first check that finds the prefetch unfinished and which sets the budget from the
requested pages. The tree is the oracle harness's `UnifiedRadixCache` with the file backend, built
with `hicache_storage_prefetch_policy` set to the policy; the operation is SGLang's
`PrefetchOperation` with its hit (hash values), host pages and acknowledged progress set as the
controller's threads leave them. The budget's timer is SGLang's `PollTimer`; a later check
`elapsed` seconds after the first is its start moved back by that much (the cases stay a second
or more off the budget, so the test does not depend on how fast it runs).

Not asked here: a read whose last page has arrived ends at any check (SGLang's ACK drain commits
it; the engine's `stop_verdict` says stop), and what happens after the verdict.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time

import pytest

from hicache_ops.engine.l3_prefetch import stop_verdict
from hicache_ops.engine.parts import IssuedPrefetch
from hicache_ops.engine.planes import ReadOutcome
from hicache_ops.sglang.policy import TimeoutBudget

POLICIES = ["best_effort", "wait_complete", "timeout"]
PS = 16
# (requested pages, hit pages, arrived pages): hits below, at and far above a second of budget.
SPANS = [(4, 4, 0), (4, 3, 2), (64, 40, 39), (4000, 4000, 1000), (4000, 100, 0)]


def _cases():
    """(requested, hit, arrived, seconds from issue to the first check, seconds from the first
    check to this one; None: this is the first check)."""
    for (req, hit, arrived), first_at in itertools.product(SPANS, [0.01, 40.0]):
        budget = TimeoutBudget().seconds("0.5.23", requested_tokens=req * PS, hit_tokens=hit * PS)
        for later in (None, max(0.0, budget - 1.0), budget + 1.0, 10 * budget):
            yield req, hit, arrived, first_at, later


def _engine(policy: str, req: int, hit: int, arrived: int, first_at: float, later: float | None):
    budget = TimeoutBudget().seconds("0.5.23", requested_tokens=req * PS, hit_tokens=hit * PS)
    outcome = ReadOutcome(ok=[True] * hit, done_at=[0.0] * arrived + [1e12] * (hit - arrived))
    hold = IssuedPrefetch(pos=0, requested_tokens=req * PS, host_pages=[], outcome=outcome, issued_at=0.0)
    if later is None:
        return stop_verdict(policy, "0.5.23", budget, hold, first_at, None).stop, budget
    return stop_verdict(policy, "0.5.23", budget, hold, first_at + later, first_at).stop, budget


@pytest.fixture(scope="module")
def trees():
    """One 0.5.23 tree with the file backend per stop policy."""
    import torch

    from engine import oracle_0_5_23 as o

    built = {}
    with tempfile.TemporaryDirectory(prefix="stop-l3-") as folder:
        saved = os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR")
        os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = folder
        try:
            for policy in POLICIES:
                built[policy] = o.build(
                    o.OracleConfig(page_size=PS, device_tokens=256, storage=True, stop_policy=policy)
                )[0]
            yield built, torch
        finally:
            for cache in built.values():
                cache.shutdown()
            if saved is None:
                os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
            else:
                os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = saved


def _sglang(cache, torch, rid: str, req: int, hit: int, arrived: int, later: float | None):
    """SGLang 0.5.23's verdict at a check of an unfinished prefetch, and the budget it set."""
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchOperation

    op = PrefetchOperation(CacheRequestHandle(rid, 0), list(range(req * PS)))
    op.stats_requested_tokens = req * PS  # prefetch_from_storage: the requested span
    op.hash_value = [f"{rid}-{i}" for i in range(hit)]  # the hit the storage query found
    op.storage_hit_count = hit * PS
    op.host_indices = torch.arange(hit * PS, dtype=torch.int64)  # the hit got host pages
    op.completed_tokens = arrived * PS  # acknowledged progress
    assert not op.is_terminated()
    first = cache._can_terminate_prefetch(op)
    if first:
        return True, None
    cache._start_storage_prefetch_wait(op)  # check_prefetch_progress on a blocked check
    wait = cache._storage_prefetch_wait.get(op.handle)
    budget = wait.timeout_s if wait is not None else None
    if later is None:
        return False, budget
    if wait is not None:  # timeout only: the other policies start no clock
        wait.timer.started_at = time.perf_counter() - later
    return cache._can_terminate_prefetch(op), budget


@pytest.mark.parametrize("policy", POLICIES)
def test_stop_verdict_is_sglangs_0_5_23(trees, policy):
    built, torch = trees
    cache = built[policy]
    assert cache.prefetch_stop_policy == policy
    seen = set()
    for k, (req, hit, arrived, first_at, later) in enumerate(_cases()):
        theirs, their_budget = _sglang(cache, torch, f"{policy}{k}", req, hit, arrived, later)
        ours, budget = _engine(policy, req, hit, arrived, first_at, later)
        case = (req, hit, arrived, first_at, later)
        assert ours == theirs, case
        if their_budget is not None and policy == "timeout":
            assert budget == pytest.approx(their_budget), case
        seen.add(theirs)
    # Every policy but best_effort both waits and (timeout) stops on these cases.
    assert seen == ({True} if policy == "best_effort" else {False} if policy == "wait_complete" else {True, False})


# -- 0.5.14, in its child process -------------------------------------------------------------

_CHILD_0_5_14 = r"""
from sglang.srt.managers.cache_controller import PrefetchOperation

RESULT = []
for policy, cases in PAYLOAD["jobs"]:
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="stop-l3-") as storage_dir:
        run = Replay(dict(PAYLOAD["config"], stop_policy=policy), storage_dir)
        try:
            assert run.cache.prefetch_stop_policy == policy
            ps = run.ps
            for k, (req, hit, arrived, since_issue) in enumerate(cases):
                # 0.5.14 takes host pages for the whole requested span at the issue.
                op = PrefetchOperation(f"{policy}{k}", torch.arange(req * ps), list(range(req * ps)))
                op.hash_value = [f"{policy}{k}-{i}" for i in range(hit)]  # the storage query's hit
                op.completed_tokens = arrived * ps  # acknowledged progress
                op.start_time = time.monotonic() - since_issue  # issued that long ago
                verdicts.append(bool(run.cache.can_terminate_prefetch(op)))
        finally:
            run.cache.shutdown()
    RESULT.append(verdicts)
"""


def _cases_0_5_14():
    """(requested, hit, arrived, seconds since the issue): 0.5.14's clock starts at the issue and
    its budget counts the hit, capped at 30 s."""
    # Not asked: a hit of 0 pages. In 0.5.14 that is a storage query not answered yet (empty hash
    # values: wait_complete and timeout wait for it); the engine's query answers at the issue, and
    # a prefetch whose hit is 0 is not issued (an answered 0.5.14 query of 0 terminates it too).
    for req, hit, arrived in SPANS:
        budget = TimeoutBudget().seconds("0.5.14", requested_tokens=req * PS, hit_tokens=hit * PS)
        for since_issue in (0.01, max(0.0, budget - 1.0), budget + 1.0, 10 * budget):
            yield req, hit, arrived, since_issue


def test_stop_verdict_is_sglangs_0_5_14():
    from dataclasses import asdict

    from engine import oracle_0_5_14 as o14
    from engine.oracle_0_5_23 import OracleConfig
    from sglang_0_5_14 import run_0_5_14

    cases = list(_cases_0_5_14())
    setup = o14._SCRIPT[: o14._SCRIPT.index("\nRESULT = []\n")]  # the harness's rank and Replay
    config = asdict(OracleConfig(page_size=PS, device_tokens=256, storage=True))
    theirs = run_0_5_14(setup + _CHILD_0_5_14, {"config": config, "jobs": [[p, cases] for p in POLICIES]})
    for policy, verdicts in zip(POLICIES, theirs, strict=True):
        ours = []
        for req, hit, arrived, since_issue in cases:
            budget = TimeoutBudget().seconds("0.5.14", requested_tokens=req * PS, hit_tokens=hit * PS)
            outcome = ReadOutcome(ok=[True] * hit, done_at=[0.0] * arrived + [1e12] * (hit - arrived))
            hold = IssuedPrefetch(pos=0, requested_tokens=req * PS, host_pages=[], outcome=outcome)
            ours.append(stop_verdict(policy, "0.5.14", budget, hold, since_issue, None).stop)
        assert list(zip(cases, ours, strict=True)) == list(zip(cases, verdicts, strict=True)), policy
        assert set(verdicts) == (
            {True} if policy == "best_effort" else {False} if policy == "wait_complete" else {True, False}
        )
