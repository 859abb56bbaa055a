"""`hicache inspect store` and the admin HTTP client against a real master; faults end in exit 3."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from cli_runner import hicache
from hicache_ops.commands.inspect.store_listing import ObjectKeyParts, group_keys, inspect_store, parse_object_key
from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.master import EmbeddedMaster
from hicache_ops.mooncake.net import parse_host_port
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.results import json_data
from hicache_ops.sglang.page_keys import ObjectKeyScheme, page_keys

HANG_BOUND_S = 5.0
PK = page_keys(list(range(64)), 16, "0.5.23")  # four page keys


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_connected(pid: int, address: str, timeout: float = 60.0) -> None:
    """Until process `pid` holds an established TCP connection to `address` (its request is sent)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = subprocess.run(
            ["ss", "-tnpH", "state", "established", "dst", address], capture_output=True, text=True
        ).stdout
        if f"pid={pid}," in listing:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never connected to {address} within {timeout} s")


def invoke(*args: str):
    return hicache(list(args))


@pytest.fixture
def filled_master():
    """A master of its own with a segment owner and a known set of SGLang-shaped keys."""
    master = EmbeddedMaster().start()
    owner = StoreClient.connect(master.rpc_address, segment_size=32 << 20)
    mha = ObjectKeyScheme("0.5.23", model_name="Qwen/Qwen3-0.6B", tp_rank=0, tp_size=2)
    mha1 = ObjectKeyScheme("0.5.23", model_name="Qwen/Qwen3-0.6B", tp_rank=1, tp_size=2)
    mla = ObjectKeyScheme("0.5.23", model_name="deepseek-ai/DeepSeek-V3", extra_backend_tag="t1", mla=True)
    keys = []
    for i, pk in enumerate(PK):
        keys += mha.object_keys(pk)
        if i == 1:
            keys.append(mha1.object_keys(pk)[0])  # rank 1 wrote only the K of page 1
        else:
            keys += mha1.object_keys(pk)
        keys += mla.object_keys(pk)
    keys += ["sglang_mooncake_store_warmup_key" + "0" * 32, "sglang_mooncake_store_warmup_key" + "1" * 32, "not-sglang"]
    for key in keys:
        owner.put(key, b"x")
    try:
        yield master, keys
    finally:
        owner.close()
        master.stop()


# `inspect store --json` without --sglang-url: the fields it printed before StoreResult, in order; the
# four --sglang-url fields (pool_source, l3_layout, l3_layout_note, server_pools) absent, even null.
STORE_FIELDS = [
    "master", "ready", "health", "segments", "segment_problems", "capacity_bytes", "used_bytes", "used_fraction",
    "key_count", "metrics", "limit", "prefix_filter", "matched_keys", "warmup_keys", "unified_scheme_keys",
    "namespace_marker_keys", "namespaces", "other_keys", "groups", "group_count", "other_key_samples", "truncated",
]  # fmt: skip


def test_store_json_fields_without_sglang_url(mooncake_master):
    result = invoke("inspect", "store", "--master", mooncake_master.metrics_address, "--json")
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)) == STORE_FIELDS


def test_parse_object_key():
    pk = PK[0]
    assert parse_object_key(f"Qwen-Qwen3-0.6B_{pk}_0_k") == ObjectKeyParts("Qwen-Qwen3-0.6B_", pk, "0", "k")
    assert parse_object_key(f"{pk}__k") == ObjectKeyParts("", pk, "", "k")
    parts = parse_object_key(f"t_m_{pk}_1_2_v")
    assert (parts.prefix, parts.rank, parts.kv, parts.suffix) == ("t_m_", "1_2", "v", "_1_2_v")
    assert parse_object_key(f"{pk}_dcp0_cp1_k").rank == "dcp0_cp1"
    assert parse_object_key("sglang_mooncake_store_warmup_key" + "a" * 32) is None
    assert parse_object_key(f"x{pk}_0_k") is None  # a prefix always ends with "_"
    assert parse_object_key(f"{pk}_0_x") is None


def test_admin_formats(filled_master):
    master, keys = filled_master
    with AdminClient(master.metrics_address) as admin:
        health = admin.health()
        assert health["status"] == "ok" and health["service_ready"] is True
        assert sorted(admin.get_all_keys()) == sorted(keys)
        segments = admin.segments_detail()
        assert len(segments) == 1 and segments[0]["size_bytes"] == 32 << 20
        assert segments[0]["allocator_used_bytes"] == len(keys)
        assert admin.get_all_segments() == [segments[0]["segment_name"]]
        assert admin.query_key(keys[0])[0]["size_"] == 1
        assert admin.query_key("missing") is None
        answer = admin.batch_query_keys([keys[0], "missing"])
        assert answer[keys[0]]["ok"] is True and answer["missing"]["ok"] is False
        assert admin.exists([keys[0], "missing", keys[-1]], chunk=2) == [True, False, True]
        metrics = admin.metrics()
        assert metrics["master_key_count"] == len(keys)
        assert metrics["master_total_capacity_bytes"] == 32 << 20


