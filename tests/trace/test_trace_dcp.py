"""`trace write|read --dcp-size`: SGLang 0.5.23 decode context parallel on the embedded engine.

The write runs against a real mooncake_master; SGLang 0.5.23's own MooncakeStore and MLA host pool
(one per tp rank, CPU, in this process) are the oracle: the keys it builds for each DCP rank are the
objects the trace wrote, its batch_exists finds them, and reading them into its host pool puts in
each rank's rows exactly the tokens SGLang's DCP owner rule gives that rank (docs/keys.md#dcp).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.trace.run import run_embedded
from hicache_ops.commands.trace.steps import trace_write
from hicache_ops.engine.builder import EngineSpec, build_accounting, build_bytes
from hicache_ops.engine.reference import reference_page
from hicache_ops.sglang.geometry import preset

PAGE = 16  # the logical page: 8 tokens per DCP rank
PAGES = 4
TOKENS = list(range(5000, 5000 + PAGES * PAGE + 5))
SPEC = EngineSpec(
    geometry=preset("tiny-mla"),
    page_size=PAGE,
    device_tokens=512,
    tp_size=4,
    dcp_size=2,
    sglang_version="0.5.23",
    model_name="deepseek-ai/DeepSeek-V3",
    prefetch_threshold=32,
    stop_policy="wait_complete",
    torch_device="cpu",
)


def sglang_store(master, tp_rank: int):
    """SGLang 0.5.23's MooncakeStore for one tp rank over its own MLA host pool, as its controller builds it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
        from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    g = SPEC.geometry
    dcp_rank = tp_rank % SPEC.dcp_size
    device = MLATokenToKVPool(
        PAGES * PAGE * 2,
        PAGE,
        torch.bfloat16,
        kv_lora_rank=g.kv_lora_rank,
        qk_rope_head_dim=g.qk_rope_head_dim,
        layer_num=g.layers,
        device="cpu",
        enable_memory_saver=False,
        start_layer=0,
        end_layer=g.layers,
    )
    # page_size arrives widened (the logical page), as from SGLang's DCP allocator
    host = MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        PAGE,
        "page_first",
        pin_memory=False,
        device="cpu",
        dcp_size=SPEC.dcp_size,
        dcp_rank=dcp_rank,
        device_capacity_tokens=device.size,
        start_layer=0,
        end_layer=g.layers,
        target_layer_num=g.layers,
        override_kv_cache_dim=device.kv_cache_dim,
    )
    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=SPEC.tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=True,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name=SPEC.model_name,
        tp_lcm_size=None,
        should_split_heads=False,
        dcp_size=SPEC.dcp_size,
        dcp_rank=dcp_rank,
        logical_page_size=PAGE,
        extra_config={
            "master_server_address": master.rpc_address,
            "metadata_server": master.metadata_server,
            "protocol": "tcp",
            "device_name": "",
            "global_segment_size": (16 << 20) * SPEC.tp_size,  # SGLang splits it over tp ranks
            "local_hostname": "127.0.0.1",
        },
    )
    store = MooncakeStore(config, host)
    store.register_mem_pool_host(host)
    return store, config, host


