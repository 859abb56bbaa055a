"""`hicache inspect keys --master`: presence per object, SGLang's contiguous prefix, each diagnosis."""

from __future__ import annotations

import json
import random
import socket

import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.key_listing import Deployment, expected_keys
from hicache_ops.commands.inspect.live_diff import live_diff
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.sglang.page_keys import ObjectKeyScheme, page_keys

PAGE = 16
PAGES = 4


@pytest.fixture
def writer(mooncake_master, mooncake_segment_owner):
    """Writes objects the way a given SGLang rank names them (into the session owner's segment)."""
    client = StoreClient.connect(mooncake_master.rpc_address)

    def write(tokens, *, version="0.5.23", extra_key=None, cache_salt=None, pages=None, skip=(), **scheme):
        keys = page_keys(tokens, PAGE, version, extra_key=extra_key, cache_salt=cache_salt)
        written = []
        for i, pk in enumerate(keys):
            if pages is not None and i not in pages:
                continue
            for key in ObjectKeyScheme(version, **scheme).object_keys(pk):
                if key not in skip:
                    client.put(key, b"kv")
                    written.append(key)
        return written

    write.client = client
    try:
        yield write
    finally:
        client.close()


@pytest.fixture
def tokens():
    """A prompt of its own per test (4 whole pages + 3 trailing tokens): no test sees another's keys."""
    base = random.randrange(10**6, 10**9)
    return list(range(base, base + PAGES * PAGE + 3))


def live(master, tokens, *extra: str):
    args = [
        "inspect",
        "keys",
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        str(PAGE),
        "--sglang-version",
        "0.5.23",
        "--master",
        master.metrics_address,
        "--json",
        *extra,
    ]
    result = hicache(args)
    return result.exit_code, json.loads(result.stdout)


def kinds(data) -> list[str]:
    return [d["kind"] for d in data["diagnosis"]]


def entry(data, kind) -> dict:
    return next(d for d in data["diagnosis"] if d["kind"] == kind)


def test_complete_prefix_is_exit_0(mooncake_master, writer, tokens):
    writer(tokens, model_name="Org/Model-A", tp_rank=0, tp_size=2)
    writer(tokens, model_name="Org/Model-A", tp_rank=1, tp_size=2)
    code, data = live(mooncake_master, tokens, "--model-name", "Org/Model-A", "--tp-size", "2")
    assert code == 0
    assert data["contiguous_pages"] == PAGES and data["first_missing"] is None and data["diagnosis"] == []
    assert [p["present"] for p in data["pages"]] == [[True] * 4] * PAGES
    assert data["master"] == mooncake_master.metrics_address
    # Everything inspect keys printed before is still there.
    assert {"sglang_version", "page_size", "key_prefix", "pages", "notes"} <= set(data)
    assert data["pages"][0]["object_keys"][0].startswith("Org-Model-A_")


def test_one_missing_v_ends_the_prefix(mooncake_master, writer, tokens):
    dep_keys = expected_keys(tokens, PAGE, Deployment("0.5.23", model_name="m/x")).pages
    missing = dep_keys[2].object_keys[1]  # page 2's _0_v
    writer(tokens, model_name="m/x", skip={missing})
    code, data = live(mooncake_master, tokens, "--model-name", "m/x")
    assert code == 1
    assert data["contiguous_pages"] == 2 and data["first_missing"] == missing
    assert [p["present"] for p in data["pages"]] == [[True, True], [True, True], [True, False], [True, True]]
    assert kinds(data) == ["incomplete_page", "gap"]
    assert entry(data, "incomplete_page")["missing"] == [missing]
    assert entry(data, "gap")["first"] == 3


def test_other_prefix(mooncake_master, writer, tokens):
    writer(tokens, model_name="Writer/Model")
    code, data = live(mooncake_master, tokens, "--model-name", "Reader/Model")
    assert code == 1 and data["contiguous_pages"] == 0
    found = entry(data, "other_prefix")
    assert found["prefix"] == "Writer-Model_" and found["pages"] == PAGES and found["contiguous_pages"] == PAGES
    assert "--model-name" in found["hint"]
    assert "not_found" not in kinds(data)


