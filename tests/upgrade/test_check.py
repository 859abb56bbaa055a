"""`hicache upgrade check` against a real mooncake_master: objects under the old prefix are counted."""

from __future__ import annotations

import json

import pytest

from cli_runner import hicache
from hicache_ops.commands.upgrade import check_upgrade
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.sglang.page_keys import ObjectKeyScheme, page_keys

MODEL = "Qwen/Qwen3-0.6B"


def keys_for(version: str, tokens: list[int], model: str | None = MODEL) -> list[str]:
    scheme = ObjectKeyScheme(version=version, model_name=model)
    return scheme.all_object_keys(page_keys(tokens, 4, version))


@pytest.fixture
def filled_master(fresh_mooncake_master):
    """A master holding 0.5.16-named objects (no prefix) and 0.5.17-named ones (model prefix)."""
    client = StoreClient.connect(fresh_mooncake_master.rpc_address, segment_size=32 << 20)
    old = keys_for("0.5.16", list(range(24)))  # 6 pages x k/v
    new = keys_for("0.5.17", list(range(100, 108)))  # 2 pages x k/v
    try:
        for key in old + new:
            client.put(key, b"x" * 64)
        yield fresh_mooncake_master, old, new
    finally:
        client.close()


def run(*args):
    result = hicache(["upgrade", "check", *args, "--json"])
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


def test_model_prefix_upgrade_is_cold_and_counts_old_objects(filled_master):
    master, old, new = filled_master
    result, data = run("--from", "0.5.16", "--to", "0.5.17", "--model-name", MODEL, "--master", master.metrics_address)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert data["cold"] is True
    assert (data["old_prefix"], data["new_prefix"]) == ("", "Qwen-Qwen3-0.6B_")
    assert data["objects_under_old_prefix"] == len(old) == 12
    assert "12 objects will never be read again" in data["verdict"]
    prefix = next(c for c in data["changes"] if c["rule"] == "object key prefix")
    assert prefix["since"] == ["0.5.17"] and prefix["sglang_file"].endswith("mooncake_store.py")
    assert {c["rule"] for c in data["changes"]} == {"object key prefix", "device eviction for a KV allocation"}
    evict = next(c for c in data["changes"] if c["rule"] == "device eviction for a KV allocation")
    assert evict["since"] == ["0.5.17"] and "shortfall" in evict["to"], evict


def test_same_keys_stay_warm_and_policy_changes_are_listed(filled_master):
    master, old, new = filled_master
    result, data = run("--from", "0.5.17", "--to", "0.5.19", "--model-name", MODEL, "--master", master.metrics_address)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert data["cold"] is False and data["objects_under_old_prefix"] == len(new) == 4
    rules = {c["rule"]: c for c in data["changes"]}
    assert rules["timeout budget"]["since"] == ["0.5.19"]
    assert "no maximum" in rules["timeout budget"]["to"]
    assert rules["rate-limited prefetch retry"]["since"] == ["0.5.19"]
    assert rules["tree"]["to"].startswith("UnifiedRadixCache")
    assert "object key prefix" not in rules


def test_namespace_seed_makes_l3_cold_from_0_5_20():
    report = check_upgrade("0.5.19", "0.5.20").result().model_dump(mode="json")
    assert report["cold"] is False  # no extra key: no seed either side
    from hicache_ops.commands.upgrade import UpgradeDeployment

    report = check_upgrade("0.5.19", "0.5.20", UpgradeDeployment(extra_key="tenant")).result().model_dump(mode="json")
    assert report["cold"] is True
    seed = next(c for c in report["changes"] if c["rule"] == "namespace seed")
    assert seed["from"] is None and seed["to"] and seed["since"] == ["0.5.20"]


def test_newer_release_warns_and_older_is_refused():
    result, data = run("--from", "0.5.22", "--to", "0.5.30")
    assert result.exit_code == 0
    assert data["to"]["version"] == "0.5.23"
    assert any("0.5.30 is newer than 0.5.23" in n for n in data["notes"])
    result, data = run("--from", "0.5.13", "--to", "0.5.23")
    assert result.exit_code == 2 and "older than 0.5.14" in data["error"]["message"]


def test_unreachable_master_is_exit_3():
    result, data = run("--from", "0.5.16", "--to", "0.5.17", "--master", "127.0.0.1:1", "--timeout", "1")
    assert result.exit_code == 3, result.stdout
