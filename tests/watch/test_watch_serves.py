"""`hicache watch --once --json` against two real serves sharing one Mooncake master.

The serves speak SGLang's metric names (docs/serve-api.md#metrics), so watch reads them as it reads
SGLang. Serve A computes a prompt and hits it again in L1; serve B, never sent it, finds the pages A
wrote in L3. Watch's per-tier totals must equal each serve's own counters
(`hicache_*_hit_tokens_total` and the requests' `meta_info`), and the master figures must come from
the master the serves share.
"""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_runner import hicache
from serve_process import Serve

ARGS = ("--device-tokens", "1024", "--page-size", "16", "--hicache-storage-prefetch-policy", "wait_complete",
        "--prefetch-threshold", "32")  # fmt: skip
PROMPT = {"input_ids": list(range(52_000, 52_100)), "sampling_params": {"max_new_tokens": 2}}


@pytest.fixture(scope="module")
def two_serves(tmp_path_factory):
    base = tmp_path_factory.mktemp("watch-serves")
    first = Serve(base / "a", *ARGS)
    rpc, metrics = first.info["master_rpc_address"], first.info["master_metrics_address"]
    try:
        second = Serve(base / "b", *ARGS, "--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    except BaseException:
        first.stop()
        raise
    try:
        yield first, second, metrics
    finally:
        second.stop()
        first.stop()


def own_counters(serve) -> dict[str, float]:
    """The serve's own per-tier hit counters, read from its hicache_* families."""
    text = httpx.get(serve.url + "/metrics", timeout=10).text
    wanted = {"hicache_device_hit_tokens": "device", "hicache_host_hit_tokens": "host",
              "hicache_storage_hit_tokens": "storage"}  # fmt: skip
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            found[wanted[family.name]] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    assert set(found) == set(wanted.values()), sorted(f.name for f in text_string_to_metric_families(text))
    return found


def test_watch_once_json_reports_each_serves_own_tier_counters(two_serves):
    first, second, master_metrics = two_serves
    metas = [httpx.post(first.url + "/generate", json=PROMPT, timeout=60).json()["meta_info"] for _ in range(2)]
    metas.append(httpx.post(second.url + "/generate", json=PROMPT, timeout=60).json()["meta_info"])
    assert metas[1]["cached_tokens_details"]["device"] == 96, metas
    assert metas[2]["cached_tokens_details"]["storage"] == 96, metas

    result = hicache(["watch", "--sglang-url", first.url, "--sglang-url", second.url, "--master", master_metrics,
                      "--once", "--interval", "0.3", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [i["meanings"] for i in data["instances"]] == ["0.5.23", "0.5.23"]
    for serve, instance in zip((first, second), data["instances"], strict=True):
        own = own_counters(serve)
        tokens = instance["tokens"]
        assert {tier: tokens[tier]["total"] for tier in own} == own, (serve.url, tokens)
        prompt = tokens["prompt"]["total"]
        assert prompt == 200 if serve is first else prompt == 100
        # no request fell between watch's two scrapes: the window's shares are empty, not made up
        assert tokens["basis"] == "window" and all(tokens[t]["share"] is None for t in own), tokens
    # the first serve hit its own L1, the second read what the first wrote from L3
    assert data["instances"][0]["tokens"]["device"]["total"] == 96
    assert data["instances"][1]["tokens"]["storage"]["total"] == 96
    assert data["master"]["keys"] > 0
