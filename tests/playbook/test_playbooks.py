"""Each playbook against real serve instances sharing one Mooncake master: with its fault injected
it reaches the right diagnosis; against a healthy deployment it passes."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from cli_runner import hicache
from hicache_ops.commands.playbook import holds, list_playbooks, parse_condition, resolve_path
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.mooncake.store_client import StoreClient
from hicache_ops.server.client import ServeClient
from serve_process import HICACHE, Serve

# wait_complete: a healthy run must not depend on how fast L3 reads are here; the stop-policy case sets its own.
BASE = (
    "--device-tokens",
    "2048",
    "--page-size",
    "16",
    "--prefetch-threshold",
    "64",
    "--hicache-storage-prefetch-policy",
    "wait_complete",
)


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("writer"), *BASE)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reader_factory(writer, tmp_path_factory):
    """Serve instances on the writer's master, started once per distinct configuration."""
    started: dict[tuple, Serve] = {}
    rpc, metrics = writer.info["master_rpc_address"], writer.info["master_metrics_address"]
    l3 = f"mooncake://{rpc}?metrics={metrics.split(':')[1]}"

    def get(*args: str) -> Serve:
        if args not in started:
            started[args] = Serve(tmp_path_factory.mktemp("reader"), *BASE, "--l3", l3, *args)
        return started[args]

    yield get
    for s in started.values():
        s.stop()


_seed = iter(range(100, 10_000))


def prompt(tmp_path, n_tokens: int = 160, written_by: Serve | None = None, **namespace) -> str:
    ids = np.random.default_rng(next(_seed)).integers(0, 60_000, size=n_tokens).tolist()
    if written_by is not None:
        with ServeClient(written_by.url) as client:
            client.prefill(ids, namespace.get("extra_key"), namespace.get("cache_salt"), backup=True)
    path = tmp_path / f"prompt{next(_seed)}.json"
    path.write_text(json.dumps(ids))
    return str(path)


def run_book(name: str, *args: str) -> tuple[int, dict]:
    result = hicache(["playbook", "run", name, *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def finding(data: dict) -> str | None:
    return data["finding"]["check"] if data["finding"] else None


# --- the playbook format -------------------------------------------------------------------------


def test_every_playbook_parses_and_the_required_ones_exist():
    names = {p.name for p in list_playbooks()}
    assert names >= {
        "no-l3-hit",
        "short-storage-hit",
        "recomputed-after-get",
        "te-not-reused",
        "master-unreachable",
        "dtype-mismatch",
    }
    result = hicache(["playbook", "show", "no-l3-hit", "--json"])
    # every ```check block of the Markdown is parsed as one check (11 today: L3 down first, 2b the anchor)
    from importlib import resources

    source = resources.files("hicache_ops.playbooks").joinpath("no-l3-hit.md").read_text()
    assert result.exit_code == 0 and len(json.loads(result.stdout)["checks"]) == source.count("```check") == 11


def test_conditions():
    data = {"a": {"b": [1, 2]}, "d": [{"k": "x"}, {"k": "y"}], "n": 3, "s": "hello"}
    assert (
        holds("a.b[1] == 2", data) and holds('d[*].k contains "y"', data) and holds('n > 2 and s contains "ell"', data)
    )
    assert not holds('d[*].k contains "z"', data) and not holds("missing.path == 1", data)
    assert resolve_path(data, "d[*].k") == ["x", "y"]
    with pytest.raises(Exception, match="not PATH OP VALUE"):
        parse_condition("this is not a condition")


def test_unknown_playbook_and_missing_prompt_file():
    result = hicache(["playbook", "run", "nope", "--json"])
    assert result.exit_code == 2 and "Known playbooks" in json.loads(result.stdout)["error"]["hint"]
    result = hicache(["playbook", "run", "no-l3-hit", "--prompt", "/nonexistent.json", "--json"])
    assert result.exit_code == 2


# --- no L3 hit across instances ------------------------------------------------------------------


def test_no_l3_hit_healthy_twice_and_served_locally(writer, reader_factory, tmp_path):
    reader = reader_factory()
    p = prompt(tmp_path, written_by=writer)
    before = reader.client.stats()
    code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)
    assert code == 0 and data["status"] == "pass", data
    again = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)  # observing changed nothing
    assert again == (code, data)
    after = reader.client.stats()
    assert after["stats"] == before["stats"] and after["occupancy"] == before["occupancy"]
    with ServeClient(reader.url) as client:
        client.prefill(json.loads(open(p).read()))  # now it is local
    code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)
    assert code == 1 and finding(data) == "2. Served from L1/L2 first"