def test_admin_exists_with_awkward_keys(mooncake_master, mooncake_segment_owner):
    odd = ["t-odd_a b/c%d", "t-odd_x+y&z=1", "t-odd_k,comma", "t-odd_ü", "t-odd_p.q*r", "t-odd_c,o m+a"]
    with StoreClient.connect(mooncake_master.rpc_address) as c:
        for key in odd:
            c.put(key, b"v")
        with AdminClient(mooncake_master.metrics_address) as admin:
            assert admin.exists(odd + ["t-odd_missing", "t-odd_missing,2"]) == [True] * len(odd) + [False, False]
        c.remove_prefix("t-odd_", force=True)


def test_group_keys(filled_master):
    master, keys = filled_master
    data = group_keys(keys, limit=10)
    assert (data["warmup_keys"], data["other_keys"], data["group_count"]) == (2, 1, 2)
    mha, mla = data["groups"]  # most objects first
    assert mha["prefix"] == "Qwen-Qwen3-0.6B_" and mha["kind"] == "mha"
    assert mha["pages"] == 4 and mha["objects"] == 4 * 4 - 1
    assert mha["suffixes"] == {"_0_k": 4, "_0_v": 4, "_1_k": 4, "_1_v": 3}
    assert (mha["complete_pages"], mha["incomplete_pages"], mha["kv_incomplete_pages"]) == (3, 1, 1)
    assert mha["incomplete"] == [{"page_key": PK[1], "present": ["_0_k", "_0_v", "_1_k"], "missing": ["_1_v"]}]
    assert mla["prefix"] == "t1_deepseek-ai-DeepSeek-V3_" and mla["kind"] == "mla"
    assert mla["suffixes"] == {"__k": 4} and mla["complete_pages"] == 4
    limited = group_keys(keys, limit=1)
    assert len(limited["groups"]) == 1 and limited["truncated"] and len(limited["groups"][0]["page_keys"]) == 1
    assert (data["namespace_marker_keys"], data["namespaces"]) == (0, [])
    only = group_keys(keys, prefix_filter="t1_")
    assert (
        only["matched_keys"] == 4
        and only["warmup_keys"] == 0
        and [g["prefix"] for g in only["groups"]] == ["t1_deepseek-ai-DeepSeek-V3_"]
    )


def test_dcp_groups_expect_every_shard(mooncake_master, mooncake_segment_owner):
    """A DCP prefix names its topology: a shard that never wrote makes every page incomplete."""
    tag = f"dcp{time.monotonic_ns()}"
    shards = [
        ObjectKeyScheme("0.5.23", extra_backend_tag=tag, mla=True, tp_size=8, tp_rank=r, dcp_size=4, page_size=16)
        for r in range(4)
    ]
    keys = [k for pk in PK for s in shards[:3] for k in s.object_keys(pk)]  # shard 3 wrote nothing
    unified = f"{tag}_{PK[0]}_ukv1-0123456789abcdef_L0-3_H1"
    for key in [*keys, unified]:
        mooncake_segment_owner.put(key, b"x")
    data = json_data(inspect_store(mooncake_master.metrics_address, prefix=f"{tag}_", limit=10))
    (group,) = data["groups"]
    assert group["prefix"] == f"{tag}_tp8_dcp4_page16_pp1_cp1_" and group["kind"] == "mla"
    assert group["dcp"] == {"tp_size": 8, "dcp_size": 4, "page_size": 16, "pp_size": 1, "attn_cp_size": 1}
    assert group["suffixes"] == {"_dcp0_cp0_k": 4, "_dcp1_cp0_k": 4, "_dcp2_cp0_k": 4}
    assert group["complete_pages"] == 0 and all(row["missing"] == ["_dcp3_cp0_k"] for row in group["incomplete"])
    assert (data["unified_scheme_keys"], data["other_keys"]) == (1, 0)
    result = invoke("inspect", "store", "--master", mooncake_master.metrics_address, "--prefix", f"{tag}_")
    assert result.exit_code == 0 and "DCP 4 of tp 8" in result.stdout and "unified key scheme" in result.stderr


def test_namespace_markers_are_named_apart_from_other_keys():
    from hicache_ops.server.namespaces import MARKER_PREFIX, marker_key

    keys = [marker_key("tenant-b", None), marker_key(None, "salt"), MARKER_PREFIX + "zz", "not-sglang"]
    data = group_keys(keys)
    assert (data["namespace_marker_keys"], data["other_keys"], data["group_count"]) == (2, 2, 0)
    assert data["namespaces"] == [
        {"extra_key": None, "cache_salt": "salt"},
        {"extra_key": "tenant-b", "cache_salt": None},
    ]
    assert data["other_key_samples"] == [MARKER_PREFIX + "zz", "not-sglang"]  # a malformed marker is "other"
    assert group_keys(keys, limit=1)["truncated"] and len(group_keys(keys, limit=1)["namespaces"]) == 1


