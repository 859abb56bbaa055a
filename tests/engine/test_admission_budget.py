"""Issue 22, divergence 4: the concurrency model's admission budget (docs/controller.md#admission-budget).

SGLang's admission loop (`Scheduler.get_new_batch_prefill`, both versions) stops adding to a pass
once the pass's new requests fill what the running batch leaves, and it does so before asking the
request's prefetch whether it may stop, so a held-back request's prefetch does not land on that
pass. `PrefillAdder` (`schedule_policy.py`) reserves min(max_new_tokens, CLIP_MAX_NEW_TOKENS)
decode tokens per request and, without chunked prefill, refuses a pass's later request whose
page-rounded extend reaches `rem_input_tokens`. The engine used to reserve the whole output and
admit by device room only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tests.sglang_0_5_14 import require_root

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.engine.scheduler import WaveStats, run_wave
from hicache_ops.sglang import policy as pol
from hicache_ops.sglang.page_keys import ObjectKeyScheme

PS = 4
VERSIONS = ["0.5.14", "0.5.23"]


def test_clip_is_sglangs_for_both_versions():
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    assert pol.CLIP_MAX_NEW_TOKENS == CLIP_MAX_NEW_TOKENS
    text = (require_root() / "sglang/srt/managers/schedule_policy.py").read_text()
    pattern = r'CLIP_MAX_NEW_TOKENS = int\(\s*os\.environ\.get\("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "(\d+)"\)'
    m = re.search(pattern, text)
    assert m is not None and int(m.group(1)) == pol.CLIP_MAX_NEW_TOKENS
    assert pol.reserved_new_tokens(5000) == 4096 and pol.reserved_new_tokens(7) == 7


def _l3_pair(version: str, **caps):
    """Instance `writer` puts a prompt in the shared L3; `cache` serves the wave."""
    l3 = MemoryL3([ObjectKeyScheme(version)], 64)

    def make(**extra):
        cfg = CacheConfig(
            page_size=PS,
            device_pages=64,
            host_pages=128,
            prefetch_threshold=PS,
            sglang_version=version,
            stop_policy="wait_complete",
            **extra,
        )
        return TieredCache(cfg, AccountingPlane(64), l3)

    return make(), make(**caps)


@pytest.mark.parametrize("version", VERSIONS)
def test_full_batch_holds_back_a_request_and_its_prefetch(version):
    """max_running_requests 1: A runs for 5 passes; B (its prompt in L3) arrives with it and has
    room on the device. SGLang breaks out of pass 1 at the batch-full check, before B's
    check_prefetch_progress, so B is admitted (and its prefetch lands) only once A finished; the
    old engine admitted both on pass 1."""
    writer, cache = _l3_pair(version, max_running_requests=1)
    b_prompt = np.arange(300, 333, dtype=np.int64)  # 8 pages and a trailing token
    writer.request(b_prompt, [7])
    a = (np.arange(100, 109, dtype=np.int64), np.arange(1, 6, dtype=np.int64))
    stats = WaveStats()
    results = run_wave(cache, [a, (b_prompt, np.array([7]))], stats)
    assert results[1].prefetch.issued is True
    assert results[1].storage_hit == 32
    assert stats.max_running == 1
    # A decodes on passes 1-5 and finishes at pass 6, where B is admitted; B finishes at pass 7.
    assert stats.passes == 7


@pytest.mark.parametrize("version", VERSIONS)
def test_input_budget_holds_back_the_second_request(version):
    """max_prefill_tokens 40 (chunked prefill off): the first request's 36 page-rounded tokens are
    taken; the second's 36 reach the 4 left, so it waits for the next pass."""
    _, cache = _l3_pair(version, max_prefill_tokens=40)
    one = (np.arange(100, 133, dtype=np.int64), np.array([7]))
    two = (np.arange(500, 533, dtype=np.int64), np.array([7, 8, 9]))
    assert pol.input_budget_refuses(33, PS, 40 - pol.paged_tokens(33, PS), 1)
    stats = WaveStats()
    run_wave(cache, [one, two], stats)
    assert stats.max_running == 1
    # The first runs on pass 1; the second is admitted on pass 2 and finishes at pass 5 (both
    # on pass 1: 4 passes).
    assert stats.passes == 5


@pytest.mark.parametrize("version", VERSIONS)
def test_first_request_of_a_pass_is_taken_above_the_input_cap(version):
    _, cache = _l3_pair(version, max_prefill_tokens=8)
    r = run_wave(cache, [(np.arange(100, 133, dtype=np.int64), np.array([7]))])[0]
    assert r.prompt_tokens == 33


@pytest.mark.parametrize("version", VERSIONS)
def test_reservation_is_clipped_to_4096_decode_tokens(version):
    """A (output 5000) and B (a 100-page prompt) on a 400-page device, page size 16: SGLang
    reserves 2 + 4096/16 + 1 = 259 pages for A, so B's 102 fit next to it on pass 1; reserving
    A's whole output (2 + 313 + 1 = 316) left B waiting for A's 5000 passes."""
    cfg = CacheConfig(page_size=16, device_pages=400, host_pages=800, sglang_version=version)
    cache = TieredCache(cfg, AccountingPlane(64), None)
    a = (np.arange(1, 33, dtype=np.int64), np.arange(10_000, 15_000, dtype=np.int64))
    b = (np.arange(50_000, 51_600, dtype=np.int64), np.array([7]))
    stats = WaveStats()
    run_wave(cache, [a, b], stats)
    assert stats.max_running == 2
    assert stats.passes == 5001
