"""The tap: SGLang's real MooncakeStore (CPU host pool, embedded master) with and without the tap,
built by SGLang's own StorageBackendFactory from the flags `hicache tap` prints; the recording it
writes; `hicache trace show` over that recording; and the CLI's input errors.

No mocks: SGLang 0.5.23's MooncakeStore, host pool and factory, and a real mooncake_master.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import uuid

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore  # noqa: E402

from cli_runner import hicache
from hicache_ops.commands.tap.backend import CLASS_NAME
from hicache_ops.commands.tap.recording import (
    META_METHODS,
    PATH_ENV,
    STORAGE_METHODS,
    Recorder,
    rank_suffix,
    recording_path,
    with_suffix,
)
from hicache_ops.commands.trace.show import load_records, percentile, show
from hicache_ops.results import json_data
from hicache_ops.sglang.page_keys import ObjectKeyScheme, page_keys

LAYERS, HEADS, HEAD_DIM, PAGE = 2, 2, 16, 4
DEVICE_TOKENS = 64
MODEL = "Qwen/Qwen3-0.6B"
VERSION = "0.5.23"
K_BYTES = LAYERS * PAGE * HEADS * HEAD_DIM * 2  # one page's K (or V) object, bf16


# --- SGLang's pieces on the CPU -----------------------------------------------------------------


def host_pool(seed: int = 7) -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool (page_first, pin_memory=False) filled with deterministic bytes."""
    k = torch.zeros(LAYERS, DEVICE_TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    v = torch.zeros_like(k)
    ks, vs = tuple(k.unbind(0)), tuple(v.unbind(0))

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=ks, v=vs, k_data_ptrs=ptrs(ks), v_data_ptrs=ptrs(vs), layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=HEAD_DIM, v_head_dim=HEAD_DIM, dtype=k.dtype,
        device=torch.device("cpu"),
    )  # fmt: skip
    with host_memory_budget_scope(1 << 40):
        pool = MHATokenToKVPoolHost(
            info, 2.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
            device_capacity_tokens=DEVICE_TOKENS, start_layer=0, end_layer=LAYERS,
        )  # fmt: skip
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return pool