def test_never_written_prompt_is_diagnosed_the_same_twice_and_stays_unwritten(writer, reader_factory, tmp_path):
    reader = reader_factory()
    p = prompt(tmp_path)
    first = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)
    assert first[0] == 1 and finding(first[1]) == "10. Never written: DP routing or another instance holds it", first
    assert run_book("no-l3-hit", "--serve", reader.url, "--prompt", p) == first
    assert reader.client.stats()["stats"]["l3_objects_written"] == 0


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["no-l3-hit"], "--prompt"),
        (["no-l3-hit", "--serve", "http://127.0.0.1:notaport", "--prompt", "{prompt}"], "--serve"),
        (["no-l3-hit", "--serve", "http://127.0.0.1:1", "--prompt", "{malformed}"], "malformed.json"),
        (["no-l3-hit", "--serve", "http://127.0.0.1:1", "--prompt", "{two_lines}"], "2 prompts"),
        (["no-l3-hit", "--serve", "http://127.0.0.1:1", "--prompt", "{prompt}", "--timeout", "-1"], "--timeout"),
        (["te-not-reused", "--server-args", "'x"], "--server-args"),
        (["master-unreachable", "--master", "nohost:notaport"], "--master"),
    ],
)
def test_bad_input_is_exit_2_before_any_check(tmp_path, args, fragment):
    files = {
        "prompt": tmp_path / "p.json",
        "malformed": tmp_path / "malformed.json",
        "two_lines": tmp_path / "two.jsonl",
    }
    files["prompt"].write_text(json.dumps(list(range(64))))
    files["malformed"].write_text("[1, 2,")
    files["two_lines"].write_text('{"input_ids": [1, 2]}\n{"input_ids": [3, 4]}\n')
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    code, data = run_book(*args)
    assert code == 2, data
    assert fragment in data["error"]["message"] and "checks" not in data


def test_skipped_checks_name_real_options(writer, tmp_path):
    code, data = run_book("no-l3-hit", "--master", writer.info["master_metrics_address"], "--prompt", prompt(tmp_path))
    skipped = [c for c in data["checks"] if c["status"] == "skipped"]
    assert data["checks"][0]["status"] == "clear", data  # the master answers: L3 is up
    assert skipped and all(c["note"] == "needs --serve" for c in skipped), data
    code, data = run_book("no-l3-hit", "--prompt", prompt(tmp_path))
    assert code == 2 and "no check can run without --master (or --serve), --serve." in data["error"]["message"], data
    code, data = run_book("master-unreachable", "--master", writer.info["master_metrics_address"])
    skipped = [c for c in data["checks"] if c["status"] == "skipped"]
    assert code == 0 and skipped and all(c["note"] == "needs --config" for c in skipped), data


@pytest.mark.parametrize(
    "reader_args, tokens, namespace, expected",
    [
        ((), 48, {}, "3. Below the prefetch threshold"),
        (
            ("--hicache-storage-prefetch-policy", "timeout", "--inject-l3-latency-ms", "500"),
            160,
            {},
            "4. best_effort or timeout cut the prefetch",
        ),
        ((), 160, {"cache_salt": "tenant-a"}, "5. Namespace or salt mismatch"),
        (("--sglang-version", "0.5.14"), 160, {}, "6. Mixed SGLang versions"),
        (("--model-name", "other/model"), 160, {}, "7. Model-prefix or tag mismatch"),
        (("--tp-size", "2"), 160, {}, "8. TP/PP rank mismatch"),
    ],
)
def test_no_l3_hit_findings(writer, reader_factory, tmp_path, reader_args, tokens, namespace, expected):
    reader = reader_factory(*reader_args)
    p = prompt(tmp_path, tokens, written_by=writer, **namespace)
    tries = ["--try-cache-salt", namespace["cache_salt"]] if "cache_salt" in namespace else []
    code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p, *tries)
    assert code == 1 and finding(data) == expected, data
    assert data["finding"]["evidence"]


def test_no_l3_hit_write_back_never_backed_up(reader_factory, tmp_path):
    reader = reader_factory("--hicache-write-policy", "write_back")
    code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", prompt(tmp_path))
    assert code == 1 and finding(data) == "9. write_back never backed it up", data


