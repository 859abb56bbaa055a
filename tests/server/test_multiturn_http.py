"""`hicache bench multiturn --serve URL`: the multi-turn workload over SGLang's /generate against a
real serve on loopback; the hit rates per round come from meta_info and, with every history fitting
in L1, equal the paged ceiling the model predicts; the serve counted the same cached tokens."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli_runner import hicache
from hicache_ops.mooncake.net import free_port
from serve_process import Serve


def cached_total(url: str) -> float:
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if fam.name == "sglang:cached_tokens":
            return sum(s.value for s in fam.samples if s.name.endswith("_total"))
    raise AssertionError("no sglang:cached_tokens_total")


def test_multiturn_over_http_hits_the_paged_ceiling(tmp_path):
    serve = Serve(tmp_path, "--device-tokens", "2048", "--page-size", "16")
    try:
        before = cached_total(serve.url)
        args = ["bench", "multiturn", "--serve", serve.url, "--clients", "3", "--rounds", "4", "--new-tokens", "40",
                "--output-tokens", "4", "--concurrency", "2", "--json"]  # fmt: skip
        res = hicache(args)
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        after = cached_total(serve.url)
        human = hicache(args[:-1] + ["--quiet"])
        assert human.exit_code == 0 and "paged ceiling" in human.stdout
    finally:
        serve.stop()
    rounds = data["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3] and data["workload"]["page_size"] == 16
    assert rounds[0]["cached_tokens"] == 0
    for r in rounds[1:]:
        # each history (questions and the serve's answers but the last token) is hit, page-floored
        assert r["hit_rate"] == r["ceiling_paged"] > 0 and r["device_hit"] == r["cached_tokens"]
        assert r["prompt_tokens"] == 3 * (r["round"] * 44 + 40)
    assert after - before == data["total"]["cached_tokens"] > 0


def test_multiturn_over_http_unreachable_is_exit_3():
    res = hicache(["bench", "multiturn", "--serve", f"http://127.0.0.1:{free_port()}", "--clients", "1",
                   "--rounds", "1", "--new-tokens", "16", "--timeout", "2"])  # fmt: skip
    assert res.exit_code == 3 and "Traceback" not in res.output
