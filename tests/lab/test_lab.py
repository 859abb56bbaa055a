"""Several hosts on one machine: real namespaces, a real master in h0, real serve processes in h1
and h2 reading each other's segments over TCP, the cross-host faults and their diagnoses.

One lab of 3 hosts is shared by the module; the tests run in file order (test_down_... takes it
down). A second lab of 2 hosts runs beside it for one test, started and stopped by `hicache lab`
processes of their own. The module's labs are listed in an index of their own ($HICACHE_LAB_INDEX).
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
from hicache_ops.commands.lab import processes, state, topology
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
    # The module's labs are listed in an index of their own: a bare `lab down` here sees them only.
    saved = os.environ.get(state.INDEX_ENV)
    os.environ[state.INDEX_ENV] = str(tmp_path_factory.mktemp("lab-index"))
    folder = tmp_path_factory.mktemp("lab")
    try:
        info = up(3, folder)
        info["run_dir"] = str(folder)
        try:
            yield info
        finally:
            down(folder)
    finally:
        if saved is None:
            os.environ.pop(state.INDEX_ENV, None)
        else:
            os.environ[state.INDEX_ENV] = saved


def _prompt(lab: dict, name: str, start: int) -> tuple[list[int], Path]:
    tokens = list(range(start, start + PAGES * PAGE_SIZE))
    path = Path(lab["run_dir"]) / f"{name}.json"
    path.write_text(json.dumps(tokens))
    return tokens, path


def _prefill(url: str, tokens: list[int], **extra) -> dict:
    with ServeClient(url) as client:
        return client._call("POST", "/v1/prefill", json={"input_ids": tokens, **extra})


def _stored_everything(url: str, tokens: list[int], master_metrics: str, **extra) -> dict:
    """Prefill with a backup and check every page reached L3; otherwise fail saying what the serve
    and the master saw (a failed put lands on a segment the writer could not reach)."""
    wrote = _prefill(url, tokens, backup=True, **extra)
    if wrote["stored_pages"] != PAGES:
        with ServeClient(url) as client:
            l3 = client.stats().get("l3")
        with AdminClient(master_metrics) as admin:
            segments = admin.get_all_segments()
        pytest.fail(f"{url} stored {wrote['stored_pages']} of {PAGES} pages; its L3: {l3}; the master lists {segments}")
    return wrote


def _segment(url: str) -> str:
    with ServeClient(url) as client:
        return client.stats()["config"]["segment"]


def _json(result) -> dict:
    return json.loads(result.stdout)


def _in_namespace(ns: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, HICACHE, *args], capture_output=True, text=True, timeout=timeout)


def _command(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """`hicache ARGS` as a process of its own (what it starts outlives it, as for a user)."""
    return subprocess.run([HICACHE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _store_snapshot(master: str) -> tuple[list[str], list[str]]:
    with AdminClient(master) as admin:
        return sorted(admin.get_all_keys()), sorted(admin.get_all_segments())


def _leftovers(recorded: dict) -> list[str]:
    """What of a downed lab is still on this machine: namespaces and links with its ID, its processes
    (alive or zombie: `down` returns only once they are reaped), its state file."""
    lab_id = recorded["id"]
    found = topology.existing_namespaces(topology.namespace_prefix(lab_id))
    found += topology.links(topology.link_prefix(lab_id))
    found += [f"pid {h['process']['pid']}" for h in recorded["hosts"] if processes.present(h.get("process"))]
    if (Path(recorded["run_dir"]) / "lab.json").exists():
        found.append("lab.json")
    return found


def _readable_pages(master: str, page_keys: list[str], unreadable_endpoint: str) -> int:
    """Leading pages of a prompt none of whose objects sits behind `unreadable_endpoint`: what a reader
    can fetch before SGLang stops at the first page it cannot read (docs/mooncake.md#several-hosts)."""
    with AdminClient(master) as admin:
        names = admin.get_all_keys()
        readable = 0
        for page in page_keys:
            replicas = [r for k in names if page in k for r in admin.query_key(k) or []]
            assert len(replicas) >= 2, (page, replicas)  # its k and v objects, listed
            if any(r["transport_endpoint_"] == unreadable_endpoint for r in replicas):
                break
            readable += 1
    return readable


def test_up_runs_the_master_in_h0_and_a_serve_per_host(lab):
    result = hicache(["lab", "status", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    status = _json(result)
    assert [r["host"] for r in status["hosts"]] == ["h0", "h1", "h2"]
    assert all(r["alive"] and r["namespace_present"] for r in status["hosts"])
    # every name carries the lab's ID, and interface names fit Linux's 15 characters
    lab_id = status["id"]
    assert len(lab_id) == topology.ID_LENGTH and lab["id"] == lab_id
    assert [r["namespace"] for r in status["hosts"]] == [f"hicache-{lab_id}-h{i}" for i in range(3)]
    assert status["bridge"]["name"] == f"hc{lab_id}-br"
    assert sorted(topology.links(f"hc{lab_id}-")) == sorted([f"hc{lab_id}-br"] + [f"hc{lab_id}-v{i}" for i in range(3)])
    assert all(len(name) <= topology.IFNAMSIZ for name in topology.links(f"hc{lab_id}-"))
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
    wrote = _stored_everything(h1, tokens, lab["master"]["metrics"], return_keys=True)
    assert wrote["bytes_written_to_l3"] > 0
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
    assert list(_json(result)) == ["name", "host", "detail", "run_dir"]  # LabFault
    assert _json(result)["host"] == "h1"
    bad_segment = _segment(h1)
    assert bad_segment.startswith("127.0.0.1:")
    tokens, prompt = _prompt(lab, "loopback", 20_000)
    wrote = _stored_everything(h1, tokens, lab["master"]["metrics"], return_keys=True)
    read = _prefill(h2, tokens)

    store = _json(hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]))
    flagged = {p["segment"]: p["problem"] for p in store["segment_problems"]}
    assert flagged == {bad_segment: "loopback"}
    # 127.0.0.1:PORT names no host; the lab's observations do
    problem = store["segment_problems"][0]
    assert problem["host"] == "h1" and "It belongs to lab host h1" in problem["note"]
    endpoint = problem["te_endpoint"]
    # Listed on the master, but h2 reads only the leading pages whose objects all landed outside h1's
    # segment (a put goes to any mounted segment): 0 unless page 0's k and v both sit in h2's segment.
    expected = _readable_pages(lab["master"]["metrics"], wrote["page_keys"][: PAGES - 1], endpoint)
    assert read["storage_hit"] == expected * PAGE_SIZE, (read["storage_hit"], expected, read["prefetch"])
    if expected < PAGES - 1:
        assert read["prefetch"]["reason"] == f"page {expected} could not be read from L3", read["prefetch"]
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
    # as a person reads it: key value pairs, no Python reprs
    human = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt])
    flat = " ".join(human.stdout.split())
    assert f"evidence segment_problems: segment {bad_segment}, te_endpoint 127.0.0.1:" in flat, human.stdout
    assert ", problem loopback, host h1," in flat
    assert not any(mark in human.stdout for mark in ("{'", "'host'", "None", "[{")), human.stdout

    healed = hicache(["lab", "fault", "heal", "--on", "h1", "--run-dir", lab["run_dir"], "--json"])
    assert healed.exit_code == 0, healed.stdout
    assert _segment(h1).startswith(lab["hosts"][1]["address"] + ":")
    assert (
        _json(hicache(["inspect", "store", "--master", lab["master"]["metrics"], "--json"]))["segment_problems"] == []
    )


