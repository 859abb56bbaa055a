"""The hostname a store client advertises, taken the way SGLang takes it (docs/mooncake.md#advertised-hostname).

    advertised_hostname("0.5.23", bind_host="10.213.47.2")   # ("10.213.47.2", "--host")
    # with MOONCAKE_LOCAL_HOSTNAME=127.0.0.1 set:            # ("127.0.0.1", "env:MOONCAKE_LOCAL_HOSTNAME")

Peers read a client's objects by dialling the Transfer Engine endpoint the master lists for its
segment, built from this hostname: a loopback or wrong value makes the objects listed but
unreadable from every other host. Order:
  1. what SGLang's store config resolves (MOONCAKE_LOCAL_HOSTNAME, LOCAL_HOSTNAME, the config file
     named by SGLANG_HICACHE_MOONCAKE_CONFIG_PATH, per version: docs/mooncake.md#config-resolution);
  2. SGLANG_HOST_IP, then HOST_IP (what SGLang's shared Transfer Engine advertises);
  3. the address serve binds (--host), unless a wildcard; else 127.0.0.1.
Where SGLang itself would fall back to "localhost", serve takes steps 2-3 instead, so a lab host
advertises its own address unless a variable says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hicache_ops.mooncake.config import CONFIG_PATH_ENV, _load_file, _Resolver

_WILDCARDS = ("0.0.0.0", "::", "")


def advertised_hostname(version: str, bind_host: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(hostname, where it came from)."""
    env = os.environ if env is None else env
    mapping, label = None, "env"
    if CONFIG_PATH_ENV in env:
        mapping, label = _load_file(env[CONFIG_PATH_ENV]), f"file:{env[CONFIG_PATH_ENV]}"
    resolver = _Resolver(version, env)
    value = resolver.local_hostname(mapping, label)
    source = resolver.sources.get("local_hostname", "")
    if not source.startswith("env-default"):
        return value, source
    for name in ("SGLANG_HOST_IP", "HOST_IP"):
        if env.get(name):
            return env[name], f"env:{name}"
    if bind_host not in _WILDCARDS:
        return bind_host, "--host"
    return "127.0.0.1", "default"
