"""Real SGLang clients against `hicache serve` on loopback (docs/serve-api.md#clients).

SGLang's own benchmark client (`python -m sglang.bench_serving --backend sglang`, the random
dataset over a small local ShareGPT-shaped file, with the tiny local tokenizer) drives a serve
through streamed /generate requests; the cached tokens it reports, by tier, equal what the
serve counted over the same requests on /metrics (SGLang's names and the serve's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_process import Serve
from sglang_server import write_tiny_model
from tiny_tokenizer import write_tiny_tokenizer

PROMPTS = 12
SHARED_WORDS = 64  # every prompt starts with the same 64 words: 4 pages of 16 to hit
INPUT_LEN = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(folder)
    write_tiny_tokenizer(folder)
    return str(folder)


def counters(url: str) -> dict:
    """{(name, cache_source or is_streaming or ''): value} of the counters the comparison reads."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if s.name.endswith("_total") and (s.name.startswith("sglang:") or s.name.startswith("hicache_")):
                out[(s.name, s.labels.get("cache_source") or s.labels.get("is_streaming") or "")] = s.value
    return out


def dataset(path) -> str:
    shared = " ".join(f"w{i}" for i in range(SHARED_WORDS))
    rows = [
        {"conversations": [
            {"from": "human", "value": shared + " " + " ".join(f"w{100 + (7 * n + i) % 150}" for i in range(40))},
            {"from": "gpt", "value": "w1 w2"}]}
        for n in range(PROMPTS)
    ]  # fmt: skip
    path.write_text(json.dumps(rows))
    return str(path)


def test_sglang_bench_serving_reports_the_serve_s_hits(tmp_path, model_dir):
    serve = Serve(tmp_path / "serve", "--device-tokens", "2048", "--page-size", "16", "--tokenizer", model_dir)
    try:
        before = counters(serve.url)
        result = tmp_path / "bench.jsonl"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", serve.url,
             "--dataset-name", "random", "--dataset-path", dataset(tmp_path / "prompts.json"),
             "--tokenizer", model_dir, "--model", "hicache/tiny", "--num-prompts", str(PROMPTS),
             "--random-input-len", str(INPUT_LEN), "--random-output-len", "4", "--random-range-ratio", "1",
             "--max-concurrency", "4", "--warmup-requests", "0", "--cache-report", "--disable-tqdm",
             "--output-file", str(result), "--seed", "1"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report = json.loads(result.read_text().splitlines()[-1])
        after = counters(serve.url)
    finally:
        serve.stop()

    def delta(name: str, label: str = "") -> float:
        return after.get((name, label), 0) - before.get((name, label), 0)

    assert report["completed"] == PROMPTS
    cache = report["cache_report"]
    assert cache["total_prompt_tokens"] == PROMPTS * INPUT_LEN == delta("sglang:prompt_tokens_total", "true")
    assert delta("sglang:num_requests_total", "true") == PROMPTS  # bench_serving streams
    # What the client summed from meta_info is what the serve counted, tier by tier.
    assert cache["total_cached_tokens"] == sum(
        delta("sglang:cached_tokens_total", s) for s in ("device", "host", "storage")
    )
    assert cache["device_cached_tokens"] == delta("sglang:cached_tokens_total", "device")
    assert cache["host_cached_tokens"] == delta("sglang:cached_tokens_total", "host")
    assert (cache["storage_cached_tokens"] or 0) == delta("sglang:cached_tokens_total", "storage")
    assert cache["device_cached_tokens"] == delta("hicache_device_hit_tokens_total")
    # The shared 64 words were computed once; at least all later requests hit them (4 pages).
    assert cache["total_cached_tokens"] >= (PROMPTS - 4) * SHARED_WORDS
    assert cache["storage_backend"] in (None, "MooncakeStore")
