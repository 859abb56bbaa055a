"""Store config resolution against SGLang 0.5.23's own MooncakeStoreConfig, and the 0.5.14 rules."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from hicache_ops.errors import InputError
from hicache_ops.mooncake.config import (
    CONFIG_PATH_ENV,
    check_client_safe,
    check_metadata_server,
    parse_segment_size,
    resolve_store_config,
)
from hicache_ops.results import json_data

GIB = 1024**3
FIELDS = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "protocol",
    "device_name",
    "master_server_address",
    "master_metrics_port",
    "check_server",
    "standalone_storage",
    "client_server_address",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
)
MOONCAKE_ENV = (
    "MOONCAKE_MASTER",
    "MOONCAKE_CLIENT",
    "MOONCAKE_LOCAL_HOSTNAME",
    "LOCAL_HOSTNAME",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_DEVICE",
    "MOONCAKE_MASTER_METRICS_PORT",
    "MOONCAKE_CHECK_SERVER",
    "MOONCAKE_STANDALONE_STORAGE",
    "MOONCAKE_ENABLE_SSD_OFFLOAD",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_TENANT_ID",
    CONFIG_PATH_ENV,
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in MOONCAKE_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def sglang_config(extra_config):
    """SGLang 0.5.23's own resolution (reads os.environ like a real rank)."""
    import warnings

    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeBaseStore

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MooncakeBaseStore()._load_config(SimpleNamespace(extra_config=extra_config))


def write_json(tmp_path, data, name="mooncake.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


SCENARIOS = {
    "env-defaults": ({"MOONCAKE_MASTER": "10.0.0.1:50051"}, None, None),
    "env-everything": (
        {
            "MOONCAKE_MASTER": "10.0.0.1:50051",
            "MOONCAKE_PROTOCOL": "tcp",
            "MOONCAKE_DEVICE": "mlx5_0,mlx5_1",
            "MOONCAKE_GLOBAL_SEGMENT_SIZE": "8GB",
            "MOONCAKE_TE_META_DATA_SERVER": "http://10.0.0.1:8080/metadata",
            "MOONCAKE_LOCAL_HOSTNAME": "node1",
            "LOCAL_HOSTNAME": "ignored",
            "MOONCAKE_MASTER_METRICS_PORT": "9100",
            "MOONCAKE_CHECK_SERVER": "yes",
            "MOONCAKE_ENABLE_SSD_OFFLOAD": "1",
            "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": "/ssd",
            "MOONCAKE_TENANT_ID": "  team-a ",
        },
        None,
        None,
    ),
    "env-legacy-hostname": ({"MOONCAKE_CLIENT": "10.0.0.2:50052", "LOCAL_HOSTNAME": "legacy"}, None, None),
    "env-invalid-bool-and-int": (
        {"MOONCAKE_MASTER": "h:1", "MOONCAKE_CHECK_SERVER": "maybe", "MOONCAKE_MASTER_METRICS_PORT": "x"},
        None,
        None,
    ),
    "env-plain-bytes": ({"MOONCAKE_MASTER": "h:1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": " 123456 "}, None, None),
    "file": (
        {"MOONCAKE_PROTOCOL": "efa", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "16gb", "MOONCAKE_DEVICE": "ignored"},
        {
            "master_server_address": "10.0.0.3:50051",
            "global_segment_size": "2gb",
            "device_name": '{"0": "mlx5_0", "1": "mlx5_1"}',
            "local_hostname": "from-file",
            "tenant_id": "",
        },
        None,
    ),
    "file-env-hostname-wins": (
        {"MOONCAKE_LOCAL_HOSTNAME": "from-env"},
        {
            "master_server_address": "10.0.0.3:50051",
            "local_hostname": "from-file",
            "protocol": "tcp",
            "global_segment_size": 1073741824,
        },
        None,
    ),
    "extra-config-wins-over-file-and-env": (
        {"MOONCAKE_MASTER": "env:1", "MOONCAKE_TE_META_DATA_SERVER": "http://x/metadata"},
        {"master_server_address": "file:1"},
        {
            "master_server_address": "extra:1",
            "protocol": "tcp",
            "global_segment_size": "1gb",
            "extra_backend_tag": "tagA",
            "tenant_id": None,
        },
    ),
    "extra-config-without-address-falls-through": (
        {"MOONCAKE_MASTER": "env:1"},
        None,
        {"extra_backend_tag": "tagB", "master_server_address": None},
    ),
    "extra-config-client-address": (
        {"LOCAL_HOSTNAME": "legacy"},
        None,
        {"client_server_address": "10.0.0.9:50052", "local_hostname": "from-extra"},
    ),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_matches_sglang_0_5_23(name, clean_env, tmp_path):
    env, file_data, extra = SCENARIOS[name]
    for key, value in env.items():
        clean_env.setenv(key, value)
    if file_data is not None:
        clean_env.setenv(CONFIG_PATH_ENV, write_json(tmp_path, file_data))
    theirs = sglang_config(extra)
    ours = resolve_store_config("0.5.23", extra_config=extra, env=dict(os.environ))
    for field in FIELDS:
        assert getattr(ours, field) == getattr(theirs, field), field


def test_sources_and_origin(clean_env, tmp_path):
    env = {"MOONCAKE_PROTOCOL": "tcp", CONFIG_PATH_ENV: write_json(tmp_path, {"master_server_address": "h:1"})}
    cfg = resolve_store_config("0.5.23", env=env)
    assert cfg.origin == "file" and cfg.config_path == env[CONFIG_PATH_ENV]
    assert cfg.sources["master_server_address"] == f"file:{env[CONFIG_PATH_ENV]}"
    assert cfg.sources["protocol"] == "env:MOONCAKE_PROTOCOL"  # 0.5.23 honours it when the file omits it
    assert cfg.sources["global_segment_size"] == "env-default:MOONCAKE_GLOBAL_SEGMENT_SIZE"
    assert cfg.global_segment_size == 4 * GIB
    cfg = resolve_store_config(
        "0.5.23", extra_config={"master_server_address": "x:1", "extra_backend_tag": "t"}, env={}
    )
    assert cfg.origin == "extra_config" and cfg.sources["master_server_address"] == "extra_config"
    assert cfg.extra_backend_tag == "t" and cfg.sources["extra_backend_tag"] == "extra_config"
    cfg = resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "m:1", "MOONCAKE_CHECK_SERVER": "maybe"})
    assert cfg.origin == "env" and cfg.sources["check_server"] == "env-invalid:MOONCAKE_CHECK_SERVER"
    assert cfg.check_server is False and "MOONCAKE_CHECK_SERVER" in cfg.warnings[0]
    assert cfg.master_metrics_address == "m:9003"
    data = json_data(cfg)  # the dataclass, rendered by the one JSON function
    assert json.loads(json.dumps(data))["sources"]["check_server"] == "env-invalid:MOONCAKE_CHECK_SERVER"


