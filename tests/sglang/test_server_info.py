"""`--sglang-url`: reading a running SGLang server's resolved arguments (docs/server-info.md).

The info bodies are built by SGLang's own `ServerArgs` for each version and serialised the way
that version's `http_server.py` does: 0.5.14 `dataclasses.asdict(server_args)` plus the scheduler's
start-up info, `internal_states`, `version` and `kv_events`; 0.5.23 `build_server_info` (the
resolved dict and `launch_command`) plus `startup_time`, `internal_states`, `version`, `frontend`.
Both then go through FastAPI's encoder, as a route's returned dict does. A real HTTP server on
loopback serves them.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time

import pytest

from cli_runner import hicache
from hicache_ops.errors import InputError
from hicache_ops.mooncake.net import free_port
from hicache_ops.sglang.server_info import interpret, resolve_from_server
from sglang_0_5_14 import run_0_5_14
from sglang_server import HttpServer, body_0_5_23, json_route, write_tiny_model

# A deployment whose key prefix, split heads and host layout all come from the server.
LAUNCH = [
    "--page-size", "32", "--tp-size", "2", "--served-model-name", "org/m",
    "--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake",
    "--hicache-mem-layout", "page_head", "--hicache-write-policy", "write_back", "--hicache-ratio", "3",
    "--hicache-storage-backend-extra-config", '{"extra_backend_tag": "blue", "tp_lcm_size": 4, '
                                              '"master_server_address": "127.0.0.1:50051"}',
]  # fmt: skip
SCHEDULER_INFO = {"status": "ready", "max_total_num_tokens": 20000, "max_req_input_len": 4096}
TOKENS = ",".join(str(i) for i in range(100))

BODY_0_5_14 = """
import dataclasses
from fastapi.encoders import jsonable_encoder
from sglang.srt.server_args import prepare_server_args
from sglang.version import __version__

server_args = prepare_server_args(PAYLOAD["argv"])
RESULT = jsonable_encoder({
    **dataclasses.asdict(server_args),
    **PAYLOAD["scheduler_info"],
    "internal_states": [{}],
    "version": __version__,
    "kv_events": server_args.describe_kv_events_publisher(),
})
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def bodies(model_dir):
    """Each version's server-info body for LAUNCH, built by that version's own code."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = ["--model-path", model_dir, "--device", "cpu", *LAUNCH]
    return {
        "0.5.14": run_0_5_14(BODY_0_5_14, {"argv": argv, "scheduler_info": SCHEDULER_INFO}),
        "0.5.23": body_0_5_23(argv, SCHEDULER_INFO),
    }


@pytest.fixture
def serve_body():
    """serve_body(body) -> URL of a loopback HTTP server answering both info routes with it."""
    servers = []

    def start(body, routes=("/server_info", "/get_server_info")):
        server = HttpServer({route: json_route(body) for route in routes})
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def run_json(args: list[str]):
    result = hicache([*args, "--json"])
    return result, (json.loads(result.stdout) if result.stdout.strip() else None)


# --- what the library reads ---------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_interpret_reads_the_deployment(bodies, version):
    info = interpret(bodies[version], "http://127.0.0.1:1", "/server_info")
    assert (info.version, info.sglang_version) == (version, version)
    assert info.page_size == 32 and info.model_name == "org/m"
    assert (info.tp_size, info.storage_tp_size, info.pp_size, info.dcp_size) == (2, 2, 1, 1)
    assert info.hierarchical_cache and info.storage_backend == "mooncake"
    assert (info.mem_layout, info.write_policy, info.hicache_ratio) == ("page_head", "write_back", 3.0)
    assert info.extra_config == {
        "extra_backend_tag": "blue",
        "tp_lcm_size": 4,
        "master_server_address": "127.0.0.1:50051",
    }
    assert info.max_total_num_tokens == 20000
    deployment = info.deployment()
    assert deployment.version == version and deployment.layout == "page_head"
    scheme = deployment.schemes()[0]
    assert scheme.split_heads  # page_head with tp_lcm_size 4 over tp 2
    assert scheme.prefix == ("blue_" if version == "0.5.14" else "blue_org-m_")


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_launch_flags_for_the_te_rule_parse_with_sglang_0_5_23(bodies, version, model_dir):
    """The flags handed to `te check` are accepted by SGLang's own parser and give the same values."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    info = interpret(bodies[version], "http://127.0.0.1:1", "/server_info")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", model_dir, *shlex.split(info.launch_flags)])
    assert args.tp_size == 2 and args.enable_hierarchical_cache and args.hicache_storage_backend == "mooncake"
    assert json.loads(args.hicache_storage_backend_extra_config)["tp_lcm_size"] == 4