def slots(pages) -> torch.Tensor:
    """Host token slots of whole pages, as SGLang's controller passes them."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def page_bytes(pool, page: int) -> torch.Tensor:
    """K and V bytes of one host page (page_first: (2, size, L, H, D))."""
    return pool.kv_buffer[:, page * PAGE : (page + 1) * PAGE].contiguous().view(torch.uint8).clone()


def mooncake_extra(master, tag: str) -> dict:
    return {
        "master_server_address": master.rpc_address,
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "tcp",
        "device_name": "",
        "local_hostname": "127.0.0.1",
        "global_segment_size": 32 << 20,
        "extra_backend_tag": tag,
    }


def storage_config(extra: dict) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=MODEL, extra_config=dict(extra),
    )  # fmt: skip


def close_client(backend) -> None:
    """Unmount before the session master stops (MooncakeStore.close() is a no-op)."""
    store = getattr(backend, "store", None)
    if store is not None:
        store.close()


# The sequence both backends run: (name, callable(backend) -> comparable result).
KEYS = page_keys(list(range(1000, 1000 + 8 * PAGE)), PAGE, VERSION)


def run_sequence(backend) -> list:
    out = []

    def step(name, value):
        out.append((name, value))

    step("exists-empty", backend.batch_exists(KEYS))
    step("get-before-write", backend.batch_get_v1(KEYS[:2], slots([20, 21])))
    step("set-6", backend.batch_set_v1(KEYS[:6], slots(range(6))))
    step("exists-after-set", backend.batch_exists(KEYS))
    r = backend.batch_exists_v2(KEYS[:4])
    step("exists-v2", (r.kv_hit_pages, {str(k): v for k, v in r.extra_pool_hit_pages.items()}))
    step("get-6", backend.batch_get_v1(KEYS[:6], slots(range(10, 16))))
    step("get-tail", backend.batch_get_v1(KEYS[4:8], slots(range(16, 20))))
    step("set-again", backend.batch_set_v1(KEYS[:6], slots(range(6))))
    return out


EXPECTED = [
    ("exists-empty", 0),
    ("get-before-write", [False, False]),
    ("set-6", [True] * 6),
    ("exists-after-set", 6),
    ("exists-v2", (4, {"kv": 4})),
    ("get-6", [True] * 6),
    ("get-tail", [True, True, False, False]),
    ("set-again", [True] * 6),
]


@pytest.fixture(scope="module")
def runs(mooncake_master, tmp_path_factory):
    """The same sequence on SGLang's MooncakeStore directly and through the tap (SGLang's factory)."""
    tmp = tmp_path_factory.mktemp("tap")
    run_id = uuid.uuid4().hex[:8]

    direct_pool = host_pool()
    direct = MooncakeStore(storage_config(mooncake_extra(mooncake_master, f"direct-{run_id}")), direct_pool)
    direct.register_mem_pool_host(direct_pool)

    # The extra-config exactly as `hicache tap` prints it, merged with the Mooncake keys.
    tap_path = str(tmp / "rec.jsonl")
    res = hicache(
        [
            "tap",
            "--json",
            "--path",
            tap_path,
            "--extra-config",
            json.dumps(mooncake_extra(mooncake_master, f"tap-{run_id}")),
        ]
    )
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    extra = json.loads(plan["flags"][plan["flags"].index("--hicache-storage-backend-extra-config") + 1])

    tapped_pool = host_pool()
    # As SGLang's cache controller attaches a backend: create, register the host pool, then the hook.
    tapped = StorageBackendFactory.create_backend(plan["flags"][2], storage_config(extra), tapped_pool)
    tapped.register_mem_pool_host(tapped_pool)
    tapped.on_host_pools_registered()
    try:
        before = {p: page_bytes(direct_pool, p) for p in range(24)}
        result = {
            "plan": plan,
            "extra": extra,
            "run_id": run_id,
            "path": tap_path,
            "direct": run_sequence(direct),
            "tapped": run_sequence(tapped),
            "direct_pool": direct_pool,
            "tapped_pool": tapped_pool,
            "before": before,
            "backend": tapped,
        }
        yield result
    finally:
        close_client(direct)
        close_client(tapped.inner)


# --- identical behaviour ------------------------------------------------------------------------


def test_factory_builds_the_tap_around_sglangs_store(runs):
    tapped = runs["backend"]
    assert type(tapped).__name__ == CLASS_NAME and isinstance(tapped, HiCacheStorage)
    assert type(tapped.inner) is MooncakeStore  # SGLang's own class, not a copy
    assert runs["extra"]["module_path"] == "hicache_ops.commands.tap" and runs["extra"]["interface_v1"] == 1
    assert tapped.recording == runs["path"]
    # Attributes SGLang reads off the backend pass through to the store.
    assert tapped.config_prefix == f"tap-{runs['run_id']}_Qwen-Qwen3-0.6B"
    assert tapped.mem_pool_host is runs["tapped_pool"]


def test_same_results_with_and_without_the_tap(runs):
    assert runs["direct"] == EXPECTED
    assert runs["tapped"] == runs["direct"]


def test_same_bytes_in_the_host_pool(runs):
    direct, tapped, before = runs["direct_pool"], runs["tapped_pool"], runs["before"]
    assert torch.equal(direct.kv_buffer.view(torch.uint8), tapped.kv_buffer.view(torch.uint8))
    # The bytes really moved: pages 0..5 were written and read back into 10..15 (and 4, 5 into 16, 17) ...
    for src, dst in zip(range(6), range(10, 16), strict=True):
        assert torch.equal(page_bytes(direct, dst), before[src])
        assert not torch.equal(before[dst], before[src])
    assert torch.equal(page_bytes(direct, 16), before[4]) and torch.equal(page_bytes(direct, 17), before[5])
    # ... and failed reads left their pages alone.
    for p in (18, 19, 20, 21):
        assert torch.equal(page_bytes(direct, p), before[p])


# --- the recording ------------------------------------------------------------------------------


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_recording_has_one_line_per_call(runs):
    lines = _lines(runs["path"])
    meta = [r["method"] for r in lines if r["method"] in META_METHODS]
    calls = [r for r in lines if r["method"] in STORAGE_METHODS]
    assert len(meta) + len(calls) == len(lines)  # every line is one of the two groups
    assert meta == ["open", "register_mem_pool_host", "on_host_pools_registered"]
    assert [r["method"] for r in calls] == [
        "batch_exists", "batch_get_v1", "batch_set_v1", "batch_exists", "batch_exists_v2",
        "batch_get_v1", "batch_get_v1", "batch_set_v1",
    ]  # fmt: skip
    for r in lines:
        assert r["v"] == 1 and r["pid"] == os.getpid() and r["tp_rank"] == 0 and r["error"] is None
        assert isinstance(r["ts"], float) and r["latency_ms"] >= 0
    assert [r["seq"] for r in lines] == sorted(r["seq"] for r in lines)
    for r, (name, expected) in zip(calls, EXPECTED, strict=True):
        assert {"keys", "pages", "result", "bytes", "latency_ms"} <= set(r)
        if name != "exists-v2":
            assert r["result"] == expected, name
    open_rec = lines[0]
    assert open_rec["key_prefix"] == f"tap-{runs['run_id']}_Qwen-Qwen3-0.6B_"
    assert open_rec["mooncake"]["master_server_address"] == runs["extra"]["master_server_address"]
    assert lines[1]["host_pool"]["layout"] == "page_first" and lines[1]["host_pool"]["page_size"] == PAGE


def test_recording_fields_per_method(runs):
    calls = [r for r in _lines(runs["path"]) if r["method"] in STORAGE_METHODS]
    exists_empty, get_early, set6, exists6, exists_v2, get6, get_tail, set_again = calls
    scheme = ObjectKeyScheme(VERSION, model_name=MODEL, extra_backend_tag=f"tap-{runs['run_id']}")

    assert exists_empty["keys"] == KEYS and exists_empty["pages"] == 8 and exists_empty["hit_pages"] == 0
    assert exists6["hit_pages"] == 6 and exists_v2["hit_pages"] == 4
    assert exists_v2["result"]["kv_hit_pages"] == 4
    # batch_exists queries every object of the pages, in SGLang's order (our keys module agrees).
    assert exists6["objects"]["exist"][0]["keys"] == scheme.all_object_keys(KEYS)
    assert exists6["objects"]["exist"][0]["codes"] == [1] * 12 + [0] * 4

    # A set: exists first, then puts only the missing objects, each K_BYTES.
    assert set6["pages"] == 6 and set6["host_pages"] == list(range(6)) and set6["ok_pages"] == 6
    assert set6["objects"]["exist"][0]["codes"] == [0] * 12
    put = set6["objects"]["put"][0]
    assert put["keys"] == scheme.all_object_keys(KEYS[:6]) and put["codes"] == [0] * 12
    assert put["sizes"] == [K_BYTES] * 12 and set6["bytes"] == 12 * K_BYTES
    assert set_again["objects"]["exist"][0]["codes"] == [1] * 12 and "put" not in set_again["objects"]
    assert set_again["bytes"] == 0 and set_again["result"] == [True] * 6

    # Gets: bytes read per object, -704 for the missing ones.
    assert get6["bytes"] == 12 * K_BYTES and get6["host_pages"] == list(range(10, 16))
    assert get6["objects"]["get"][0]["codes"] == [K_BYTES] * 12
    assert get_tail["objects"]["get"][0]["codes"] == [K_BYTES] * 4 + [-704] * 4
    assert get_tail["ok_pages"] == 2 and get_tail["prefix_ok"] == 2 and get_tail["bytes"] == 4 * K_BYTES
    assert get_early["result"] == [False, False] and get_early["bytes"] == 0


def test_recording_failure_is_logged_once_and_calls_still_return(mooncake_master, tmp_path, caplog):
    """tap_path is a directory: nothing can be appended; the store answers as before, one warning."""
    extra = {**mooncake_extra(mooncake_master, f"bad-{uuid.uuid4().hex[:8]}"),
             "backend_name": "hicache_tap", "module_path": "hicache_ops.commands.tap", "class_name": CLASS_NAME,
             "interface_v1": 1, "tap_path": str(tmp_path)}  # fmt: skip
    pool = host_pool()
    with caplog.at_level(logging.WARNING, logger="hicache_ops.commands.tap"):
        tapped = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
        try:
            tapped.register_mem_pool_host(pool)
            assert tapped.batch_exists(KEYS[:2]) == 0
            assert tapped.batch_set_v1(KEYS[:2], slots([0, 1])) == [True, True]
            assert tapped.batch_exists(KEYS[:2]) == 2
        finally:
            close_client(tapped.inner)
    warnings = [r for r in caplog.records if "cannot append to the recording" in r.getMessage()]
    assert len(warnings) == 1


def test_rank_file_and_store_errors_are_recorded_and_reraised(mooncake_master, tmp_path):
    """tp rank 1 of 2 records to its own file with its own object suffix; an exception from the store
    is recorded and reaches the caller unchanged."""
    tag = f"rank-{uuid.uuid4().hex[:8]}"
    extra = {**mooncake_extra(mooncake_master, tag), "backend_name": "hicache_tap",
             "module_path": "hicache_ops.commands.tap", "class_name": CLASS_NAME, "interface_v1": 1,
             "tap_path": str(tmp_path / "r.jsonl")}  # fmt: skip
    cfg = storage_config(extra)
    cfg.tp_size, cfg.tp_rank = 2, 1
    pool = host_pool()
    tapped = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    try:
        tapped.register_mem_pool_host(pool)
        assert tapped.recording == str(tmp_path / "r.tp1.jsonl")
        assert tapped.batch_set_v1(KEYS[:1], slots([3])) == [True]
        with pytest.raises(AssertionError):  # MooncakeStore's own check: one page of slots per key
            tapped.batch_get_v1(KEYS[:2], slots([5]))
    finally:
        close_client(tapped.inner)
    lines = _lines(tmp_path / "r.tp1.jsonl")
    set1, failed = [r for r in lines if r["method"] in STORAGE_METHODS]
    assert set1["tp_rank"] == 1 and set1["tp_size"] == 2
    assert set1["objects"]["put"][0]["keys"] == ObjectKeyScheme(
        VERSION, model_name=MODEL, extra_backend_tag=tag, tp_rank=1, tp_size=2
    ).all_object_keys(KEYS[:1])
    assert failed["error"].startswith("AssertionError") and failed["result"] is None
    s = json_data(show([tmp_path / "r.tp1.jsonl"]))
    assert s["failures"]["by_kind"] == {"raised": 1} and s["source"]["ranks"] == ["tp1"]


def test_v2_arguments_and_results_are_recorded_as_json():
    """SGLang's own PoolTransfer / PoolTransferResult turned into the recording's fields."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult

    from hicache_ops.commands.tap.recording import describe_call, describe_result, to_jsonable

    transfers = [
        PoolTransfer(name=PoolName.KV, keys=KEYS[:2], host_indices=slots([1, 2])),
        PoolTransfer(name=PoolName.MAMBA, keys=KEYS[1:2], host_indices=slots([7]),
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ]  # fmt: skip
    rec = describe_call("batch_get_v2", (transfers,), {}, PAGE)
    assert rec["keys"] == KEYS[:2] and rec["pages"] == 2
    assert rec["transfers"][1] == {"name": "mamba", "pages": 1, "keys": KEYS[1:2], "hit_policy": "trailing_pages"}
    out = describe_result("batch_get_v2", {PoolName.KV: [True, False], PoolName.MAMBA: [True]}, rec)
    assert out["result"] == {"kv": [True, False], "mamba": [True]} and out["ok_pages"] == 1
    res = describe_result("batch_exists_v2", PoolTransferResult(3, {PoolName.KV: 3}, [1, 2, 3]), {})
    assert res["hit_pages"] == 3 and res["result"]["extra_pool_hit_pages"] == {"kv": 3}
    assert json.loads(json.dumps(to_jsonable(transfers)))[0]["host_indices"] == slots([1, 2]).tolist()


def test_recorder_appends_whole_lines_from_many_processes(tmp_path):
    path = tmp_path / "shared.jsonl"
    code = (
        "import sys; from hicache_ops.commands.tap.recording import Recorder\n"
        "r = Recorder(sys.argv[1])\n"
        "for i in range(300): r.write({'method': 'batch_exists', 'who': sys.argv[2], 'i': i, 'pad': 'x' * 5000})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(n)]) for n in range(4)]
    try:
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    records = load_records([path])
    assert len(records) == 1200
    for n in range(4):
        assert sorted(r["i"] for r in records if r["who"] == str(n)) == list(range(300))


def test_recording_paths_per_rank(monkeypatch):
    monkeypatch.delenv(PATH_ENV, raising=False)
    assert rank_suffix(0, 1) == "" and rank_suffix(1, 2) == ".tp1" and rank_suffix(1, 2, 1, 2) == ".tp1.pp1"
    assert with_suffix("/r/tap.jsonl", ".tp3") == "/r/tap.tp3.jsonl" and with_suffix("/r/tap", ".tp3") == "/r/tap.tp3"
    cfg = storage_config({"tap_path": "/r/tap.jsonl"})
    assert recording_path(cfg) == "/r/tap.jsonl"
    cfg.tp_size, cfg.tp_rank = 4, 2
    assert recording_path(cfg) == "/r/tap.tp2.jsonl"
    monkeypatch.setenv(PATH_ENV, "/env/tap.jsonl")
    assert recording_path(storage_config({})) == "/env/tap.jsonl"
    assert recording_path(storage_config({"tap_path": "/cfg.jsonl"})) == "/cfg.jsonl"  # extra-config wins


def test_recorder_never_raises(tmp_path, caplog):
    rec = Recorder(str(tmp_path / "missing-dir-is-created" / "x.jsonl"))
    assert rec.write({"method": "batch_exists", "v": 1})
    blocked = Recorder(str(tmp_path))  # a directory
    with caplog.at_level(logging.WARNING, logger="hicache_ops.commands.tap"):
        assert not blocked.write({"method": "x"}) and not blocked.write({"method": "y"})
    assert blocked.failures == 2 and len(caplog.records) == 1


# --- trace show ---------------------------------------------------------------------------------


def test_trace_show_summarises_the_recording(runs):
    res = hicache(["trace", "show", runs["path"], "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s == json_data(show([runs["path"]]))  # the CLI is the library call
    assert s["source"]["storage_calls"] == 8 and s["source"]["ranks"] == ["tp0"]
    assert s["source"]["opens"][0]["key_prefix"] == f"tap-{runs['run_id']}_Qwen-Qwen3-0.6B_"
    m = s["methods"]
    assert {k: v["calls"] for k, v in m.items()} == {
        "batch_exists": 2,
        "batch_exists_v2": 1,
        "batch_get_v1": 3,
        "batch_set_v1": 2,
    }
    assert m["batch_get_v1"]["bytes"] == 16 * K_BYTES and m["batch_set_v1"]["bytes"] == 12 * K_BYTES
    assert m["batch_get_v1"]["pages"] == 12
    for v in m.values():
        lat = v["latency_ms"]
        assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert s["ranks"]["tp0"] == m

    q = s["queries"]
    assert [(x["hit_pages"], x["pages"]) for x in q["per_query"]] == [(0, 8), (6, 8), (4, 4)]
    assert (q["full_hits"], q["partial_hits"], q["misses"]) == (1, 1, 1)
    assert q["pages_asked"] == 20 and q["pages_hit"] == 10

    f = s["failures"]
    assert f["by_kind"] == {"read_failed": 2}
    early, tail = f["list"]
    assert early["first_failed_key"] == KEYS[0] and early["failed_pages"] == 2
    assert tail["first_failed_key"] == KEYS[6] and tail["first_failed_index"] == 2
    assert "-704" in tail["detail"]

    pages = s["keys"]["pages"]
    assert pages["written"] == 6 and pages["read_ok"] == 6
    assert pages["read_ok_written_here"] == 6 and pages["read_ok_written_before_read"] == 6
    assert pages["read_never_written"] == 2 and pages["lists"]["read_never_written"] == sorted(KEYS[6:8])
    assert pages["read_failed_after_write"] == 0 and pages["written_never_read"] == 0
    assert s["keys"]["verdict"].startswith("yes: reads found 6 of the 6 page(s)")
    objs = s["keys"]["objects"]
    assert objs["put"] == 12 and objs["get_ok"] == 12 and objs["get_ok_put_here"] == 12
    # Keys 0, 1 failed before the write and were read later: only keys 6, 7 stay failed.
    assert objs["get_failed"] == 4 and objs["get_failed_put_here"] == 0 and objs["get_failed_codes"] == {"-704": 4}
    assert objs["lists"]["get_failed_never_put"] == sorted(
        ObjectKeyScheme(VERSION, model_name=MODEL, extra_backend_tag=f"tap-{runs['run_id']}").all_object_keys(KEYS[6:8])
    )

    text = hicache(["trace", "show", runs["path"]])
    assert text.exit_code == 0, text.output
    for needle in ("batch_get_v1", "storage-hit prefix", "read_failed", "reads found 6"):
        assert needle in text.stdout


def test_trace_show_spots_written_pages_that_fail_to_read(tmp_path):
    """Synthetic lines in the tap's format: a page written, then read back as missing."""
    base = {"v": 1, "pid": 1, "tp_rank": 0, "error": None, "latency_ms": 1.0, "bytes": 0}
    lines = [
        {**base, "seq": 1, "ts": 1.0, "method": "batch_set_v1", "keys": ["a", "b"], "pages": 2, "result": [True, True]},
        {
            **base,
            "seq": 2,
            "ts": 2.0,
            "method": "batch_get_v1",
            "keys": ["a", "b"],
            "pages": 2,
            "result": [True, False],
        },
        {
            **base,
            "seq": 3,
            "ts": 3.0,
            "method": "batch_exists",
            "keys": ["a", "b"],
            "pages": 2,
            "result": 1,
            "hit_pages": 1,
            "tp_rank": 1,
        },
        {
            **base,
            "seq": 4,
            "ts": 4.0,
            "method": "batch_set_v1",
            "keys": ["c"],
            "pages": 1,
            "result": None,
            "error": "RuntimeError: boom",
        },
    ]
    path = tmp_path / "synthetic.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = json_data(show([path]))
    assert s["keys"]["pages"]["read_failed_after_write"] == 1
    assert s["keys"]["pages"]["lists"]["read_failed_after_write"] == ["b"]
    assert s["keys"]["verdict"].startswith("partly")
    assert s["failures"]["by_kind"] == {"read_failed": 1, "raised": 1}
    assert sorted(s["ranks"]) == ["tp0", "tp1"] and s["methods"]["batch_set_v1"]["errors"] == 1
    assert s["keys"]["objects"] is None  # no object notes in these lines


@pytest.mark.parametrize(
    "bad, why",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "not an object"),
        ('{"v": 1, "keys": []}', "no string field 'method'"),
        ('{"method": "batch_exists", "keys": "abc"}', "'keys' has the wrong type"),
    ],
)
def test_trace_show_malformed_line_is_exit_2_naming_the_line(runs, tmp_path, bad, why):
    with open(runs["path"]) as f:
        good = f.read()
    path = tmp_path / "corrupt.jsonl"
    path.write_text(good + bad + "\n")
    line = good.count("\n") + 1
    res = hicache(["trace", "show", str(path)])
    assert res.exit_code == 2
    assert f"line {line}" in res.stderr and why in res.stderr and "Traceback" not in res.output
    res = hicache(["trace", "show", str(path), "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["code"] == "input_error"
    assert f"line {line}" in json.loads(res.stdout)["error"]["message"]


def test_trace_show_missing_file_is_exit_2(tmp_path):
    res = hicache(["trace", "show", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_percentile_interpolates():
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile(list(range(101)), 90) == 90.0


# --- hicache tap --------------------------------------------------------------------------------


def test_tap_flags_parse_with_sglangs_own_argument_parser(tmp_path):
    """The printed flags are accepted by SGLang's CLI and its extra-config parser keeps every key."""
    import argparse

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.server_args import ServerArgs

    user = {"master_server_address": "10.0.0.1:50051", "protocol": "rdma", "prefetch_threshold": 128,
            "module_path": "someone.else"}  # fmt: skip
    res = hicache(["tap", "--extra-config", json.dumps(user), "--path", str(tmp_path / "t.jsonl"),
                              "--tp-size", "2"])  # fmt: skip
    assert res.exit_code == 0, res.output
    command_line = res.stdout.splitlines()[1]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "dummy", *shlex.split(command_line)])
    assert args.enable_hierarchical_cache and args.hicache_storage_backend == "dynamic"
    extra, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(
        args.hicache_storage_backend_extra_config
    )
    assert threshold == 128
    assert extra["module_path"] == "hicache_ops.commands.tap" and extra["class_name"] == CLASS_NAME
    assert extra["backend_name"] == "hicache_tap" and extra["interface_v1"] == 1
    assert extra["tap_path"] == str(tmp_path / "t.jsonl") and extra["master_server_address"] == "10.0.0.1:50051"
    assert f"{tmp_path}/t.tp0.jsonl" in res.stdout and f"{tmp_path}/t.tp1.jsonl" in res.stdout
    assert "replaced from your extra-config: module_path" in res.stderr


def test_tap_json_fields_and_extra_config_file(tmp_path):
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"master_server_address": "h:1", "global_segment_size": "8gb"}))
    res = hicache(["tap", "--json", "--extra-config", f"@{cfg}", "--no-objects", "--path", "rel.jsonl"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["kept_keys"] == ["master_server_address", "global_segment_size"]
    assert plan["extra_config"]["tap_objects"] is False
    assert plan["recording"]["path"].endswith("/rel.jsonl") and plan["recording"]["path"].startswith("/")
    assert plan["flags"][:3] == ["--enable-hierarchical-cache", "--hicache-storage-backend", "dynamic"]
    assert plan["show"] == f"hicache trace show {plan['recording']['path']}"


@pytest.mark.parametrize(
    "value, message",
    [
        ("{bad", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"standalone_storage": true, "master_server_address": "h:1"}', "standalone_storage"),
        ("@/no/such/file.json", "does not exist"),
        ("@/no/such/config.yaml", "does not exist"),
        ("@config.ini", "SGLang reads .json, .toml, .yaml"),
    ],
)
def test_tap_bad_extra_config_is_exit_2(value, message):
    res = hicache(["tap", "--extra-config", value])
    assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.output


def test_the_tap_class_serves_every_recorded_method():
    """The method groups `trace show` reads are the methods the backend records."""
    import hicache_ops.commands.tap

    cls = hicache_ops.commands.tap.MooncakeTap
    assert cls.__module__ == "hicache_ops.commands.tap" and cls.__name__ == CLASS_NAME
    assert all(name in vars(cls) for name in STORAGE_METHODS + META_METHODS if name != "open")


def test_importing_the_tap_and_cli_stays_light():
    code = (
        "import sys, hicache_ops.commands.tap, hicache_ops.commands.tap.plan, hicache_ops.commands.trace.show, "
        "hicache_ops.cli.tap,"
        " hicache_ops.cli.trace.show\n"
        "heavy = [m for m in ('torch', 'sglang', 'mooncake') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_tap_human_output_wraps_its_notes_and_keeps_the_flags_whole(tmp_path):
    """A real process at 80 columns: the notes wrap to the terminal; the launch flags stay on one
    unwrapped line (they are pasted as they are)."""
    env = {**os.environ, "COLUMNS": "80"}
    run = subprocess.run(
        [sys.executable, "-m", "hicache_ops.cli", "tap", "--tp-size", "2", "--path", str(tmp_path / "t.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    flags = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hicache_ops.cli",
                "tap",
                "--tp-size",
                "2",
                "--path",
                str(tmp_path / "t.jsonl"),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).stdout
    )["command_line"]
    assert flags in run.stdout.splitlines()
    assert all(len(line) <= 80 for line in run.stderr.splitlines()), run.stderr
    assert "interface_v1 is required" in run.stderr
