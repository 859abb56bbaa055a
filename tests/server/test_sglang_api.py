"""`hicache serve` speaking SGLang's HTTP API (docs/serve-api.md), as a real process on loopback.

Oracles are SGLang's own: its output streamer's `get_cached_tokens_details` for the tier split,
its Mooncake store's class name for `storage_backend`, its `ServerArgs` (through the body builder
the `--sglang-url` tests use) for `/server_info`, its metric collectors for the `sglang:` families
of `/metrics` (tests/server/sglang_metrics.py), and the toolkit's own `--sglang-url` commands.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_runner import hicache
from hicache_ops.sglang.l3_layout import parse_l3_layout
from hicache_ops.sglang.server_info import interpret
from serve_process import Serve
from sglang_0_5_14 import run_0_5_14
from sglang_metrics import COLLECTORS_SCRIPT, collector_definitions
from sglang_server import body_0_5_23, write_tiny_model
from tiny_tokenizer import write_tiny_tokenizer

PAGE = 16
ARGS = ("--device-tokens", "1024", "--page-size", str(PAGE), "--prefetch-threshold", "32",
        "--hicache-storage-prefetch-policy", "wait_complete")  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(folder)
    write_tiny_tokenizer(folder)
    return str(folder)


@pytest.fixture(scope="module")
def serve(tmp_path_factory, model_dir):
    s = Serve(tmp_path_factory.mktemp("serve"), *ARGS, "--tokenizer", model_dir)
    yield s
    s.stop()


def generate(serve, body: dict) -> dict:
    # As `curl -d` sends it: a form content type, a JSON body.
    r = httpx.post(serve.url + "/generate", content=json.dumps(body), timeout=60,
                   headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def sglang_details(device: int, host: int, storage: int, l3: bool = True):
    """SGLang 0.5.23's own tier split for a request with these hits (its output streamer's method)."""
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    streamer = SimpleNamespace(
        enable_hicache_storage=lambda: l3, _get_storage_backend_type=lambda: MooncakeStore.__name__
    )
    req = SimpleNamespace(cached_tokens_device=device, cached_tokens_host=host, cached_tokens_storage=storage,
                          cached_tokens=device + host + storage)  # fmt: skip
    return SchedulerOutputStreamer.get_cached_tokens_details(streamer, req)


def prompt(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_generate_twice_hits_and_the_tiers_split_as_sglang_reports(serve):
    body = {"input_ids": prompt(1000, 40), "sampling_params": {"max_new_tokens": 4}}
    first = generate(serve, body)
    meta = first["meta_info"]
    assert meta["prompt_tokens"] == 40 and meta["completion_tokens"] == 4 and len(first["output_ids"]) == 4
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["cached_tokens"] == 0 and "cached_tokens_details" not in meta  # SGLang: None without a hit
    assert sglang_details(0, 0, 0) is None
    second = generate(serve, body)["meta_info"]
    # prompt + output but the last (43 tokens) were inserted: 2 whole pages, matched up to 39 tokens
    assert second["cached_tokens"] == 32
    assert second["cached_tokens_details"] == sglang_details(32, 0, 0)
    assert second["id"] != meta["id"]
    assert httpx.post(serve.url + "/flush_cache").status_code == 200
    third = generate(serve, body)["meta_info"]
    assert third["cached_tokens"] == 32 and third["cached_tokens_details"] == sglang_details(0, 0, 32)
    assert generate(serve, body)["output_ids"] == first["output_ids"]  # deterministic filler


def test_the_output_kv_is_kept_as_a_finished_request_keeps_it(serve):
    p = prompt(3000, 30)
    out = generate(serve, {"input_ids": p, "sampling_params": {"max_new_tokens": 4}})["output_ids"]
    # The next turn: prompt, the answer, a new question. The finish inserted the prompt and all
    # output tokens but the last (33 tokens: 2 whole pages); the prompt alone has 1.
    turn = generate(serve, {"input_ids": p + out + prompt(9000, 10), "sampling_params": {"max_new_tokens": 1}})
    assert turn["meta_info"]["cached_tokens"] == 32


def test_stream_is_sse_as_sglang_streams(serve):
    body = {"input_ids": prompt(5000, 20), "sampling_params": {"max_new_tokens": 3}, "stream": True}
    with httpx.stream("POST", serve.url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]
    assert [c["meta_info"]["finish_reason"] for c in chunks] == [None, None, {"type": "length", "length": 3}]
    assert chunks[-1]["output_ids"][:2] == chunks[1]["output_ids"]  # cumulative, not deltas
    assert len({c["meta_info"]["id"] for c in chunks}) == 1


def test_text_with_the_local_tokenizer(serve, model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    text = " ".join(f"w{i}" for i in range(40, 80))
    reply = generate(serve, {"text": text, "sampling_params": {"max_new_tokens": 5}})
    assert reply["meta_info"]["prompt_tokens"] == len(tok.encode(text).ids) == 40
    assert reply["text"] == tok.decode(reply["output_ids"])
    again = generate(serve, {"input_ids": tok.encode(text).ids, "sampling_params": {"max_new_tokens": 5}})
    assert again["meta_info"]["cached_tokens"] == 32  # the same tokens as the text


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"input_ids": [1, 2], "text": "w1"}, "exactly one"),
        ({}, "exactly one"),
        ({"input_ids": "abc"}, "input_ids"),
        ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": []}, "empty"),
    ],
)
def test_bad_generate_bodies_are_400(serve, body, fragment):
    r = httpx.post(serve.url + "/generate", json=body)
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]


def test_health_model_info_and_aliases(serve):
    assert httpx.get(serve.url + "/health").status_code == 200
    assert httpx.get(serve.url + "/health_generate").status_code == 200
    info = httpx.get(serve.url + "/model_info").json()
    assert info == httpx.get(serve.url + "/get_model_info").json()
    assert info["model_path"] == "hicache/tiny" and info["is_generation"] is True
    assert httpx.get(serve.url + "/server_info").json() == httpx.get(serve.url + "/get_server_info").json()


def test_server_info_reads_as_sglang_s_own_body_for_the_same_flags(serve, model_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = ["--model-path", model_dir, "--device", "cpu", "--served-model-name", "hicache/tiny",
            "--page-size", str(PAGE), "--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake",
            "--hicache-mem-layout", "page_first", "--hicache-write-policy", "write_through",
            "--hicache-storage-prefetch-policy", "wait_complete", "--hicache-ratio", "2",
            "--hicache-storage-backend-extra-config", json.dumps({"prefetch_threshold": 32})]  # fmt: skip
    # SGLang's scheduler info (scheduler.py, the init info it reports) carries max_req_input_len too.
    sglang = body_0_5_23(argv, {"status": "ready", "max_total_num_tokens": 1024, "max_req_input_len": 1024})
    ours = httpx.get(serve.url + "/server_info").json()
    assert set(ours) <= set(sglang), set(ours) - set(sglang)  # SGLang's field names only
    theirs = interpret(sglang, "u", "/server_info").values()
    mine = interpret(ours, "u", "/server_info").values()
    for name in ("server_args", "hicache_size"):  # the launch line and SGLang's size default differ by nature
        theirs.pop(name, None), mine.pop(name, None)
    assert mine == theirs


def test_inspect_keys_from_the_serve_names_the_objects_it_writes(serve):
    tokens = prompt(7000, 48)
    written = httpx.post(serve.url + "/v1/prefill", json={"input_ids": tokens, "return_keys": True}).json()
    res = hicache(["inspect", "keys", "--tokens", ",".join(map(str, tokens)), "--sglang-url", serve.url, "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [page["page_key"] for page in data["pages"]] == written["page_keys"] and len(written["page_keys"]) == 3
    assert data["key_prefix"] == serve.info["key_prefix"]
    assert data["pages"][0]["object_keys"] == [
        f"{serve.info['key_prefix']}{written['page_keys'][0]}_0_{kv}" for kv in "kv"
    ]


def test_l3_layout_route_is_0_5_23_s_shape(serve):
    reply = httpx.get(serve.url + "/get_hicache_l3_cache_layout").json()
    layout = parse_l3_layout(reply)  # the toolkit's reader of SGLang's reply accepts it
    assert not layout.enabled and "MLA" in layout.reason  # SGLang disables it for an MHA model


def metric_families(text: str) -> dict:
    """{exposition name: (type, label names, {labels tuple: value})} of the sglang: families."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("sglang:"):
            continue
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        samples = [s for s in fam.samples if not s.name.endswith("_created")]
        labels = {frozenset(s.labels) for s in samples}
        assert len(labels) == 1, (name, labels)
        out[name] = (fam.type, sorted(next(iter(labels))), {tuple(sorted(s.labels.items())): s.value for s in samples})
    return out