def test_dp_attention_storage_tp():
    """With DP attention the store's tp is the attention-TP group (0.5.14 and 0.5.23 spellings)."""
    base = {"version": "0.5.14", "model_path": "m", "page_size": 16, "tp_size": 8, "dp_size": 4}
    assert interpret({**base, "enable_dp_attention": True}, "u", "/server_info").storage_tp_size == 2
    assert interpret({**base, "enable_dp_attention": False}, "u", "/server_info").storage_tp_size == 8
    newer = {**base, "version": "0.5.23", "attn_dp_size": 2, "attn_cp_size": 2, "enable_dp_attention": True}
    assert interpret(newer, "u", "/server_info").storage_tp_size == 2


def test_dcp_means_mla_and_a_topology_prefix(serve_body):
    body = {"version": "0.5.23", "model_path": "org/ds", "page_size": 64, "tp_size": 8, "dcp_size": 4,
            "enable_hierarchical_cache": True, "hicache_storage_backend": "mooncake"}  # fmt: skip
    info = interpret(body, "u", "/server_info")
    assert info.values()["dcp_size"] == 4 and info.mla  # SGLang refuses DCP without MLA
    assert info.values()["page_size"] == 256  # the tree pages at page_size * dcp_size
    assert interpret({**body, "dcp_size": 1}, "u", "/server_info").mla is None
    url = serve_body(body)
    res, data = run_json(["inspect", "keys", "--tokens", ",".join(map(str, range(256))), "--sglang-url", url])
    assert res.exit_code == 0, res.output
    assert data["key_prefix"] == "org-ds_tp8_dcp4_page256_pp1_cp1_" and len(data["pages"]) == 1
    assert [key.rsplit("_", 3)[1:] for key in data["pages"][0]["object_keys"]] == [
        [f"dcp{d}", "cp0", "k"] for d in range(4)
    ]


def test_extra_config_file_on_the_server_host_is_a_note():
    body = {"version": "0.5.23", "model_path": "m", "page_size": 16, "tp_size": 1,
            "hicache_storage_backend_extra_config": "@/etc/sglang/mooncake.json"}  # fmt: skip
    info = interpret(body, "u", "/server_info")
    assert info.extra_config is None and "extra_backend_tag" not in info.values()
    assert any("/etc/sglang/mooncake.json" in note for note in info.notes)


def test_extra_config_values_are_typed_and_hicache_off_is_noted():
    extra = json.dumps({"extra_backend_tag": 7, "tp_lcm_size": "4", "prefetch_threshold": 64})
    body = {"version": "0.5.14", "model_path": "m", "page_size": 16, "tp_size": 2,
            "hicache_storage_backend_extra_config": extra}  # fmt: skip
    info = interpret(body, "u", "/server_info")
    values = info.values()
    assert values["extra_backend_tag"] == "7" and "tp_lcm_size" not in values and values["prefetch_threshold"] == 64
    assert info.deployment().schemes()[0].prefix == "7_"
    assert any("without HiCache" in note for note in info.notes)


def test_given_flags_win_and_disagreements_are_listed(bodies, serve_body):
    url = serve_body(bodies["0.5.23"])
    resolution = resolve_from_server(url, {"page_size": 64, "tp_size": 2}, timeout=5)
    assert resolution.values["page_size"] == 64 and resolution.values["model_name"] == "org/m"
    assert resolution.disagreements == [{"field": "page_size", "flag": 64, "server": 32}]


def test_alias_route_is_used_when_server_info_is_missing(bodies, serve_body):
    url = serve_body(bodies["0.5.14"], routes=("/get_server_info",))
    assert resolve_from_server(url, {}, timeout=5).server.route == "/get_server_info"