def test_partition_after_a_host_down_is_the_first_finding_from_either_side(lab):
    h1, h2 = lab["hosts"][1], lab["hosts"][2]
    master = lab["master"]["metrics"]
    # an earlier host-down, recovered: heal returns once the dead serve's segment has left the master
    dead_segment = _segment(h1["url"])
    assert hicache(["lab", "fault", "host-down", "--on", "h1", "--run-dir", lab["run_dir"]]).exit_code == 0
    assert hicache(["lab", "fault", "heal", "--on", "h1", "--run-dir", lab["run_dir"]]).exit_code == 0
    assert dead_segment not in _store_snapshot(master)[1]
    tokens, prompt = _prompt(lab, "partition", 30_000)
    _stored_everything(h1["url"], tokens, lab["master"]["metrics"])

    result = hicache(["lab", "fault", "partition", "--on", "h2", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    try:
        # fault returns once h2's serve sees the partition
        with ServeClient(h2["url"]) as client:
            assert client.stats()["l3"]["state"] == "down"
        store = _in_namespace(h2["namespace"], "inspect", "store", "--master", master, "--json")
        assert store.returncode == 3, store.stdout
        peer = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                h2["namespace"],
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('{h1['address']}', 18080), timeout=2)",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert peer.returncode == 0, peer.stderr
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
        assert json.loads(run.stdout)["finding"]["check"] == "1. This host reaches the master", run.stdout
        # The master answers from this (root) namespace: a partition, not a dead master. Once the
        # client TTL has taken h2's segment off the master the store stays as it is; the playbook,
        # run twice from here, names the partition both times and changes nothing.
        deadline = time.monotonic() + 60
        while any(s.startswith(h2["address"] + ":") for s in _store_snapshot(master)[1]):
            assert time.monotonic() < deadline, "the partitioned host's segment is still listed after 60 s"
            time.sleep(0.5)
        before = _store_snapshot(master)
        for _ in range(2):
            run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2["url"], "--prompt", prompt, "--json"])
            assert run.exit_code == 1, run.stdout
            data = _json(run)
            assert data["finding"]["check"] == "2. The instance reaches the master", run.stdout
            assert [c["status"] for c in data["checks"]] == ["clear", "finding"]
            assert f"the serve at {h2['url']} has its L3 down" in data["finding"]["evidence"]["error.message"]
        assert _store_snapshot(master) == before
    finally:
        assert hicache(["lab", "fault", "heal", "--on", "h2", "--run-dir", lab["run_dir"]]).exit_code == 0
    with ServeClient(h2["url"]) as client:
        assert client.stats()["l3"]["state"] == "up"