def test_no_l3_hit_never_written_anywhere(reader_factory, tmp_path):
    code, data = run_book("no-l3-hit", "--serve", reader_factory().url, "--prompt", prompt(tmp_path))
    assert code == 1 and finding(data) == "10. Never written: DP routing or another instance holds it", data


# --- short storage hit ---------------------------------------------------------------------------


def test_short_storage_hit(writer, reader_factory, tmp_path):
    from hicache_ops.mooncake.store_client import StoreClient
    from hicache_ops.sglang.page_keys import ObjectKeyScheme, page_keys

    reader = reader_factory()
    healthy = prompt(tmp_path, written_by=writer)
    assert run_book("short-storage-hit", "--serve", reader.url, "--prompt", healthy)[1]["status"] == "pass"
    broken = prompt(tmp_path, written_by=writer)
    ids = json.loads(open(broken).read())
    scheme = ObjectKeyScheme("0.5.23", model_name="hicache/tiny")
    v_key = scheme.object_keys(page_keys(ids, 16, "0.5.23")[2])[1]
    with StoreClient.connect(writer.info["master_rpc_address"]) as store:
        store.remove_keys([v_key], prefix=scheme.prefix, force=True)
    code, data = run_book("short-storage-hit", "--serve", reader.url, "--prompt", broken)
    assert code == 1 and finding(data) == "1. A missing `_k` or `_v` object", data
    assert data["finding"]["evidence"]["first_missing"] == v_key


# --- recomputed after get ------------------------------------------------------------------------


def test_recomputed_after_get(writer, tmp_path_factory, tmp_path):
    rpc, metrics = writer.info["master_rpc_address"], writer.info["master_metrics_address"]
    l3 = ("--l3", f"mooncake://{rpc}?metrics={metrics.split(':')[1]}")
    small = (
        "--device-tokens",
        "256",
        "--page-size",
        "4",
        "--prefetch-threshold",
        "4",
        "--hicache-storage-prefetch-policy",
        "wait_complete",
    )
    w, r = Serve(tmp_path_factory.mktemp("w4"), *small, *l3), Serve(tmp_path_factory.mktemp("r4"), *small, *l3)
    try:
        healthy = prompt(tmp_path, 64, written_by=w)
        assert run_book("recomputed-after-get", "--serve", r.url, "--prompt", healthy)[1]["status"] == "pass"
        tiny = prompt(tmp_path, 8, written_by=w)  # two pages: an 8-token host hit, below load_back_threshold
        code, data = run_book("recomputed-after-get", "--serve", r.url, "--prompt", tiny)
        assert code == 1 and finding(data) == "2. Below the load-back threshold", data
    finally:
        w.stop()
        r.stop()


# --- dtype mismatch ------------------------------------------------------------------------------


def test_dtype_mismatch(writer, reader_factory, tmp_path, tmp_path_factory):
    reader = reader_factory()
    assert (
        run_book("dtype-mismatch", "--serve", reader.url, "--prompt", prompt(tmp_path, written_by=writer))[1]["status"]
        == "pass"
    )
    rpc, metrics = writer.info["master_rpc_address"], writer.info["master_metrics_address"]
    fp8 = Serve(
        tmp_path_factory.mktemp("fp8"),
        *BASE,
        "--dtype",
        "fp8_e4m3",
        "--l3",
        f"mooncake://{rpc}?metrics={metrics.split(':')[1]}",
    )
    try:
        written = prompt(tmp_path, written_by=fp8)
        code, data = run_book("dtype-mismatch", "--serve", reader.url, "--prompt", written)
        assert code == 1 and finding(data) == "1. Objects of another size under this deployment's keys", data
        # A real prefetch counts the wrong-size objects in its row, the stats and the metrics.
        before = reader.client.stats()["stats"]["size_mismatched_objects"]
        result = hicache(["prefetch", written, "--serve", reader.url, "--json"])
        row = json.loads(result.stdout)["prompts"][0]
        assert result.exit_code == 1 and row["size_mismatched_objects"] > 0 and not row["verified"], result.stdout
        after = reader.client.stats()["stats"]["size_mismatched_objects"]
        assert after - before == row["size_mismatched_objects"]
        assert f"hicache_l3_size_mismatched_objects_total {float(after)}" in reader.client.metrics()
    finally:
        fp8.stop()


