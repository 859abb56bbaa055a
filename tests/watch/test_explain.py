"""`hicache explain` against two real serves sharing one Mooncake master.

Serve A computes a prompt (and backs its pages up to L3). One object of page 3 is then removed from
the master with the project's store client; serve B, never sent the prompt, loads pages 0..2 from
L3 and recomputes the rest. Explain must give that split from B's own meta_info and name the object
removed, from the live diff taken before the request.
"""

from __future__ import annotations

import json

import httpx
import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.key_listing import Deployment, expected_keys
from hicache_ops.mooncake.store_client import StoreClient
from serve_process import Serve

ARGS = ("--device-tokens", "1024", "--page-size", "16", "--hicache-storage-prefetch-policy", "wait_complete",
        "--prefetch-threshold", "32")  # fmt: skip
PROMPT = list(range(53_000, 53_100))  # 6 whole pages of 16, 4 trailing tokens
LOST_PAGE = 3


@pytest.fixture(scope="module")
def two_serves(tmp_path_factory):
    base = tmp_path_factory.mktemp("explain-serves")
    first = Serve(base / "a", *ARGS)
    rpc, metrics = first.info["master_rpc_address"], first.info["master_metrics_address"]
    try:
        second = Serve(base / "b", *ARGS, "--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    except BaseException:
        first.stop()
        raise
    try:
        yield first, second, rpc, metrics
    finally:
        second.stop()
        first.stop()


def explain(url: str, master: str, *extra: str):
    tokens = ",".join(map(str, PROMPT))
    return hicache(["explain", "--sglang-url", url, "--master", master, "--tokens", tokens, *extra])


def requests_of(serve) -> int:
    return serve.client.stats()["stats"]["requests"]


def test_explain_names_the_removed_object_that_cut_the_l3_hit_short(two_serves):
    first, second, rpc, metrics = two_serves
    # Without --allow-writes nothing is sent: exit 2, the serve saw no request.
    before = requests_of(first)
    refused = explain(first.url, metrics)
    assert refused.exit_code == 2, refused.output
    assert "--allow-writes" in refused.stderr
    assert requests_of(first) == before

    # A computes the prompt, then explains it: all 6 pages from device, all 12 objects in L3.
    httpx.post(first.url + "/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}},
               timeout=60).raise_for_status()  # fmt: skip
    on_a = explain(first.url, metrics, "--allow-writes", "--json")
    assert on_a.exit_code == 0, on_a.output
    a = json.loads(on_a.stdout)
    assert a["page_split"] == {"device": 6, "host": 0, "storage": 0, "recomputed": 0}, a
    assert (a["present_objects"], a["expected_objects"], a["first_missing"]) == (12, 12, None)
    assert a["summary"] == "6 pages: 6 from device, 0 from host, 0 from L3, 0 recomputed."

    # Remove page 3's last object (its `_v`) from the master.
    report = expected_keys(PROMPT, 16, Deployment(version="0.5.23", model_name="hicache/tiny", page_size=16))
    assert report.key_prefix == a["key_prefix"]
    row = report.pages[LOST_PAGE]
    lost = row.object_keys[-1]
    suffix = lost[len(report.key_prefix + row.page_key) :]
    with StoreClient.connect(rpc, segment_size=0) as store:
        assert store.remove_keys([lost], prefix=report.key_prefix, force=True) == [0]

    before = requests_of(second)
    on_b = explain(second.url, metrics, "--allow-writes", "--json")
    assert on_b.exit_code == 0, on_b.output
    b = json.loads(on_b.stdout)
    assert requests_of(second) == before + 1  # explain sent exactly one request
    # The split is B's own meta_info, in tokens and in pages.
    assert b["meta_info"]["cached_tokens_details"]["storage"] == LOST_PAGE * 16
    assert b["tokens"] == {"device": 0, "host": 0, "storage": LOST_PAGE * 16, "recomputed": (6 - LOST_PAGE) * 16}
    assert b["page_split"] == {"device": 0, "host": 0, "storage": LOST_PAGE, "recomputed": 6 - LOST_PAGE}
    assert (b["first_missing"], b["first_missing_page"], b["l3_contiguous_pages"]) == (lost, LOST_PAGE, LOST_PAGE)
    assert b["present_objects"] == 11
    assert b["summary"] == (
        f"6 pages: 0 from device, 0 from host, {LOST_PAGE} from L3, {6 - LOST_PAGE} recomputed "
        f"because page {LOST_PAGE}'s `{suffix}` is missing."
    )
    # The human view says the same sentence and names the object.
    again = explain(second.url, metrics, "--allow-writes")
    assert again.exit_code == 0, again.output
    assert "6 pages: 6 from device" in " ".join(again.stdout.split())  # B now holds it in L1
    assert suffix.startswith("_") and suffix.endswith("_v")


def test_explain_unreachable_master_exits_3_before_sending(two_serves):
    first, _, _, _ = two_serves
    before = requests_of(first)
    result = explain(first.url, "127.0.0.1:1", "--allow-writes", "--timeout", "2")
    assert result.exit_code == 3, result.output
    assert requests_of(first) == before


def test_explain_without_master_is_bad_input(two_serves):
    first, _, _, _ = two_serves
    result = explain(first.url, "", "--allow-writes")
    assert result.exit_code == 2, result.output