def check_against_collectors(families: dict, definitions: dict) -> None:
    assert families
    for name, (kind, labels, _) in families.items():
        assert name in definitions, f"{name} is not a metric of this SGLang version"
        assert [kind, labels] == definitions[name], name


def cached_by_source(families: dict) -> dict:
    return {dict(k)["cache_source"]: v for k, v in families["sglang:cached_tokens_total"][2].items()}


def test_metrics_carry_sglang_s_names_and_count_what_meta_info_said(serve, model_dir):
    before = cached_by_source(metric_families(httpx.get(serve.url + "/metrics").text))
    said = {"device": 0, "host": 0, "storage": 0}
    for start in (20_000, 20_000, 21_000, "flush", 20_000, 21_000):
        if start == "flush":  # the next ones read back from L3
            assert httpx.post(serve.url + "/flush_cache").status_code == 200
            continue
        meta = generate(serve, {"input_ids": prompt(start, 50), "sampling_params": {"max_new_tokens": 2}})["meta_info"]
        for source in said:
            said[source] += (meta.get("cached_tokens_details") or {}).get(source, 0)
    text = httpx.get(serve.url + "/metrics").text
    families = metric_families(text)
    check_against_collectors(families, collector_definitions(model_dir))
    after = cached_by_source(families)
    assert {s: after[s] - before[s] for s in said} == said and said["device"] > 0 and said["storage"] > 0
    assert "hicache_requests_total" in text  # the serve's own families stay beside SGLang's
    for name in ("sglang:prefetched_tokens_total", "sglang:hicache_host_used_tokens", "sglang:evicted_tokens_total",
                 "sglang:load_back_tokens_total", "sglang:prefill_effective_tokens_total"):  # fmt: skip
        assert name in families


def test_0_5_14_serve_speaks_0_5_14(tmp_path, model_dir):
    s = Serve(tmp_path, *ARGS, "--sglang-version", "0.5.14", "--l3", "none")
    try:
        meta = generate(s, {"input_ids": prompt(1, 20), "sampling_params": {"max_new_tokens": 1}})["meta_info"]
        assert "reasoning_tokens" not in meta  # 0.5.14's meta_info has none
        generate(s, {"input_ids": prompt(1, 20), "sampling_params": {"max_new_tokens": 1}})
        families = metric_families(httpx.get(s.url + "/metrics").text)
        check_against_collectors(families, run_0_5_14(COLLECTORS_SCRIPT, {"model": model_dir}))
        assert "sglang:prefill_effective_tokens_total" not in families
        # without L3: no storage source, as SGLang's details have none without a storage backend
        assert set(cached_by_source(families)) == {"device", "host"}
        assert httpx.get(s.url + "/get_hicache_l3_cache_layout").status_code == 404  # a 0.5.23 route
        assert interpret(httpx.get(s.url + "/server_info").json(), "u", "/server_info").sglang_version == "0.5.14"
    finally:
        s.stop()