def test_two_labs_run_side_by_side_and_down_touches_only_its_own(lab, tmp_path):
    """A second lab beside the module's, started and stopped as a user would (its own processes, so
    what it starts is PID 1's to reap): its own ID, subnet, master; a bare down names both labs and
    stops neither; down of one leaves the other working; nothing of the downed one is left."""
    other_dir = tmp_path / "other"
    started = _command("lab", "up", "--hosts", "2", "--run-dir", str(other_dir), "--json")
    assert started.returncode == 0, started.stderr
    other = json.loads((other_dir / "lab.json").read_text())
    other["run_dir"] = str(other_dir)
    try:
        mine = json.loads((Path(lab["run_dir"]) / "lab.json").read_text())
        mine["run_dir"] = lab["run_dir"]
        assert other["id"] != mine["id"] and other["subnet"] != mine["subnet"]
        assert other["bridge"]["name"] != mine["bridge"]["name"]
        for folder, info in ((lab["run_dir"], mine), (str(other_dir), other)):
            status = _json(hicache(["lab", "status", "--run-dir", folder, "--json"]))
            assert status["id"] == info["id"] and all(r["alive"] and r["namespace_present"] for r in status["hosts"])
        # each lab has its own master: what the other lab's serve stores lands there only
        tokens, _ = _prompt(lab, "other-lab", 45_000)
        before = _store_snapshot(mine["master"]["metrics"])
        _stored_everything(other["hosts"][1]["url"], tokens, other["master"]["metrics"])
        assert len(_store_snapshot(other["master"]["metrics"])[0]) >= PAGES
        assert _store_snapshot(mine["master"]["metrics"]) == before

        env = {k: v for k, v in os.environ.items() if k != state.RUN_DIR_ENV}
        bare = _command("lab", "down", env=env)
        assert bare.returncode == 2, bare.stderr
        assert "2 labs are up on this machine" in bare.stderr and str(other_dir) in bare.stderr, bare.stderr
        assert lab["run_dir"] in bare.stderr and "Traceback" not in bare.stderr
        assert _leftovers(other) != [] and _leftovers(mine) != []  # neither was touched

        stopped = _command("lab", "down", "--run-dir", str(other_dir), "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["not_reaped"] == []
        assert _leftovers(other) == []  # no namespace, link, process (not even a zombie) or state
    finally:
        _command("lab", "down", "--run-dir", str(other_dir))
    # the module's lab still works: h1 writes, h2 reads across hosts
    status = _json(hicache(["lab", "status", "--run-dir", lab["run_dir"], "--json"]))
    assert all(r["alive"] and r["namespace_present"] for r in status["hosts"])
    tokens, _ = _prompt(lab, "after-other-down", 47_000)
    _stored_everything(lab["hosts"][1]["url"], tokens, lab["master"]["metrics"])
    assert _prefill(lab["hosts"][2]["url"], tokens)["storage_hit"] == READABLE


def test_slow_link_is_cut_by_the_stop_policy(lab):
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    result = hicache(
        ["lab", "fault", "slow-link", "--on", "h2", "--latency-ms", "300", "--run-dir", lab["run_dir"], "--json"]
    )
    assert result.exit_code == 0, result.stdout
    try:
        tokens, prompt = _prompt(lab, "slow", 35_000)
        _stored_everything(h1, tokens, lab["master"]["metrics"])
        run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt, "--json"])
        data = _json(run)
        assert data["finding"]["check"] == "7. Slow reads cut by the stop policy", run.stdout
        assert [c["status"] for c in data["checks"][:6]] == ["clear"] * 6
    finally:
        assert hicache(["lab", "fault", "heal", "--on", "h2", "--run-dir", lab["run_dir"]]).exit_code == 0