def test_0_5_14_rules(tmp_path):
    path = write_json(tmp_path, {"master_server_address": "h:1", "local_hostname": "from-file"})
    env = {CONFIG_PATH_ENV: path, "MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_LOCAL_HOSTNAME": "from-env"}
    old = resolve_store_config("0.5.14", env=env)
    new = resolve_store_config("0.5.23", env=env)
    # 0.5.14 takes the env *default* for a protocol the file omits, and the file's hostname.
    assert (old.protocol, old.local_hostname) == ("rdma", "from-file")
    assert (new.protocol, new.local_hostname) == ("tcp", "from-env")
    assert old.tenant_id is None and new.tenant_id == "default"
    # 0.5.14 keeps a None tag when the key is present; 0.5.23 skips it.
    assert (
        resolve_store_config(
            "0.5.14", extra_config={"master_server_address": "h:1", "extra_backend_tag": 7}, env={}
        ).extra_backend_tag
        == 7
    )
    assert (
        resolve_store_config(
            "0.5.23", extra_config={"master_server_address": "h:1", "extra_backend_tag": 7}, env={}
        ).extra_backend_tag
        == "7"
    )


def test_segment_size_per_rank():
    cfg14 = resolve_store_config("0.5.14", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "8gb"})
    cfg23 = resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "8gb"})
    assert cfg14.segment_size_per_rank(tp_size=2, pp_size=2) == 4 * GIB
    assert cfg23.segment_size_per_rank(tp_size=2, pp_size=2) == 2 * GIB
    assert cfg23.segment_size_per_rank() == 8 * GIB


