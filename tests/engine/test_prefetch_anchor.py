"""Issue 22, divergence 2: no L3 prefetch past a device prefix whose last node has no host copy.

Instance B computes S under write_back (no host copy); instance A writes S+V+W to the shared L3
under write_through; B asks for S+V+W. 0.5.14's match walks last_host_node up to a backed-up
ancestor (here the root) and the scheduler chains the lookup keys from it, so they are not the
prompt's and miss; 0.5.23's last_host_node is the match's last node and the scheduler's gate
requires it backed up, so nothing is issued (docs/controller.md#prefetch-anchor). Either way
SGLang gives storage_hit 0; the engine used to report the 32 tokens of V+W.
"""

from __future__ import annotations

import numpy as np
import pytest

from hicache_ops.engine.cache import TieredCache
from hicache_ops.engine.config import CacheConfig
from hicache_ops.engine.planes import AccountingPlane, MemoryL3
from hicache_ops.engine.scheduler import run_wave
from hicache_ops.sglang.page_keys import ObjectKeyScheme

PS = 4
S = np.arange(100, 116, dtype=np.int64)  # 4 pages
VW = np.arange(200, 233, dtype=np.int64)  # 8 pages and one trailing token


def _pair(version: str):
    l3 = MemoryL3([ObjectKeyScheme(version)], 64)

    def cache(write_policy):
        cfg = CacheConfig(
            page_size=PS,
            device_pages=64,
            host_pages=128,
            prefetch_threshold=PS,
            write_policy=write_policy,
            sglang_version=version,
            stop_policy="wait_complete",
        )
        return TieredCache(cfg, AccountingPlane(64), l3)

    return cache("write_through"), cache("write_back")


@pytest.mark.parametrize("concurrent", [False, True])
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_no_storage_hit_past_an_unbacked_device_prefix(version, concurrent):
    a, b = _pair(version)
    b.request(np.concatenate([S, [1]]), [7])
    a.request(np.concatenate([S, VW]), [7])
    prompt = np.concatenate([S, VW])
    r = run_wave(b, [(prompt, np.array([7]))])[0] if concurrent else b.prefill(prompt)
    assert r.device_hit == 16
    assert r.storage_hit == 0
    assert "no host copy" in r.prefetch.reason
    assert r.prefetch.issued is False


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_backed_up_prefix_still_prefetches(version):
    """The same with B under write_through: S is backed up, the suffix comes from L3."""
    from hicache_ops.engine.l3_prefetch import prefetch_anchor

    a, _ = _pair(version)
    b = TieredCache(
        CacheConfig(page_size=PS, device_pages=64, host_pages=128, prefetch_threshold=PS, sglang_version=version),
        AccountingPlane(64),
        a.l3,
    )
    b.request(np.concatenate([S, [1]]), [7])
    a.request(np.concatenate([S, VW]), [7])
    r = b.prefill(np.concatenate([S, VW]))
    assert (r.device_hit, r.storage_hit) == (16, 32)
    node = b.tree.full_nodes(b.keys_for(S, None, None)[0])[0][-1]
    assert prefetch_anchor(b.tree, node, version) == ("", None)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_trace_names_the_unbacked_anchor(version):
    """`trace read` (observe_read) fails the prefetch decision with this cause, which the
    no-l3-hit playbook's check 1b keys on (detail.anchor_backed_up == false)."""
    from hicache_ops.commands.trace.observe import observe_read

    a, b = _pair(version)
    b.request(np.concatenate([S, [1]]), [7])
    a.request(np.concatenate([S, VW]), [7])
    steps = observe_read(b, np.concatenate([S, VW]))
    failed = next(s for s in steps if s.status == "FAIL")
    assert failed.name == "prefetch decision" and "no host copy" in failed.summary
    assert failed.detail["anchor_backed_up"] is False
