"""Several hosts on one machine: real namespaces, a real master in h0, real serve processes in h1
and h2 reading each other's segments over TCP, the cross-host faults and their diagnoses.

One lab of 3 hosts is shared by the module; the tests run in file order (the last takes it down).
Skipped only where this machine cannot create network namespaces (not root, no `ip`) outside CI;
in CI (CI=true) or as root that is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import hicache
from hicache_ops.commands.lab import processes, topology
from hicache_ops.commands.lab.down import down
from hicache_ops.commands.lab.owners import segment_owners
from hicache_ops.commands.lab.up import up
from hicache_ops.commands.playbook import serve_variables
from hicache_ops.errors import InputError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.server.client import ServeClient

HICACHE = str(Path(sys.executable).with_name("hicache"))
PAGES = 32
PAGE_SIZE = 16  # serve's default
# A match covers at most input length - 1 tokens, so a page-aligned prompt read back recomputes
# its last page (docs/controller.md#match-cap).
READABLE = (PAGES - 1) * PAGE_SIZE


def _can_create_namespaces() -> str | None:
    try:
        topology.require_namespaces()
    except InputError as exc:
        return exc.message
    return None


CANNOT = _can_create_namespaces()
# In CI (CI=true) or as root the lab must run: a machine that cannot make namespaces there is a
# failure of every test, not a skip. Elsewhere (a developer without root) the module is skipped.
MUST_RUN = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes") or os.geteuid() == 0

pytestmark = pytest.mark.skipif(
    CANNOT is not None and not MUST_RUN,
    reason=f"this machine cannot create network namespaces: {CANNOT}",
)


@pytest.fixture(autouse=True)
def namespaces_can_be_made():
    if CANNOT is not None:
        pytest.fail(f"the lab must run in CI and as root, but this machine cannot create network namespaces: {CANNOT}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab")
    info = up(3, folder)
    info["run_dir"] = str(folder)
    try:
        yield info
    finally:
        down(folder)


def _prompt(lab: dict, name: str, start: int) -> tuple[list[int], Path]:
    tokens = list(range(start, start + PAGES * PAGE_SIZE))
    path = Path(lab["run_dir"]) / f"{name}.json"
    path.write_text(json.dumps(tokens))
    return tokens, path


def _prefill(url: str, tokens: list[int], **extra) -> dict:
    with ServeClient(url) as client:
        return client._call("POST", "/v1/prefill", json={"input_ids": tokens, **extra})


def _segment(url: str) -> str:
    with ServeClient(url) as client:
        return client.stats()["config"]["segment"]


def _json(result) -> dict:
    return json.loads(result.stdout)


def _in_namespace(ns: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, HICACHE, *args], capture_output=True, text=True, timeout=timeout)


def test_up_runs_the_master_in_h0_and_a_serve_per_host(lab):
    result = hicache(["lab", "status", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    status = _json(result)
    assert [r["host"] for r in status["hosts"]] == ["h0", "h1", "h2"]
    assert all(r["alive"] and r["namespace_present"] for r in status["hosts"])
    addresses = [r["address"] for r in status["hosts"]]
    assert len(set(addresses)) == 3 and all(a.startswith(status["subnet"].rsplit(".", 1)[0]) for a in addresses)
    # each serve advertises its own host's address, so the master lists reachable segments
    assert [r["segment"].split(":")[0] for r in status["hosts"][1:]] == addresses[1:]
    with AdminClient(lab["master"]["metrics"]) as admin:
        listed = {s["segment_name"] for s in admin.segments_detail()}
    assert listed == {r["segment"] for r in status["hosts"][1:]}


def test_reader_host_gets_storage_hits_for_what_the_writer_host_wrote(lab):
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    tokens, _ = _prompt(lab, "shared", 10_000)
    wrote = _prefill(h1, tokens, backup=True, return_keys=True)
    assert wrote["stored_pages"] == PAGES and wrote["bytes_written_to_l3"] > 0
    read = _prefill(h2, tokens)
    assert read["storage_hit"] == READABLE and read["computed"] == PAGE_SIZE
    assert read["bytes_read_from_l3"] > 0
    # some of what h2 read lives in h1's segment: a real TCP transfer between the two namespaces
    h1_address = lab["hosts"][1]["address"]
    with AdminClient(lab["master"]["metrics"]) as admin:
        keys = [k for k in admin.get_all_keys() if any(p in k for p in wrote["page_keys"])]
        endpoints = {r["transport_endpoint_"] for k in keys for r in admin.query_key(k) or []}
    assert any(e.startswith(h1_address + ":") for e in endpoints), endpoints
    # an existing playbook, with the serve and the master on different hosts
    _, prompt = _prompt(lab, "shared", 10_000)
    run = hicache(["playbook", "run", "no-l3-hit", "--serve", h2, "--prompt", prompt, "--json"])
    assert _json(run)["finding"]["check"] == "2. Served from L1/L2 first", run.stdout


def test_loopback_hostname_is_reproduced_and_diagnosed(lab, monkeypatch):
    monkeypatch.setenv("HICACHE_LAB_DIR", lab["run_dir"])  # where inspect and playbooks find the lab's hosts
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    result = hicache(["lab", "fault", "loopback-hostname", "--on", "h1", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    assert _json(result)["host"] == "h1"
    bad_segment = _segment(h1)
    assert bad_segment.startswith("127.0.0.1:")
    tokens, prompt = _prompt(lab, "loopback", 20_000)
    assert _prefill(h1, tokens, backup=True)["stored_pages"] == PAGES
    read = _prefill(h2, tokens)
    assert read["storage_hit"] < len(tokens)  # listed on the master, unreadable from h2

    store = _json(hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]))
    flagged = {p["segment"]: p["problem"] for p in store["segment_problems"]}
    assert flagged == {bad_segment: "loopback"}
    # 127.0.0.1:PORT names no host; the lab's observations do
    problem = store["segment_problems"][0]
    assert problem["host"] == "h1" and "It belongs to lab host h1" in problem["note"]
    endpoint = problem["te_endpoint"]
    owners = segment_owners(
        [
            (bad_segment, endpoint),
            ("127.0.0.1:7", "127.0.0.1:18080"),
            ("127.0.0.1:1", "127.0.0.1:1"),
            (_segment(h2), None),
        ],
        lab["run_dir"],
    )
    # both observations agree: h1's serve reports the segment, its Transfer Engine port listens in h1 only
    assert owners[bad_segment]["host"] == "h1"
    assert owners[bad_segment]["basis"] == (
        f"h1's serve reports {bad_segment} as its segment, and port {endpoint.rsplit(':', 1)[1]} listens there"
    )
    # no honest mapping: the serves' HTTP port listens in every serve host, port 1 in none
    assert (owners["127.0.0.1:7"]["host"], owners["127.0.0.1:7"]["candidates"]) == (None, ["h1", "h2"])
    assert (owners["127.0.0.1:1"]["host"], owners["127.0.0.1:1"]["candidates"]) == (None, ["h1", "h2"])
    assert "listens in no lab host" in owners["127.0.0.1:1"]["basis"]
    assert owners[_segment(h2)]["host"] == "h2"  # a lab address names its host
    assert segment_owners([(bad_segment, endpoint)], Path(lab["run_dir"]) / "no-lab") == {}

    scheme = serve_variables(h2)["serve_scheme"].split()
    keys = hicache(
        ["inspect", "keys", "--tokens-file", prompt, *scheme, "--master", lab["master"]["metrics"], "--json"]
    )
    kinds = [d["kind"] for d in _json(keys)["diagnosis"]]
    assert "unreachable_segment" in kinds
    entry = next(d for d in _json(keys)["diagnosis"] if d["kind"] == "unreachable_segment")
    assert "present on the master but the segment holding it is unreachable from here" in entry["message"]
    assert entry["problem"] == "loopback" and entry["segment"] == bad_segment
    assert entry["host"] == "h1" and f"(segment {bad_segment}, owned by lab host h1 (" in entry["message"]

    # the reader's trace names the writer's segment at the failed read
    trace = hicache(["trace", "read", "--serve", h2, "--tokens-file", prompt, "--flush", "--allow-writes", "--json"])
    steps = [json.loads(line) for line in trace.stdout.splitlines() if line.strip()]
    failed = next(s for s in steps if s["status"] == "FAIL")
    assert failed["name"] == "batch_get_into", steps
    assert any(f"segment {bad_segment}" in cause for cause in failed["causes"]), failed["causes"]

    run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt, "--json"])
    assert run.exit_code == 1, run.stdout
    finding = _json(run)["finding"]
    assert finding["check"].endswith("A segment advertises a loopback endpoint")
    assert finding["evidence"]["segment_problems"][0]["segment"] == bad_segment
    assert finding["evidence"]["segment_problems"][0]["host"] == "h1"
    assert "MOONCAKE_LOCAL_HOSTNAME" in finding["fix"]

    healed = hicache(["lab", "fault", "heal", "--on", "h1", "--run-dir", lab["run_dir"], "--json"])
    assert healed.exit_code == 0, healed.stdout
    assert _segment(h1).startswith(lab["hosts"][1]["address"] + ":")
    assert (
        _json(hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]))["segment_problems"] == []
    )


def test_partition_cuts_the_master_but_not_the_peers(lab):
    h2 = lab["hosts"][2]
    result = hicache(["lab", "fault", "partition", "--on", "h2", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    try:
        store = _in_namespace(h2["namespace"], "inspect", "store", "--master", lab["master"]["metrics"], "--json")
        assert store.returncode == 3, store.stdout
        peer = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                h2["namespace"],
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('{lab['hosts'][1]['address']}', 18080), timeout=2)",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert peer.returncode == 0, peer.stderr
        tokens, prompt = _prompt(lab, "partition", 30_000)
        run = _in_namespace(
            h2["namespace"],
            "playbook",
            "run",
            "cross-host-miss",
            "--serve",
            h2["url"],
            "--prompt",
            str(prompt),
            "--json",
        )
        assert json.loads(run.stdout)["finding"]["check"].endswith("This host reaches the master"), run.stdout
        # the master still answers from this (root) namespace: a partition, not a dead master
        assert hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]).exit_code == 0
    finally:
        assert hicache(["lab", "fault", "heal", "--on", "h2", "--run-dir", lab["run_dir"]]).exit_code == 0


def test_slow_link_is_cut_by_the_stop_policy(lab):
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    result = hicache(
        ["lab", "fault", "slow-link", "--on", "h2", "--latency-ms", "300", "--run-dir", lab["run_dir"], "--json"]
    )
    assert result.exit_code == 0, result.stdout
    try:
        tokens, prompt = _prompt(lab, "slow", 35_000)
        assert _prefill(h1, tokens, backup=True)["stored_pages"] == PAGES
        run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt, "--json"])
        data = _json(run)
        assert data["finding"]["check"] == "6. Slow reads cut by the stop policy", run.stdout
        assert [c["status"] for c in data["checks"][:5]] == ["clear"] * 5
    finally:
        assert hicache(["lab", "fault", "heal", "--on", "h2", "--run-dir", lab["run_dir"]]).exit_code == 0


def test_master_restart_loses_every_object_and_clients_remount(lab):
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    tokens, prompt = _prompt(lab, "before-restart", 37_000)
    assert _prefill(h1, tokens, backup=True)["stored_pages"] == PAGES
    result = hicache(["lab", "fault", "master-restart", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt, "--json"])
    assert _json(run)["finding"]["check"] == "5. The objects are gone", run.stdout
    deadline = time.monotonic() + 30
    with AdminClient(lab["master"]["metrics"]) as admin:
        while len(admin.get_all_segments()) < 2:  # both serves re-mount by themselves
            assert time.monotonic() < deadline, "the serves did not re-mount their segments within 30 s"
            time.sleep(0.5)
    fresh, _ = _prompt(lab, "after-restart", 38_000)
    assert _prefill(h1, fresh, backup=True)["stored_pages"] == PAGES
    assert _prefill(h2, fresh)["storage_hit"] == READABLE


def test_host_down_takes_its_objects_off_the_master(lab, monkeypatch):
    monkeypatch.setenv("HICACHE_LAB_DIR", lab["run_dir"])
    h1 = lab["hosts"][1]
    tokens, prompt = _prompt(lab, "host-down", 40_000)
    assert _prefill(h1["url"], tokens, backup=True)["stored_pages"] == PAGES
    segment = _segment(h1["url"])
    with AdminClient(lab["master"]["metrics"]) as admin:
        before = len(admin.get_all_keys())
    result = hicache(["lab", "fault", "host-down", "--on", "h1", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    assert not processes.alive(json.loads((Path(lab["run_dir"]) / "lab.json").read_text())["hosts"][1]["process"])
    # until the client TTL runs out the segment stays listed, and nobody can reach it
    store = _json(hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]))
    listed = {p["segment"]: p["problem"] for p in store["segment_problems"]}
    if segment in {s["name"] for s in store["segments"]}:  # not yet if the TTL already ran out
        assert listed[segment] == "unreachable"
        owner = next(p for p in store["segment_problems"] if p["segment"] == segment)
        assert owner["host"] == "h1" and f"It belongs to lab host h1 ({h1['address']} is" in owner["note"]
    deadline = time.monotonic() + 60
    with AdminClient(lab["master"]["metrics"]) as admin:
        while segment in admin.get_all_segments():
            assert time.monotonic() < deadline, "the dead host's segment is still listed after 60 s"
            time.sleep(0.5)
        after = len(admin.get_all_keys())
    assert after < before
    scheme = serve_variables(lab["hosts"][2]["url"])["serve_scheme"].split()
    keys = _json(
        hicache(["inspect", "keys", "--tokens-file", prompt, *scheme, "--master", lab["master"]["metrics"], "--json"])
    )
    assert keys["first_missing"] is not None
    run = hicache(
        ["playbook", "run", "cross-host-miss", "--serve", lab["hosts"][2]["url"], "--prompt", prompt, "--json"]
    )
    assert _json(run)["finding"]["check"] == "5. The objects are gone", run.stdout


def test_down_removes_every_namespace_link_and_process(lab):
    recorded = json.loads((Path(lab["run_dir"]) / "lab.json").read_text())
    records = [h["process"] for h in recorded["hosts"] if h.get("process")]
    result = hicache(["lab", "down", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in listed.splitlines() if line.startswith("hicache-h")]
    assert not topology.link_exists(topology.BRIDGE)
    assert not any(topology.link_exists(h["veth"]) for h in recorded["hosts"])
    assert not any(processes.alive(r) for r in records)
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert lab["run_dir"] not in ps  # every serve was started with --log-dir under the run folder
    assert not (Path(lab["run_dir"]) / "lab.json").exists()
    again = hicache(["lab", "down", "--run-dir", lab["run_dir"], "--json"])  # idempotent
    assert again.exit_code == 0 and _json(again)["namespaces_removed"] == []


def test_up_refuses_without_root(tmp_path):
    result = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            HICACHE,
            "lab",
            "up",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "needs root" in result.stderr and "Traceback" not in result.stderr


def test_down_cleans_up_after_the_lab_command_is_killed_midway(tmp_path):
    folder = tmp_path / "crashed"
    state_file = folder / "lab.json"
    command = subprocess.Popen(
        [HICACHE, "lab", "up", "--hosts", "3", "--run-dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # killed once the serves are being started: namespaces, links and processes exist
            assert time.monotonic() < deadline and command.poll() is None, "lab up never reached its serves"
            if state_file.exists():
                try:
                    hosts = json.loads(state_file.read_text())["hosts"]
                except ValueError:
                    hosts = []
                if hosts and all(h.get("process") for h in hosts):
                    break
            time.sleep(0.05)
    finally:
        command.kill()
        command.wait()
    records = [h["process"] for h in json.loads(state_file.read_text())["hosts"]]
    assert any(processes.alive(r) for r in records)  # they outlive the killed command
    result = hicache(["lab", "down", "--run-dir", folder, "--json"])
    assert result.exit_code == 0, result.stdout
    assert not topology.existing_namespaces() and not topology.link_exists(topology.BRIDGE)
    assert not any(processes.alive(r) for r in records)
