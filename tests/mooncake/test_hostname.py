"""The hostname serve advertises: SGLang 0.5.23's own MooncakeStoreConfig._resolve_local_hostname
where SGLang's resolution applies, then SGLANG_HOST_IP / HOST_IP, then the bound address."""

from __future__ import annotations

import json

import pytest

from hicache_ops.mooncake.config import CONFIG_PATH_ENV
from hicache_ops.mooncake.hostname import advertised_hostname

VARIABLES = ("MOONCAKE_LOCAL_HOSTNAME", "LOCAL_HOSTNAME", "SGLANG_HOST_IP", "HOST_IP", CONFIG_PATH_ENV)


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "variables, config",
    [
        ({"MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}, None),
        ({"MOONCAKE_LOCAL_HOSTNAME": "10.1.1.1", "LOCAL_HOSTNAME": "10.2.2.2"}, {"local_hostname": "10.3.3.3"}),
        ({"LOCAL_HOSTNAME": "10.2.2.2"}, {"local_hostname": "10.3.3.3"}),
        ({}, {"local_hostname": "10.3.3.3"}),
        ({"LOCAL_HOSTNAME": ""}, {"local_hostname": "10.3.3.3"}),
    ],
)
def test_sglang_resolution_wins_as_in_sglang(env, tmp_path, variables, config):
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStoreConfig

    for name, value in variables.items():
        env.setenv(name, value)
    if config is not None:
        path = tmp_path / "mooncake.json"
        path.write_text(json.dumps({"master_server_address": "10.0.0.1:50051", **config}))
        env.setenv(CONFIG_PATH_ENV, str(path))
    env.setenv("SGLANG_HOST_IP", "10.9.9.9")  # below SGLang's own resolution
    expected = MooncakeStoreConfig._resolve_local_hostname(config)
    hostname, source = advertised_hostname("0.5.23", "10.8.8.8")
    assert hostname == expected
    assert source.startswith(("env:", "file:"))


def test_without_sglang_settings_host_ip_then_bind_address(env):
    assert advertised_hostname("0.5.23", "10.8.8.8") == ("10.8.8.8", "--host")
    assert advertised_hostname("0.5.23", "0.0.0.0") == ("127.0.0.1", "default")
    env.setenv("HOST_IP", "10.7.7.7")
    assert advertised_hostname("0.5.23", "10.8.8.8") == ("10.7.7.7", "env:HOST_IP")
    env.setenv("SGLANG_HOST_IP", "10.9.9.9")
    assert advertised_hostname("0.5.23", "10.8.8.8") == ("10.9.9.9", "env:SGLANG_HOST_IP")


def test_0_5_14_takes_the_config_file_over_the_environment(env, tmp_path):
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps({"master_server_address": "10.0.0.1:50051", "local_hostname": "10.3.3.3"}))
    env.setenv(CONFIG_PATH_ENV, str(path))
    env.setenv("MOONCAKE_LOCAL_HOSTNAME", "10.1.1.1")
    assert advertised_hostname("0.5.14", "10.8.8.8") == ("10.3.3.3", f"file:{path}")
    assert advertised_hostname("0.5.23", "10.8.8.8") == ("10.1.1.1", "env:MOONCAKE_LOCAL_HOSTNAME")