def test_an_object_of_the_right_size_with_other_bytes_is_check_2(writer, reader_factory, tmp_path):
    """One object the writer put is overwritten in place with as many other bytes: check 1 (sizes)
    passes, check 2 names it, from the read's byte check (not from the wording of its summary)."""
    admin = AdminClient(writer.info["master_metrics_address"])
    before = set(admin.get_all_keys())
    written = prompt(tmp_path, written_by=writer)
    new = sorted(set(admin.get_all_keys()) - before)
    assert new, "the writer's prompt added no object"
    client = StoreClient.connect(writer.info["master_rpc_address"], segment_size=16 << 20)
    try:
        good = client.get(new[0])
        client.put(new[0], bytes(b ^ 0xFF for b in good), upsert=True)
    finally:
        client.close()
    code, data = run_book("dtype-mismatch", "--serve", reader_factory().url, "--prompt", written)
    assert code == 1 and finding(data) == "2. Objects of the right size with other bytes", data


# --- master unreachable --------------------------------------------------------------------------


def test_master_unreachable(writer, tmp_path):
    good = tmp_path / "mooncake.json"
    good.write_text(
        json.dumps(
            {
                "master_server_address": writer.info["master_rpc_address"],
                "metadata_server": "P2PHANDSHAKE",
                "protocol": "tcp",
                "device_name": "",
                "local_hostname": "127.0.0.1",
            }
        )
    )
    code, data = run_book(
        "master-unreachable", "--master", writer.info["master_metrics_address"], "--config", str(good)
    )
    assert code == 0 and data["status"] == "pass", data
    code, data = run_book("master-unreachable", "--master", "127.0.0.1:1", "--config", str(good))
    assert code == 1 and finding(data) == "1. The master answers"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"master_server_address": "127.0.0.1:50051", "metadata_server": "redis://10.0.0.1:6379"}))
    code, data = run_book("master-unreachable", "--master", writer.info["master_metrics_address"], "--config", str(bad))
    assert code == 1 and finding(data) == "2. A metadata string that crashes or hangs the client", data


# --- the shared Transfer Engine --------------------------------------------------------------------