def test_dcp_write_objects_are_what_sglang_names_and_holds_per_rank(mooncake_master):
    import torch
    from sglang.srt.layers.dcp.layout import maybe_dcp_kernel_indices

    from hicache_ops.mooncake.store_client import StoreClient

    client = StoreClient.connect(mooncake_master.rpc_address, segment_size=64 << 20)
    stores = []
    try:
        cache = build_bytes(SPEC, client)
        steps = trace_write(cache, TOKENS)
        assert [s.status for s in steps] == ["PASS"] * 6 + ["INFO"] + ["PASS"] * 3, [(s.name, s.summary) for s in steps]
        assert (
            steps[6].name == "dcp shards" and "token i of each 16-token page goes to DCP rank i % 2" in steps[6].summary
        )
        table = steps[6].detail["dcp_pages"]
        page_keys = [p["page_key"] for p in table]
        assert [p["page"] for p in table] == list(range(PAGES))
        put = next(s for s in steps if s.name == "batch_put_from").detail["objects"]
        assert len(put) == PAGES * SPEC.dcp_size  # one object per page per DCP shard, from tp ranks 0 and 1

        for tp_rank in range(SPEC.tp_size):
            store, config, host = sglang_store(mooncake_master, tp_rank)
            stores.append(store)
            d = config.dcp_rank
            logical = torch.arange(0, PAGES * PAGE)
            # The key SGLang's builder gives this rank, per page, is the object the trace shows and wrote.
            theirs = store._batch_preprocess(store._tag_keys(page_keys), logical)[0]
            ours = [p["shards"][d]["object_key"] for p in table]
            assert theirs == ours, tp_rank
            assert all(
                k.startswith("deepseek-ai-DeepSeek-V3_tp4_dcp2_page16_pp1_cp1_") and k.endswith(f"_dcp{d}_cp0_k")
                for k in ours
            )
            # SGLang's writer rule: the first DCP group writes, one rank per shard.
            writers = {w for p in table for w in p["shards"][d]["writer_tp_ranks"]}
            assert config.is_storage_writer == (tp_rank in writers) == (tp_rank < SPEC.dcp_size)
            assert tp_rank in table[0]["shards"][d]["reader_tp_ranks"]
            assert store.batch_exists(page_keys) == PAGES
            assert store.batch_get_v1(page_keys, logical) == [True] * PAGES
            for page in table:
                start = page["page"] * PAGE
                slots = torch.arange(start, start + PAGE)
                # SGLang's owner rule picks the logical slots this rank holds; the trace shows the same tokens.
                owned = slots[d :: SPEC.dcp_size].tolist()
                assert page["shards"][d]["token_positions"] == owned
                assert page["shards"][d]["token_ids"] == [TOKENS[i] for i in owned]
                rows = maybe_dcp_kernel_indices(slots, SPEC.dcp_size, d)
                assert rows.tolist() == [s // SPEC.dcp_size for s in owned]
                # What SGLang's pool now holds in those rows is the reference KV of exactly those tokens.
                got = host.get_data_page(start, flat=False).contiguous().view(torch.uint16).numpy()
                ref = reference_page(page["page_key"], SPEC.geometry, PAGE)  # (layers, page, 1, C), every token
                want = np.ascontiguousarray(ref[:, d :: SPEC.dcp_size].transpose(1, 0, 2, 3))  # page_first rows
                assert got.tobytes() == want.tobytes(), (tp_rank, page["page"])
                shard = page["shards"][d]
                assert client.get(shard["object_key"]) == want.tobytes() and shard["bytes"] == want.nbytes
    finally:
        for store in stores:
            store.store.close()
        client.close()


def test_a_missing_shard_object_fails_naming_its_dcp_rank():
    run = run_embedded("read", TOKENS, SPEC, inject="missing-dcp-shard")
    failed = run.failed_step
    assert failed is not None and failed.name == "batch_exists", [(s.name, s.status) for s in run.steps]
    assert "misses the shard of DCP rank(s) 1" in failed.summary
    (entry,) = failed.detail["missing_shards"]
    assert entry["dcp_rank"] == 1 and entry["page"] == 1 and entry["tp_ranks"] == [1, 3]
    assert entry["object_key"].endswith("_dcp1_cp0_k")
    assert failed.causes[0].startswith("DCP rank 1's object of page 1 is missing")
    # A DCP prefix names its tp and pp sizes: a lost shard is not blamed on another TP layout.
    assert not any("another TP/PP layout" in c for c in failed.causes), failed.causes


def test_a_lookup_without_dcp_says_dcp():
    run = run_embedded("read", TOKENS, replace(SPEC, dcp_size=1), inject="dcp-mismatch")
    assert run.scenario["writer"]["dcp_size"] == 2 and run.scenario["reader"]["dcp_size"] == 1
    failed = run.failed_step
    assert failed is not None and failed.name == "batch_exists"
    dcp = [c for c in failed.causes if "DCP prefix" in c]
    assert dcp and "looked up without DCP" in dcp[0] and f"contiguous prefix would be {PAGES} pages" in dcp[0]


def test_healthy_dcp_read_reuses_every_page_across_instances():
    run = run_embedded("read", TOKENS, SPEC)
    assert all(s.status in ("PASS", "INFO") for s in run.steps), [(s.name, s.summary) for s in run.steps]
    assert "dcp shards" in [s.name for s in run.steps]
    final = run.steps[-1].detail
    assert final["storage_hit"] == PAGES * PAGE and final["mismatched_pages"] == 0


def test_accounting_counts_each_rank_its_shard():
    g = SPEC.geometry
    shard_bytes = (PAGE // SPEC.dcp_size) * g.layers * g.kv_cache_dim * g.itemsize
    cache = build_accounting(SPEC)
    assert cache.plane.backup([0, 1], [0, 1]) == 2 * SPEC.tp_size * shard_bytes
    # Without DCP every rank holds the whole page: twice the bytes for DCP 2.
    assert build_accounting(replace(SPEC, dcp_size=1)).plane.backup([0], [0]) == SPEC.tp_size * 2 * shard_bytes
    keys = sorted(cache.l3.schemes[r].object_keys("ab" * 32)[0] for r in range(SPEC.tp_size))
    assert [k[-11:] for k in keys] == ["_dcp0_cp0_k"] * 2 + ["_dcp1_cp0_k"] * 2


@pytest.mark.parametrize(
    "args, fragment",
    [
        (
            ["--preset", "tiny-mla", "--tp-size", "2", "--dcp-size", "2", "--sglang-version", "0.5.14"],
            "SGLang 0.5.14 has no DCP",
        ),
        (["--tp-size", "2", "--dcp-size", "2", "--sglang-version", "0.5.23"], "needs an MLA model"),
        (
            ["--preset", "tiny-mla", "--tp-size", "3", "--dcp-size", "2", "--sglang-version", "0.5.23"],
            "not a multiple of dcp-size 2",
        ),
        (
            [
                "--preset",
                "tiny-mla",
                "--tp-size",
                "2",
                "--dcp-size",
                "2",
                "--sglang-version",
                "0.5.23",
                "--hicache-mem-layout",
                "layer_first",
            ],
            "multi-buffer",
        ),
    ],
)
def test_cli_refuses_dcp_it_cannot_trace(args, fragment):
    result = hicache(["trace", "write", "--tokens", ",".join(map(str, TOKENS)), *args])
    assert result.exit_code == 2 and fragment in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_cli_write_json_has_the_dcp_shards_step():
    result = hicache(
        [
            "trace",
            "write",
            "--tokens",
            ",".join(map(str, TOKENS)),
            "--preset",
            "tiny-mla",
            "--tp-size",
            "2",
            "--dcp-size",
            "2",
            "--sglang-version",
            "0.5.23",
            "--json",
        ]
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    records = {r["name"]: r for r in map(json.loads, result.stdout.splitlines())}
    shards = records["dcp shards"]["detail"]["dcp_pages"][0]["shards"]
    assert [s["token_positions"] for s in shards] == [list(range(0, PAGE, 2)), list(range(1, PAGE, 2))]
    assert records["verify on master"]["status"] == "PASS"


def test_serve_with_dcp_traces_warms_and_names_a_lost_shard(tmp_path):
    from hicache_ops.mooncake.store_client import StoreClient
    from serve_process import Serve

    serve = Serve(
        tmp_path,
        "--preset",
        "tiny-mla",
        "--tp-size",
        "2",
        "--dcp-size",
        "2",
        "--sglang-version",
        "0.5.23",
        "--page-size",
        str(PAGE),
        "--device-tokens",
        "512",
        "--prefetch-threshold",
        "32",
        "--hicache-storage-prefetch-policy",
        "wait_complete",
    )
    try:
        config = serve.client.stats()["config"]
        assert config["dcp_size"] == 2 and config["rank_page_size"] == PAGE // 2
        assert config["key_prefix"] == "hicache-tiny_tp2_dcp2_page16_pp1_cp1_"
        ids = ",".join(map(str, TOKENS))
        write = hicache(["trace", "write", "--tokens", ids, "--serve", serve.url, "--allow-writes", "--json"])
        assert write.exit_code == 0, write.stdout
        records = {r["name"]: r for r in map(json.loads, write.stdout.splitlines())}
        page1 = records["dcp shards"]["detail"]["dcp_pages"][1]
        # warm checks the serve's objects under its DCP names: the prompt is already complete.
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps({"input_ids": TOKENS}) + "\n")
        warm = hicache(["warm", str(prompts), "--serve", serve.url, "--json"])
        assert warm.exit_code == 0 and json.loads(warm.stdout)["summary"]["present"] == 1, warm.stdout

        lost = page1["shards"][1]["object_key"]
        client = StoreClient.connect(config["master_rpc_address"], segment_size=16 << 20)
        try:
            assert client.remove_keys([lost], prefix=config["key_prefix"], force=True) == [0]
        finally:
            client.close()
        serve.client.flush()
        observed = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--json"])  # read-only
        read = hicache(["trace", "read", "--tokens", ids, "--serve", serve.url, "--flush", "--allow-writes", "--json"])
        for result in (observed, read):
            assert result.exit_code == 1, result.stdout
            records = [json.loads(line) for line in result.stdout.splitlines()]
            failed = records[-1]
            assert "dcp shards" in [r["name"] for r in records]
            assert failed["name"] == "batch_exists" and "misses the shard of DCP rank(s) 1" in failed["summary"]
            assert failed["detail"]["missing_shards"][0]["object_key"] == lost
    finally:
        serve.stop()


def test_a_corrupted_shard_fails_verification_and_missing_v_is_refused_under_mla():
    run = run_embedded("read", TOKENS, SPEC, inject="corrupted-object")  # DCP rank 0's object of page 1
    failed = run.failed_step
    assert failed is not None and failed.name == "batch_get_into" and failed.detail["corrupt_pages"] == [1]
    result = hicache(
        [
            "trace",
            "read",
            "--tokens",
            ",".join(map(str, TOKENS)),
            "--preset",
            "tiny-mla",
            "--tp-size",
            "2",
            "--dcp-size",
            "2",
            "--sglang-version",
            "0.5.23",
            "--inject",
            "missing-v",
        ]
    )
    assert result.exit_code == 2 and "only `_k` objects" in result.stderr, result.stderr