def test_device_map():
    cfg = resolve_store_config(
        "0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_DEVICE": ' {"0": "mlx5_0", "1": "mlx5_1"}'}
    )
    assert [cfg.device_for_rank(r) for r in (0, 1, 2)] == ["mlx5_0", "mlx5_1", ""]
    assert cfg.device_for_rank(None) == ""
    plain = resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_DEVICE": "mlx5_0,mlx5_1"})
    assert plain.device_for_rank(3) == "mlx5_0,mlx5_1"
    broken = resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_DEVICE": "{not json"})
    assert broken.device_for_rank(0) == ""


@pytest.mark.parametrize(
    "value,expected",
    [(4 * GIB, 4 * GIB), ("4gb", 4 * GIB), (" 2GB ", 2 * GIB), ("1024", 1024), ("16 gb", 16 * GIB)],
)
def test_parse_segment_size(value, expected):
    assert parse_segment_size(value) == expected


@pytest.mark.parametrize("value", ["4mb", "1.5gb", "gb", "", "lots"])
def test_parse_segment_size_rejects(value):
    with pytest.raises(InputError, match="global_segment_size"):
        parse_segment_size(value)


def test_resolution_errors(tmp_path):
    with pytest.raises(InputError, match="MOONCAKE_MASTER"):
        resolve_store_config("0.5.23", env={})
    with pytest.raises(InputError, match="does not exist"):
        resolve_store_config("0.5.23", env={CONFIG_PATH_ENV: str(tmp_path / "missing.json")})
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(InputError, match="not valid JSON"):
        resolve_store_config("0.5.23", env={CONFIG_PATH_ENV: str(bad)})
    with pytest.raises(InputError, match="neither master_server_address"):
        resolve_store_config("0.5.23", env={CONFIG_PATH_ENV: write_json(tmp_path, {"protocol": "tcp"})})
    with pytest.raises(InputError, match="MOONCAKE_GLOBAL_SEGMENT_SIZE"):
        resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_GLOBAL_SEGMENT_SIZE": "4mb"})
    with pytest.raises(InputError, match="older than 0.5.14"):
        resolve_store_config("0.5.13", env={"MOONCAKE_MASTER": "h:1"})
    # a release newer than the newest known one gets its rules (docs/releases.md)
    assert resolve_store_config("0.6.0", env={"MOONCAKE_MASTER": "h:1"}).sglang_version == "0.5.23"


@pytest.mark.parametrize(
    "good", ["P2PHANDSHAKE", "http://127.0.0.1:8080/metadata", "https://meta.example:443/metadata"]
)
def test_metadata_accepted(good):
    assert check_metadata_server(good) == good


@pytest.mark.parametrize(
    "bad,words",
    [
        ("redis://127.0.0.1:6379", "aborts the whole process"),
        ("etcd://127.0.0.1:2379", "etcd"),
        ("127.0.0.1:2379", "etcd"),
        ("p2phandshake", "misspelt"),
        ("", "empty"),
        ("http://", "no host"),
    ],
)
def test_metadata_refused(bad, words):
    with pytest.raises(InputError, match=words):
        check_metadata_server(bad)


def test_check_client_safe():
    cfg = resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "h:1", "MOONCAKE_TE_META_DATA_SERVER": "redis://r:1"})
    with pytest.raises(InputError, match="Redis"):
        check_client_safe(cfg)
    standalone = resolve_store_config("0.5.23", env={"MOONCAKE_CLIENT": "h:1"})
    with pytest.raises(InputError, match="master_server_address"):
        check_client_safe(standalone)
    # A master address Mooncake could not dial is refused when the config is read, naming its source.
    for bad in ("h:notaport", "host", ":50051"):
        with pytest.raises(InputError, match=f"MOONCAKE_MASTER '{bad}'"):
            resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": bad})
    with pytest.raises(InputError, match="master_server_address 'host'"):
        resolve_store_config("0.5.23", extra_config={"master_server_address": "host"}, env={})
    check_client_safe(resolve_store_config("0.5.23", env={"MOONCAKE_MASTER": "127.0.0.1:50051"}))