# --- the commands --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_inspect_keys_from_the_server_matches_the_same_flags(bodies, serve_body, version):
    url = serve_body(bodies[version])
    res, from_server = run_json(["inspect", "keys", "--tokens", TOKENS, "--sglang-url", url])
    assert res.exit_code == 0, res.output
    res, from_flags = run_json([
        "inspect", "keys", "--tokens", TOKENS, "--sglang-version", version, "--page-size", "32",
        "--model-name", "org/m", "--extra-backend-tag", "blue", "--tp-size", "2", "--layout", "page_head",
        "--tp-lcm-size", "4"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert from_server["page_size"] == 32 and len(from_server["pages"]) == 3
    assert from_server["key_prefix"] == ("blue_" if version == "0.5.14" else "blue_org-m_")
    assert from_server["server_disagreements"] == []
    assert from_server["sglang_server"]["version"] == version
    assert from_server["pages"] == from_flags["pages"]


def test_inspect_keys_shows_a_disagreement(bodies, serve_body):
    url = serve_body(bodies["0.5.23"])
    res, data = run_json(["inspect", "keys", "--tokens", TOKENS, "--page-size", "64", "--sglang-url", url])
    assert res.exit_code == 0, res.output
    assert data["page_size"] == 64 and len(data["pages"]) == 1
    assert data["server_disagreements"] == [{"field": "page_size", "flag": 64, "server": 32}]
    human = hicache(["inspect", "keys", "--tokens", TOKENS, "--page-size", "64", "--sglang-url", url])
    assert human.exit_code == 0
    assert "warning: --page-size 64 disagrees with the SGLang server (32); using the flag." in human.stderr
    assert "page size 64" in human.stdout


def test_inspect_layout_from_the_server(bodies, serve_body):
    url = serve_body(bodies["0.5.14"])
    res, data = run_json(["inspect", "layout", "--preset", "qwen3-0.6b", "--sglang-url", url])
    assert res.exit_code == 0, res.output
    assert data["server_disagreements"] == []
    assert data["layout"] == "page_head" and data["page_size"] == 32 and data["mooncake"]
    assert (data["tp_size"], data["tp_lcm_size"], data["split_factor"]) == (2, 4, 2)
    assert data["device_tokens"] == 20000 and data["hicache_ratio"] == 3.0


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_te_check_from_the_server_matches_the_launch_flags(bodies, serve_body, version):
    url = serve_body(bodies[version])
    res, from_server = run_json(["te", "check", "--sglang-url", url])
    assert res.exit_code in (0, 1), res.output
    flags = shlex.join(LAUNCH)
    res2, from_flags = run_json(["te", "check", "--sglang-version", version, "--server-args", flags])
    assert res2.exit_code == res.exit_code, res2.output
    assert from_server["sglang_version"] == version
    assert from_server["conditions"] == from_flags["conditions"] and from_server["ranks"] == from_flags["ranks"]


def test_trace_read_reproduces_the_server_and_a_given_policy_wins(bodies, serve_body):
    url = serve_body(bodies["0.5.23"])
    tokens = ",".join(str(i) for i in range(300))
    res = hicache(["trace", "read", "--tokens", tokens, "--sglang-url", url, "--hicache-write-policy", "write_through",
                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    steps = [json.loads(line) for line in res.stdout.splitlines()]
    reader = steps[0]["detail"]["reader"]
    assert (reader["sglang_version"], reader["tp_size"], reader["model_name"]) == ("0.5.23", 2, "org/m")
    assert (reader["layout"], reader["stop_policy"], reader["write_policy"]) == (
        "page_head",
        "timeout",
        "write_through",
    )
    assert steps[-1]["status"] == "PASS" and steps[-1]["detail"]["storage_hit"] == 288  # nine pages of 32
    assert "--hicache-write-policy write_through disagrees with the SGLang server (write_back)" in res.stderr
    assert steps[0]["server_disagreements"] == [
        {"field": "write_policy", "flag": "write_through", "server": "write_back"}
    ]
    assert all("server_disagreements" not in s for s in steps[1:])


def test_playbook_run_takes_the_launch_flags_from_the_server(bodies, serve_body):
    url = serve_body(bodies["0.5.23"])
    res, data = run_json(["playbook", "run", "te-not-reused", "--sglang-url", url])
    assert res.exit_code == 1, res.output  # no device names in this deployment: not reused
    first = data["checks"][0]
    assert first["status"] == "finding" and "--tp-size 2" in first["command"]
    assert "tp_lcm_size" in first["command"] and data["server_disagreements"] == []


def l3_layout(key_prefix: str) -> dict:
    """A 0.5.23 /get_hicache_l3_cache_layout reply for an MLA pool (docs/side-pools.md#l3-layout-endpoint)."""
    pools = [{"pool": "kv", "suffixes": ["__k"], "hit_policy": "all_pages"}]
    inner = {"pools": pools, "key_prefix": key_prefix, "is_mla_backend": True, "pp_rank": 0, "pp_size": 1}
    return {"enabled": True, "backend": "mooncake", "page_size": 32, "hicache_object_layout": inner}


def test_l3_layout_route_tells_mla_and_checks_the_key_prefix(bodies):
    body = {**bodies["0.5.23"], "hicache_mem_layout": "page_first"}
    assert "hicache_object_layout" not in body  # the scheduler's copy is absent: the route is asked
    server = HttpServer(
        {"/server_info": json_route(body), "/get_hicache_l3_cache_layout": json_route(l3_layout("blue_org-m"))}
    )
    try:
        res, data = run_json(["inspect", "keys", "--tokens", TOKENS, "--sglang-url", server.url])
        server.httpd.routes["/get_hicache_l3_cache_layout"] = json_route(l3_layout("blue_org-m_tp8"))
        other = hicache(["inspect", "keys", "--tokens", TOKENS, "--sglang-url", server.url])
    finally:
        server.stop()
    assert res.exit_code == 0, res.output
    assert [p["object_keys"] for p in data["pages"]] == [[f"blue_org-m_{p['page_key']}__k"] for p in data["pages"]]
    assert "--mla" in res.stderr and "key prefix" not in res.stderr
    assert other.exit_code == 0
    assert (
        "note: the server's L3 layout names key prefix 'blue_org-m_tp8'; its arguments give 'blue_org-m'."
        in other.stderr
    )


def test_prefetch_lists_where_the_serve_does_not_mirror_the_server(bodies, serve_body, tmp_path):
    from serve_process import Serve

    url = serve_body(bodies["0.5.23"])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": list(range(100))}) + "\n")
    serve = Serve(tmp_path / "serve", "--device-tokens", "1024", "--page-size", "32", "--prefetch-threshold", "64")
    try:
        res, data = run_json(["prefetch", str(prompts), "--serve", serve.url, "--sglang-url", url])
        human = hicache(["prefetch", str(prompts), "--serve", serve.url, "--sglang-url", url])
    finally:
        serve.stop()
    assert res.exit_code == 0, res.output
    found = {d["field"]: (d["serve"], d["server"]) for d in data["server_disagreements"]}
    assert "page_size" not in found and "sglang_version" not in found
    assert found["prefetch_threshold"] == (64, 256) and found["tp_size"] == (1, 2)
    assert found["key_prefix"] == ("hicache-tiny_", "blue_org-m_") and found["layout"] == ("page_first", "page_head")
    assert found["write_policy"][1] == "write_back"
    assert human.exit_code == 0
    assert "warning: serve prefetch_threshold 64 differs from the SGLang server's 256" in human.stderr


# --- failures ------------------------------------------------------------------------------------


def test_unreachable_url_exits_3_within_the_timeout():
    url = f"http://127.0.0.1:{free_port()}"
    res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", url])
    assert res.exit_code == 3
    assert res.stderr.splitlines()[0] == f"error: no SGLang server answers at {url} (ConnectError)."


def test_silent_server_exits_3_within_the_timeout():
    with socket.socket() as listener:  # accepts connections (backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", url, "--timeout", "0.5"])
        waited = time.monotonic() - start
    assert res.exit_code == 3, res.output
    assert "did not answer /server_info within 0.5 s" in res.stderr
    assert waited < 30  # bounded by --timeout, not a hang


@pytest.mark.parametrize(
    "routes, message",
    [
        ({}, "is not an SGLang server: /server_info HTTP 404, /get_server_info HTTP 404."),
        ({"/server_info": (200, "text/html", b"<html>hi</html>")}, "answered with text/html, not JSON"),
        ({"/server_info": json_route({"status": "ok"})}, "answered JSON without SGLang's server arguments"),
    ],
)
def test_not_an_sglang_server_exits_2_with_one_sentence(routes, message):
    server = HttpServer(routes)
    try:
        res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", server.url])
        res_json, data = run_json(["te", "check", "--sglang-url", server.url])
    finally:
        server.stop()
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output
    assert res_json.exit_code == 2 and message in data["error"]["message"]


def test_unknown_server_version_needs_the_flag(bodies, serve_body):
    url = serve_body({**bodies["0.5.23"], "version": "0.4.9"})
    res = hicache(["inspect", "keys", "--tokens", TOKENS, "--sglang-url", url])
    assert res.exit_code == 2 and "runs SGLang 0.4.9, whose key rules this toolkit does not know" in res.stderr
    res, data = run_json(["inspect", "keys", "--tokens", TOKENS, "--sglang-url", url, "--sglang-version", "0.5.23"])
    assert res.exit_code == 0, res.output
    assert data["sglang_version"] == "0.5.23" and data["page_size"] == 32


def test_bad_url_and_timeout_are_input_errors():
    res = hicache(["inspect", "keys", "--tokens", "1,2", "--sglang-url", "127.0.0.1:30000"])
    assert res.exit_code == 2 and "must start with http:// or https://" in res.stderr
    with pytest.raises(InputError, match="must be positive"):
        resolve_from_server("http://127.0.0.1:1", {}, timeout=0)