def test_master_restart_loses_every_object_and_clients_remount(lab):
    h1, h2 = lab["hosts"][1]["url"], lab["hosts"][2]["url"]
    tokens, prompt = _prompt(lab, "before-restart", 37_000)
    _stored_everything(h1, tokens, lab["master"]["metrics"])
    result = hicache(["lab", "fault", "master-restart", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    run = hicache(["playbook", "run", "cross-host-miss", "--serve", h2, "--prompt", prompt, "--json"])
    assert _json(run)["finding"]["check"] == "6. The objects are gone", run.stdout
    deadline = time.monotonic() + 30
    with AdminClient(lab["master"]["metrics"]) as admin:
        while len(admin.get_all_segments()) < 2:  # both serves re-mount by themselves
            assert time.monotonic() < deadline, "the serves did not re-mount their segments within 30 s"
            time.sleep(0.5)
    fresh, _ = _prompt(lab, "after-restart", 38_000)
    _stored_everything(h1, fresh, lab["master"]["metrics"])
    assert _prefill(h2, fresh)["storage_hit"] == READABLE


def test_host_down_takes_its_objects_off_the_master(lab, monkeypatch):
    monkeypatch.setenv("HICACHE_LAB_DIR", lab["run_dir"])
    h1 = lab["hosts"][1]
    tokens, prompt = _prompt(lab, "host-down", 40_000)
    _stored_everything(h1["url"], tokens, lab["master"]["metrics"])
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
    assert _json(run)["finding"]["check"] == "6. The objects are gone", run.stdout


def test_down_removes_every_namespace_link_and_process(lab):
    recorded = json.loads((Path(lab["run_dir"]) / "lab.json").read_text())
    records = [h["process"] for h in recorded["hosts"] if h.get("process")]
    result = hicache(["lab", "down", "--run-dir", lab["run_dir"], "--json"])
    assert result.exit_code == 0, result.stdout
    recorded["run_dir"] = lab["run_dir"]
    assert _leftovers(recorded) == []
    assert not any(topology.link_exists(h["veth"]) for h in recorded["hosts"])
    assert not any(processes.present(r) for r in records)
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
    recorded = json.loads(state_file.read_text())
    recorded["run_dir"] = str(folder)
    result = hicache(["lab", "down", "--run-dir", folder, "--json"])
    assert result.exit_code == 0, result.stdout
    assert _leftovers(recorded) == []  # also no zombie: they were PID 1's children, and down waited


def test_bare_down_stops_the_only_lab_and_names_several_without_stopping_any(tmp_path, monkeypatch):
    """Which lab a `lab down` without --run-dir means, from the state files `lab up` writes (the labs
    here hold no host, so nothing else on the machine is touched)."""
    monkeypatch.setenv(state.INDEX_ENV, str(tmp_path / "index"))
    monkeypatch.delenv(state.RUN_DIR_ENV, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, lab_id in ((first, "zq01"), (second, "zq02")):
        bridge = {"name": topology.bridge_name(lab_id), "address": "10.213.99.254"}
        state.save(folder, {"id": lab_id, "subnet": "10.213.99.0/24", "bridge": bridge, "hosts": [], "faults": []})
    both = hicache(["lab", "down"])
    assert both.exit_code == 2, both.stdout
    assert f"2 labs are up on this machine ({first}, {second}); name the one to stop." in both.stderr
    assert f"--run-dir {first}" in both.stderr
    assert (first / "lab.json").exists() and (second / "lab.json").exists()  # neither was stopped
    state.remove(second)
    only = hicache(["lab", "down", "--json"])
    assert only.exit_code == 0, only.stdout
    assert _json(only)["run_dir"] == str(first) and _json(only)["id"] == "zq01"
    assert not (first / "lab.json").exists() and state.labs_up() == []