def test_te_not_reused(tmp_path, monkeypatch):
    flags = "--enable-hierarchical-cache --hicache-storage-backend mooncake"
    config = tmp_path / "mooncake.json"
    config.write_text(
        json.dumps(
            {
                "master_server_address": "127.0.0.1:50051",
                "metadata_server": "P2PHANDSHAKE",
                "protocol": "rdma",
                "device_name": "mlx5_0",
            }
        )
    )
    # Default environment: MOONCAKE_DEVICE "" against no IB flag (None) - not reused.
    monkeypatch.delenv("MOONCAKE_DEVICE", raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", "127.0.0.1:50051")  # the deployment's environment
    code, data = run_book("te-not-reused", "--server-args", flags, "--config", str(config))
    assert code == 1 and finding(data) == "1. The reuse rule", data
    # Same device on both sides: reused, with and without the config file.
    monkeypatch.setenv("MOONCAKE_DEVICE", "mlx5_0")
    code, data = run_book(
        "te-not-reused", "--server-args", f"{flags} --disaggregation-ib-device mlx5_0", "--config", str(config)
    )
    assert code == 0 and data["status"] == "pass", data


@pytest.mark.parametrize("server_args, phrase", [("'x", "not valid shell words"), ("--tp-size two", "not an integer")])
def test_te_not_reused_bad_server_args_exit_2_before_any_check(server_args, phrase):
    result = hicache(["playbook", "run", "te-not-reused", "--server-args", server_args, "--json"])
    assert result.exit_code == 2, result.output
    data = json.loads(result.stdout)
    assert phrase in data["error"]["message"] and "checks" not in data


def test_a_dead_master_is_the_first_finding_even_with_the_prompt_in_l1(tmp_path):
    """The serve's embedded master is killed while the prompt is still in its L1: "L3 is down" comes
    first (not "served from L1/L2"), twice in a row, and after a flush too (no wall of errors)."""
    import os
    import signal
    import time

    serve = Serve(tmp_path / "lone", *BASE)
    try:
        p = prompt(tmp_path, written_by=serve)  # in L1 and L3
        os.kill(serve.info["master_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 60  # hang guard
        while serve.client.health()["status"] != "degraded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first = run_book("no-l3-hit", "--serve", serve.url, "--prompt", p)
        assert first[0] == 1 and finding(first[1]) == "1. L3 is down", first
        assert "connection refused" in first[1]["finding"]["evidence"]["error.message"]
        assert run_book("no-l3-hit", "--serve", serve.url, "--prompt", p) == first
        with ServeClient(serve.url) as client:
            client.flush()
        after = run_book("no-l3-hit", "--serve", serve.url, "--prompt", p)
        assert after == first and [c["status"] for c in after[1]["checks"]] == ["finding"]
    finally:
        serve.stop()


def _object_count(master_metrics: str) -> int:
    result = hicache(["inspect", "store", "--master", master_metrics, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["key_count"]


def test_a_namespace_the_serve_used_is_named_before_routing_is_blamed(reader_factory, tmp_path):
    """Pages written under extra_key "tenant-a" and read without it: without any --try-extra-key the
    serve's own namespaces are tried, so the first finding is the namespace, twice, the store unchanged."""
    reader = reader_factory("--prefetch-threshold", "32")
    p = prompt(tmp_path, 160, written_by=reader, extra_key="tenant-a")
    stats = ServeClient(reader.url).stats()
    assert {"extra_key": "tenant-a", "cache_salt": None} in stats["namespaces"], stats["namespaces"]
    before = _object_count(reader.info["master_metrics_address"])
    assert before > 0
    for _ in range(2):
        code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)
        assert code == 1 and finding(data) == "5. Namespace or salt mismatch", data
        assert "tenant-a" in json.dumps(data["finding"]["evidence"]), data["finding"]
        assert _object_count(reader.info["master_metrics_address"]) == before


def test_a_namespace_another_serve_used_is_found_on_the_shared_master(writer, reader_factory, tmp_path):
    """Pages written by ANOTHER serve on the same master under extra_key "tenant-b" and read without it:
    the reader never saw tenant-b, but the writer's namespace marker on the master names it, so the first
    finding is the namespace (not 'Never written'), twice in a row with the store unchanged."""
    from hicache_ops.mooncake.admin import AdminClient
    from hicache_ops.server.namespaces import marker_key

    reader = reader_factory("--prefetch-threshold", "32")
    p = prompt(tmp_path, 160, written_by=writer, extra_key="tenant-b")
    assert {"extra_key": "tenant-b", "cache_salt": None} not in reader.client.stats()["namespaces"]
    metrics = reader.info["master_metrics_address"]
    with AdminClient(metrics) as admin:
        assert marker_key("tenant-b", None) in admin.get_all_keys()
    before = _object_count(metrics)
    for _ in range(2):
        code, data = run_book("no-l3-hit", "--serve", reader.url, "--prompt", p)
        assert code == 1 and finding(data) == "5. Namespace or salt mismatch", data
        assert "tenant-b" in json.dumps(data["finding"]["evidence"]), data["finding"]
        assert _object_count(metrics) == before
    # the store listing names the marker as a namespace, not as an unexplained key
    listed = subprocess.run(
        [HICACHE, "inspect", "store", "--master", metrics, "--json"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    store = json.loads(listed.stdout)
    assert {"extra_key": "tenant-b", "cache_salt": None} in store["namespaces"], store["namespaces"]
    assert store["namespace_marker_keys"] == len(store["namespaces"]) >= 1
    assert not any(k.startswith("hicache-namespace_") for k in store["other_key_samples"])
    text = subprocess.run(
        [HICACHE, "inspect", "store", "--master", metrics], capture_output=True, text=True, timeout=60
    )
    assert text.returncode == 0 and "namespace extra_key 'tenant-b'" in text.stdout, text.stdout
    assert f"namespace markers {store['namespace_marker_keys']}" in text.stdout


def test_namespace_markers_round_trip_and_skip_other_keys():
    from hicache_ops.server.namespaces import MAX_MARKER_KEY, marker_key, parse_marker

    for ns in (("tenant-a", None), (None, "salt"), ('a,b "q" ü', "s")):
        assert parse_marker(marker_key(*ns)) == ns
    assert marker_key(None, None) is None and marker_key(None, "") is None
    assert marker_key("x" * MAX_MARKER_KEY, None) is None  # too long to write: not written
    assert parse_marker("hicache/tiny_abc_0_k") is None and parse_marker("hicache-namespace_zz") is None


def test_playbook_list_wraps_its_prose_at_the_terminal_width():
    """A real process at 80 columns (issue 26: lines up to 249 characters): every line fits, each
    playbook's name starts a line, nothing is cut."""
    proc = subprocess.run(
        [HICACHE, "playbook", "list"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    names = [p.name for p in list_playbooks()]
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == names
    assert "…" not in proc.stdout