def test_inspect_store_library(filled_master):
    master, keys = filled_master
    data = json_data(inspect_store(master.metrics_address, limit=5))
    assert data["ready"] and data["master"] == master.metrics_address
    assert data["key_count"] == len(keys) and data["metrics"]["master_key_count"] == len(keys)
    assert data["capacity_bytes"] == 32 << 20 and data["used_bytes"] == len(keys)
    assert data["segments"][0]["status"] == "OK" and data["segments"][0]["protocol"] == "tcp"
    assert data["warmup_keys"] == 2
    json.dumps(data)


def test_inspect_store_cli(filled_master):
    master, keys = filled_master
    result = invoke("inspect", "store", "--master", master.metrics_address, "--json", "--prefix", "Qwen-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prefix_filter"] == "Qwen-" and data["matched_keys"] == 15 and data["key_count"] == len(keys)
    assert [g["prefix"] for g in data["groups"]] == ["Qwen-Qwen3-0.6B_"]
    human = invoke("inspect", "store", "--master", master.metrics_address)
    assert human.exit_code == 0
    for text in ("ready", "Qwen-Qwen3-0.6B_", "t1_deepseek-ai-DeepSeek-V3_", "warm-up 2", "missing _1_v", "not-sglang"):
        assert text in human.stdout


def test_inspect_store_default_address_from_env(filled_master, monkeypatch):
    master, _ = filled_master
    host, port = parse_host_port(master.metrics_address)
    monkeypatch.setenv("MOONCAKE_MASTER", f"{host}:50051")
    monkeypatch.setenv("MOONCAKE_MASTER_METRICS_PORT", str(port))
    result = invoke("inspect", "store", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["master"] == master.metrics_address


# -- faults and bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nohost", "127.0.0.1:port", "127.0.0.1:0", ":9003", "127.0.0.1:9003/x", "[::1"])
def test_malformed_master_is_exit_2(bad):
    result = invoke("inspect", "store", "--master", bad, "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["code"] == "input_error"
    with pytest.raises(InputError):
        AdminClient(bad)


def test_unreachable_master_is_exit_3_fast():
    port = closed_port()
    start = time.monotonic()
    result = invoke("inspect", "store", "--master", f"127.0.0.1:{port}")
    assert time.monotonic() - start < HANG_BOUND_S
    assert result.exit_code == 3
    assert f"127.0.0.1:{port}" in result.stderr and "connection refused" in result.stderr
    assert "Traceback" not in result.output


def test_silent_master_is_exit_3_within_5s(fresh_mooncake_master, freeze_process):
    freeze_process(fresh_mooncake_master.pid)
    start = time.monotonic()
    result = invoke("inspect", "store", "--master", fresh_mooncake_master.metrics_address, "--json")
    assert time.monotonic() - start < HANG_BOUND_S
    assert result.exit_code == 3
    error = json.loads(result.stdout)["error"]
    assert fresh_mooncake_master.metrics_address in error["message"] and "no answer" in error["message"]
    with pytest.raises(UnreachableError):
        AdminClient(fresh_mooncake_master.metrics_address, timeout=0.5).get_all_keys()


def test_master_killed_during_a_command_is_exit_3(freeze_process):
    """The command is waiting on the master when it dies: a clear exit 3, no hang, no traceback."""
    master = EmbeddedMaster().start()
    try:
        freeze_process(master.pid)  # the command's request sits unanswered ...
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hicache_ops.cli",
                "inspect",
                "store",
                "--master",
                master.metrics_address,
                "--timeout",
                "30",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The bound counts from the master's death, so the command must be waiting on it by then
        # (a fixed sleep let a slow interpreter start under load count against the bound).
        wait_connected(proc.pid, master.metrics_address)
        killed_at = time.monotonic()
        master.kill()  # ... until the master dies under it
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - killed_at < HANG_BOUND_S
        assert proc.returncode == 3, err
        assert master.metrics_address in err and "Traceback" not in err
    finally:
        master.stop()


def test_admin_client_after_master_death(fresh_mooncake_master):
    admin = AdminClient(fresh_mooncake_master.metrics_address)
    assert admin.health()["status"] == "ok"
    fresh_mooncake_master.kill()
    with pytest.raises(UnreachableError) as info:
        admin.get_all_keys()
    assert fresh_mooncake_master.metrics_address in info.value.message and info.value.exit_code == 3


def test_help_imports_neither_mooncake_nor_torch():
    code = (
        "import sys; from hicache_ops.cli.main import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['inspect', 'store', '--help']); assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(app, ['bench', 'store', '--help']); assert r.exit_code == 0, r.output\n"
        "bad = [m for m in ('mooncake', 'mooncake.store', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
