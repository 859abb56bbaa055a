"""`trace`, `serve`, `warm` and `prefetch` with side pools, on the embedded engine and a running serve
(real masters). A missing side-pool object fails the L3 lookup step, naming the pool, the page, the
rule and the prefix left; the figures left are SGLang's batch_exists_v2 answer for the same objects
(tests/engine/test_side_pools.py checks the engine's lookup against SGLang's on a real master)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.key_listing import expected_keys
from hicache_ops.commands.trace.run import run_embedded
from hicache_ops.commands.warm import deployment_of_serve
from hicache_ops.engine.builder import EngineSpec
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.server.side_pools import side_pools_of_serve
from hicache_ops.sglang.geometry import preset
from hicache_ops.sglang.side_pool_specs import side_pools_for
from serve_process import Serve

TOKENS = list(range(3000, 3200))  # 12 whole pages of 16 and 8 trailing tokens
IDS = ",".join(map(str, TOKENS))
READ_STEPS = [
    "local match",
    "prefetch decision",
    "batch_exists_v2",
    "batch_get_into",
    "stop policy",
    "insert",
    "load back",
    "device bytes",
]


def spec(version: str, pool_preset: str, geometry: str, tp_size: int = 1) -> EngineSpec:
    geo = preset(geometry)
    return EngineSpec(
        geometry=geo,
        page_size=16,
        device_tokens=1024,
        prefetch_threshold=64,
        stop_policy="wait_complete",
        sglang_version=version,
        tp_size=tp_size,
        side_pools=side_pools_for(None, pool_preset, version, geo.mla, 16),
    )


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_write_puts_one_mamba_state_per_node_and_verifies_it(version):
    run = run_embedded("write", TOKENS, spec(version, "qwen3-next", "tiny"))
    assert all(s.status == "PASS" for s in run.steps), [(s.name, s.summary) for s in run.steps]
    keys = next(s for s in run.steps if s.name == "object keys")
    assert keys.detail["ranks"]["tp0"]["side_pools"] == {"mamba": ["_0_temporal", "_0_conv_0"]}
    # One node of 12 pages: its Mamba state is written for the last page only.
    ((page, names),) = keys.detail["side_objects_by_page"].items()
    assert page == 11 and [n[-len("_0_temporal") :] for n in names][0] == "_0_temporal" and len(names) == 2
    put = next(s for s in run.steps if s.name == "batch_put_from").detail["objects"]
    assert len(put) == 24 + 2 and sum("pool" in o for o in put) == 2 and all(o["code"] == 0 for o in put)
    assert "all 26 object(s) exist" in run.steps[-1].summary


@pytest.mark.parametrize(
    "version, pool_preset, geometry, tp_size, side_objects",
    [
        ("0.5.23", "qwen3-next", "tiny", 1, 2),
        ("0.5.14", "deepseek-v3.2", "tiny-mla", 1, 12),
        ("0.5.23", "deepseek-v3.2-mtp", "tiny-mla", 1, 36),
        # MLA, 2 ranks: tp rank 0 writes the indexer object; both ranks read it into their own slots.
        ("0.5.23", "deepseek-v3.2", "tiny-mla", 2, 24),
        # SWA (window 8 pages) per rank: all 12 pages written by each rank, the last 8 read by each.
        ("0.5.23", "gpt-oss", "tiny", 2, 32),
    ],
)
def test_read_loads_and_verifies_side_objects(version, pool_preset, geometry, tp_size, side_objects):
    run = run_embedded("read", TOKENS, spec(version, pool_preset, geometry, tp_size))
    assert [s.name for s in run.steps] == READ_STEPS
    assert all(s.status == "PASS" for s in run.steps), [(s.name, s.summary) for s in run.steps]
    read = next(s for s in run.steps if s.name == "batch_get_into")
    assert f"and {side_objects} side-pool object(s)" in read.summary
    assert run.steps[-1].detail["storage_hit"] == 192


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize(
    "pool_preset, geometry, pool, rule, left",
    [
        # Nodes of 6 and 12 pages: the Mamba state of page 5 is the last one left (trailing_pages, N = 1).
        ("qwen3-next", "tiny", "mamba", "trailing_pages: the last 1 page(s)", 6),
        # The indexer object of page 11 gone: all_pages serves 11 pages.
        ("deepseek-v3.2", "tiny-mla", "indexer", "all_pages: every page", 11),
    ],
)
def test_missing_side_object_fails_the_lookup_naming_pool_page_rule_and_prefix(
    version, pool_preset, geometry, pool, rule, left
):
    run = run_embedded("read", TOKENS, spec(version, pool_preset, geometry), inject="missing-side-object")
    failed = run.failed_step
    assert failed is not None and failed.name == "batch_exists_v2" and run.steps[-1] is failed
    assert f"side pool {pool} lacks page 11" in failed.summary and rule in failed.summary
    assert f"loads {left} page(s)" in failed.summary
    cut = failed.detail["side_pool_cut"]
    assert cut["kv_pages"] == 12 and cut["loadable_pages"] == left
    (blocking,) = cut["blocking"]
    assert (blocking["pool"], blocking["page"]) == (pool, 11)
    if version == "0.5.23":
        assert cut["restorable_prefix_pages"] == ([6] if pool == "mamba" else list(range(1, 12)))


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--pool-preset", "qwen3-next", "--preset", "tiny-mla"], "qwen3-next is for an MHA model"),
        (["--pool-preset", "deepseek-v3.2"], "deepseek-v3.2 is for an MLA model"),
        (["--inject", "missing-side-object"], "needs side pools"),
        (["--pool", "auxiliary_swa"], "no Mooncake key rule"),
        (["--pool", "draft_swa", "--sglang-version", "0.5.14"], "no pool 'draft_swa'"),
    ],
)
def test_cli_bad_side_pools_exit_2(args, fragment):
    result = hicache(["trace", "read", "--tokens", IDS, *args, "--json"])
    assert result.exit_code == 2, result.stdout
    assert fragment in json.loads(result.stdout)["error"]["message"]


def test_cli_trace_read_fails_on_a_missing_mamba_state():
    result = hicache(
        [
            "trace",
            "read",
            "--tokens",
            IDS,
            "--pool-preset",
            "qwen3-next",
            "--prefetch-threshold",
            "64",
            "--inject",
            "missing-side-object",
            "--json",
        ]
    )
    assert result.exit_code == 1
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["name"] == "batch_exists_v2" and last["status"] == "FAIL" and "mamba" in last["summary"]


def test_serve_warm_prefetch_and_trace_with_a_pool_preset(tmp_path):
    serve = Serve(
        tmp_path / "s",
        "--device-tokens",
        "2048",
        "--prefetch-threshold",
        "32",
        "--pool-preset",
        "qwen3-next",
        "--hicache-storage-prefetch-policy",
        "wait_complete",
    )
    try:
        config = serve.client.stats()["config"]
        assert [(p["name"], p["spec"], p["suffixes"]) for p in config["side_pools"]] == [
            ("mamba", "mamba:conv=1,temporal=1", ["_0_temporal", "_0_conv_0"])
        ]
        rng = np.random.default_rng(7)
        prompts = tmp_path / "p.jsonl"
        # 100 tokens: 6 whole pages; a lookup covers input length - 1 = 6 pages, so it ends at the node's last page.
        prompts.write_text(
            "".join(json.dumps({"input_ids": rng.integers(0, 60_000, 100).tolist()}) + "\n" for _ in range(3))
        )
        wrong = hicache(["warm", str(prompts), "--serve", serve.url, "--pool-preset", "gpt-oss", "--json"])
        assert wrong.exit_code == 2 and "differ from the serve's" in json.loads(wrong.stdout)["error"]["message"]
        warmed = hicache(["warm", str(prompts), "--serve", serve.url, "--pool-preset", "qwen3-next", "--json"])
        assert warmed.exit_code == 0, warmed.stdout
        data = json.loads(warmed.stdout)
        # Every prompt: 12 KV objects and the 2 Mamba objects of its last page, all on the master.
        assert data["summary"]["written"] == 3 and all(p["objects"] == 14 for p in data["prompts"])
        stats = serve.client.stats()["stats"]
        assert stats["l3_side_objects_written"] == 6
        serve.client.flush()
        fetched = hicache(["prefetch", str(prompts), "--serve", serve.url, "--pool-preset", "qwen3-next", "--json"])
        assert fetched.exit_code == 0, fetched.stdout
        assert all(r["fetched_pages"] == 6 and r["verified"] for r in json.loads(fetched.stdout)["prompts"])
        assert serve.client.stats()["stats"]["l3_side_objects_read"] == 6
        serve.client.flush()
        ids = ",".join(map(str, json.loads(prompts.read_text().splitlines()[0])["input_ids"]))
        observed = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--json"])
        steps = [(s["name"], s["status"]) for s in map(json.loads, observed.stdout.splitlines())]
        assert ("batch_exists_v2", "PASS") in steps and ("batch_get_into", "PASS") in steps, steps
        # The Mamba state of the prompt's one node (page 5) removed from the master: nothing is loadable.
        first = json.loads(prompts.read_text().splitlines()[0])["input_ids"]
        report = expected_keys(first, 16, deployment_of_serve(config), pools=side_pools_of_serve(config))
        row = report.pages[5]
        mamba = [k for k, pool in zip(row.object_keys, row.object_pools, strict=True) if pool == "mamba"]
        with StoreClient.connect(config["master_rpc_address"], segment_size=0) as store:
            assert store.remove_keys(mamba, prefix=report.key_prefix + row.page_key, force=True) == [0, 0]
        observed = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--json"])
        assert observed.exit_code == 1
        last = json.loads(observed.stdout.splitlines()[-1])
        assert (last["name"], last["status"]) == ("batch_exists_v2", "FAIL")
        assert "side pool mamba lacks page 5" in last["summary"] and "loads 0 page(s)" in last["summary"]
    finally:
        serve.stop()