def test_other_tag(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", extra_backend_tag="blue")
    code, data = live(mooncake_master, tokens, "--model-name", "M", "--extra-backend-tag", "green")
    assert entry(data, "other_prefix")["prefix"] == "blue_M_"


def test_mla_written_mha_expected(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", mla=True)
    code, data = live(mooncake_master, tokens, "--model-name", "M")
    found = entry(data, "mla_vs_mha")
    assert code == 1 and found["found"] == ["__k"] and found["pages"] == PAGES and "--mla" in found["hint"]
    assert "other_rank" not in kinds(data)


def test_mha_written_mla_expected(mooncake_master, writer, tokens):
    writer(tokens, model_name="M")
    code, data = live(mooncake_master, tokens, "--model-name", "M", "--mla")
    found = entry(data, "mla_vs_mha")
    assert code == 1 and found["found"] == ["_0_k", "_0_v"] and "Drop --mla" in found["hint"]


def test_other_tp_rank(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", tp_rank=1, tp_size=2)
    code, data = live(mooncake_master, tokens, "--model-name", "M")
    found = entry(data, "other_rank")
    assert code == 1 and found["found"] == ["_1_k", "_1_v"] and found["expected"] == ["_0_k", "_0_v"]


def test_other_pp_rank(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", pp_rank=1, pp_size=2)
    code, data = live(mooncake_master, tokens, "--model-name", "M", "--pp-size", "2", "--pp-rank", "0")
    assert entry(data, "other_rank")["found"] == ["_0_1_k", "_0_1_v"]


def test_other_version_prefix(mooncake_master, writer, tokens):
    writer(tokens, version="0.5.14", extra_backend_tag="tg")  # 0.5.14: the tag only, no model name
    code, data = live(mooncake_master, tokens, "--model-name", "M", "--extra-backend-tag", "tg")
    found = entry(data, "other_version")
    # 0.5.14 to 0.5.16 name these objects alike: one finding, labelled by the newest of them
    assert code == 1 and found["sglang_releases"] == "0.5.14 to 0.5.16" and found["prefix"] == "tg_"
    assert found["contiguous_pages"] == PAGES and "--sglang-version 0.5.16" in found["hint"]


def test_other_version_namespace(mooncake_master, writer, tokens):
    writer(tokens, version="0.5.14", extra_key="tenant")  # 0.5.14 ignores extra_key in page keys
    code, data = live(mooncake_master, tokens, "--extra-key", "tenant")
    found = entry(data, "other_version")
    assert (
        found["sglang_releases"] == "0.5.14 to 0.5.19"  # no namespace seed before 0.5.20
        and found["pages"] == PAGES
        and "without the namespace" in found["message"]
    )


def test_other_namespace_tried(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", extra_key="tenantA")
    code, data = live(
        mooncake_master, tokens, "--model-name", "M", "--try-extra-key", "tenantB", "--try-extra-key", "tenantA"
    )
    found = entry(data, "other_namespace")
    assert (
        code == 1
        and found["namespace"] == "extra_key='tenantA', cache_salt=None"
        and found["contiguous_pages"] == PAGES
    )
    assert all(
        d["namespace"] != "extra_key='tenantB', cache_salt=None"
        for d in data["diagnosis"]
        if d["kind"] == "other_namespace"
    )


def test_unsalted_namespace_is_always_tried(mooncake_master, writer, tokens):
    writer(tokens, model_name="M")
    code, data = live(mooncake_master, tokens, "--model-name", "M", "--cache-salt", "s1")
    assert entry(data, "other_namespace")["namespace"] == "extra_key=None, cache_salt=None"


def test_not_found(mooncake_master, writer, tokens):
    code, data = live(mooncake_master, tokens, "--model-name", "M")
    assert code == 1 and data["contiguous_pages"] == 0
    assert kinds(data) == ["not_found"] and entry(data, "not_found")["pages"] == PAGES
    assert data["first_missing"] == data["pages"][0]["object_keys"][0]


def test_human_output(mooncake_master, writer, tokens):
    writer(tokens, model_name="M", pages={0, 1})
    args = [
        "inspect",
        "keys",
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        str(PAGE),
        "--model-name",
        "M",
        "--sglang-version",
        "0.5.23",
        "--master",
        mooncake_master.metrics_address,
    ]
    result = hicache(args)
    assert result.exit_code == 1
    assert "contiguous prefix 2/4 pages (32 tokens)" in result.stdout and "first missing" in result.stdout


def test_try_options_need_master(tokens):
    result = hicache(["inspect", "keys", "--tokens", "1,2,3", "--try-extra-key", "x", "--json"])
    assert result.exit_code == 2


def test_unreachable_master_is_exit_3(tokens):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = hicache(["inspect", "keys", "--tokens", "1,2,3", "--master", f"127.0.0.1:{port}", "--json"])
    assert result.exit_code == 3 and f"127.0.0.1:{port}" in json.loads(result.stdout)["error"]["message"]
    result = hicache(["inspect", "keys", "--tokens", "1,2,3", "--master", "127.0.0.1", "--json"])
    assert result.exit_code == 2


class CountingAdmin(AdminClient):
    """Our admin client with a request counter (the master stays real)."""

    requests = 0

    def _request(self, path, method="GET"):
        self.requests += 1
        return super()._request(path, method)


def test_queries_are_batched_for_a_128k_prompt(mooncake_master, writer):
    base = random.randrange(10**6, 10**9)
    long_prompt = list(range(base, base + 131072))  # 2,048 pages of 64 tokens, 4,096 objects
    dep = Deployment("0.5.23", model_name="Big/Model")
    report = expected_keys(long_prompt, 64, dep)
    assert len(report.pages) == 2048 and len(report.object_keys) == 4096
    for key in report.object_keys[:200]:  # the first 100 pages exist
        writer.client.put(key, b"kv")
    with CountingAdmin(mooncake_master.metrics_address) as admin:
        diff = live_diff(long_prompt, 64, dep, admin, report=report)
        assert diff.contiguous_pages == 100 and diff.first_missing == report.object_keys[200]
        # 8 presence queries of 512 objects and one listing for the diagnosis: no round trip per key.
        assert admin.requests <= 4096 // 512 + 1


def test_silent_master_is_exit_3_within_5s(fresh_mooncake_master, freeze_process, tokens):
    import time

    freeze_process(fresh_mooncake_master.pid)
    start = time.monotonic()
    args = [
        "inspect",
        "keys",
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        str(PAGE),
        "--master",
        fresh_mooncake_master.metrics_address,
        "--json",
    ]
    result = hicache(args)
    assert time.monotonic() - start < 5.0
    assert result.exit_code == 3
    assert fresh_mooncake_master.metrics_address in json.loads(result.stdout)["error"]["message"]


@pytest.mark.parametrize("model_name", [None, "org/model"])
def test_a_0_5_14_reader_of_0_5_23_objects_is_a_version_mismatch(mooncake_master, writer, tokens, model_name):
    writer(tokens, version="0.5.23", model_name="org/model")
    extra = ["--model-name", model_name] if model_name else []
    code, data = live(mooncake_master, tokens, "--sglang-version", "0.5.14", *extra)
    assert code == 1
    assert kinds(data)[0] == "other_version" and "other_prefix" not in kinds(data), data["diagnosis"]
    assert "--sglang-version 0.5.23" in data["diagnosis"][0]["hint"]
