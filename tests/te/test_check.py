"""`hicache te check`: SGLang's shared Transfer Engine rule over a table of deployments.

Three references:
- the rule as docs/transfer-engine.md states it, for both versions: every row of TABLE;
- SGLang 0.5.23's own code, run here: its argparse and resolution pipeline (a tiny local model
  config, --device cpu), `maybe_init_shared_mooncake_transfer_engine` creating the real shared
  engine, and the real `MooncakeStore` constructor making its reuse decision against a real
  mooncake_master. Each row observes SGLang's decision positively: the store's Mooncake client is
  SGLang's own class with its setup() call noted on the way through, so reuse is SGLang's log line
  plus setup() given the shared engine (and the client then reporting the engine's session), and
  non-reuse is setup() called without an engine (the store starting its own). Only Mooncake's
  setup() may fail (a named RDMA device does not exist here); a failure before it fails the test.
  The engine is built with MOONCAKE_PROTOCOL=tcp so it initialises without
  RDMA; SGLang's decision never reads the engine's protocol. Rows whose SGLang start-up needs RDMA
  sysfs (PD with an IB device) are compared with the rule only;
- SGLang 0.5.14's own code runs in a child process: tests/te/test_check_0_5_14.py.
The --live path runs against a real master on loopback over TCP.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli_runner import hicache
from hicache_ops.cli.common.output import json_data
from hicache_ops.commands.te.report import check_reuse
from hicache_ops.commands.te.rule import REUSE_LOG_LINE, node_ranks, rdma_devices
from hicache_ops.errors import InputError
from hicache_ops.sglang.launch import parse_server_args

HICACHE = "--enable-hierarchical-cache --hicache-storage-backend mooncake"
MAP2 = '{"0": "mlx5_0", "1": "mlx5_1"}'
CLEAN_ENV = (
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
    "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH",
    "SGLANG_HICACHE_MOONCAKE_REUSE_TE",
    "MC_FORCE_TCP",
    "SGLANG_ONE_VISIBLE_DEVICE_PER_PROCESS",
)
# Values that make a real store set-up here quick and small; none of them enters the decision.
QUIET = {
    "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(16 << 20),
    "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
    "MC_STORE_CLIENT_SETUP_RETRIES": "1",
    "MC_RPC_TIMEOUT_MS": "2000",
    "MC_RPC_CONNECT_TIMEOUT_MS": "1000",
    "MC_TCP_BIND_ADDRESS": "127.0.0.1",
    "GLOG_minloglevel": "2",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in CLEAN_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@dataclass
class Row:
    id: str
    flags: str = HICACHE
    env: dict = field(default_factory=dict)
    extra: dict | None = None  # --hicache-storage-backend-extra-config ({master} filled in)
    file: dict | None = None  # SGLANG_HICACHE_MOONCAKE_CONFIG_PATH contents ({master} filled in)
    eligible: dict = field(default_factory=dict)  # version -> bool
    failing: dict = field(default_factory=dict)  # version -> set of failing condition names
    ranks: list | None = None  # per rank eligibility, in node_ranks order (both versions)
    why: str | None = None  # a phrase the failing condition's why must hold
    sglang: bool = True  # compare with SGLang 0.5.23's own decision

    def both(self, eligible: bool, failing: set = frozenset()) -> Row:
        self.eligible = {"0.5.14": eligible, "0.5.23": eligible}
        self.failing = {"0.5.14": set(failing), "0.5.23": set(failing)}
        return self


MASTER = "{master}"
TABLE = [
    Row("default-env", env={"MOONCAKE_MASTER": MASTER}, why='"" == None is false').both(False, {"device_name_matches"}),
    Row(
        "ib-flag-matches-MOONCAKE_DEVICE",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0"},
    ).both(True),
    Row(
        "mooncake-ib-device-flag-is-the-fallback",
        flags=HICACHE + " --mooncake-ib-device mlx5_0",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0"},
    ).both(True),
    Row("MC_FORCE_TCP=1", env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "1"}).both(True),
    Row("MC_FORCE_TCP=true-is-not-1", env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "true"}).both(
        False, {"device_name_matches"}
    ),
    Row(
        "MC_FORCE_TCP-drops-the-ib-device",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0", "MC_FORCE_TCP": "1"},
        why='the engine passes ""',
    ).both(False, {"device_name_matches"}),
    Row(
        "http-metadata",
        env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "1", "MOONCAKE_TE_META_DATA_SERVER": "{http_metadata}"},
    ).both(False, {"metadata_server_p2phandshake"}),
    Row("tcp-protocol", env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "1", "MOONCAKE_PROTOCOL": "tcp"}).both(
        False, {"protocol_rdma"}
    ),
    Row(
        "REUSE_TE=false",
        env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "1", "SGLANG_HICACHE_MOONCAKE_REUSE_TE": "false"},
    ).both(False, {"shared_engine_exists"}),
    Row(
        "REUSE_TE=false-but-PD-mooncake_tcp-makes-one",
        flags=HICACHE
        + " --disaggregation-mode prefill --disaggregation-transfer-backend mooncake_tcp --disaggregation-ib-device "
        "mlx5_0",
        env={"MOONCAKE_MASTER": MASTER, "SGLANG_HICACHE_MOONCAKE_REUSE_TE": "false"},
    ).both(True),
    Row(
        "per-rank-json-map-on-both-sides",
        flags=HICACHE + ' --tp-size 2 --base-gpu-id 2 --disaggregation-ib-device \'{"2": "mlx5_0", "3": "mlx5_1"}\'',
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": MAP2},
        ranks=[True, True],
    ).both(True),
    Row(
        "per-rank-json-map-store-only",
        flags=HICACHE + " --tp-size 2",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": MAP2},
        ranks=[False, False],
    ).both(False, {"device_name_matches"}),
    Row(
        "per-rank-json-map-swapped",
        flags=HICACHE + ' --tp-size 2 --disaggregation-ib-device \'{"0": "mlx5_1", "1": "mlx5_0"}\'',
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": MAP2},
        ranks=[False, False],
    ).both(False, {"device_name_matches"}),
    Row(
        "per-rank-json-map-missing-rank",
        flags=HICACHE + f" --tp-size 2 --disaggregation-ib-device '{MAP2}'",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": '{"0": "mlx5_0"}'},
        ranks=[True, False],
    ).both(False, {"device_name_matches"}),
    Row(
        "dp-attention-keys-the-store-map-by-attention-tp-rank",
        flags=HICACHE + f" --tp-size 2 --attn-dp-size 2 --disaggregation-ib-device '{MAP2}'",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": '{"0": "mlx5_0"}'},
        ranks=[True, False],
    ).both(False, {"device_name_matches"}),
    Row(
        "device-name-whitespace",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0 "},
    ).both(False, {"device_name_matches"}),
    Row(
        "extra-config-wins-over-file-and-env",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        extra={"master_server_address": MASTER, "device_name": "mlx5_0"},
        file={"master_server_address": MASTER, "device_name": "mlx5_1"},
        env={"MOONCAKE_DEVICE": "mlx5_2"},
    ).both(True),
    Row(
        "file-wins-over-env",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        file={"master_server_address": MASTER, "device_name": "mlx5_1"},
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0"},
    ).both(False, {"device_name_matches"}),
    Row(
        "extra-config-without-master-falls-to-the-file",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        extra={"device_name": "mlx5_0"},
        file={"master_server_address": MASTER, "device_name": "mlx5_1"},
    ).both(False, {"device_name_matches"}),
    Row(
        "file-omitting-device-takes-the-default-not-the-env",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        file={"master_server_address": MASTER},
        env={"MOONCAKE_DEVICE": "mlx5_0"},
    ).both(False, {"device_name_matches"}),
    Row(
        "file-omitting-protocol",
        file={"master_server_address": MASTER},
        env={"MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"},
        eligible={"0.5.14": True, "0.5.23": False},
        failing={"0.5.14": set(), "0.5.23": {"protocol_rdma"}},
    ),
    Row(
        "engine-on-tcp-store-says-rdma",
        flags=HICACHE + " --disaggregation-ib-device mlx5_0",
        file={"master_server_address": MASTER, "protocol": "rdma", "device_name": "mlx5_0"},
        env={"MOONCAKE_PROTOCOL": "tcp"},
    ).both(True),
    Row(
        "elastic-ep-mooncake-makes-an-engine-in-0.5.23",
        flags=HICACHE + " --elastic-ep-backend mooncake",
        env={"MOONCAKE_MASTER": MASTER, "MC_FORCE_TCP": "1", "SGLANG_HICACHE_MOONCAKE_REUSE_TE": "false"},
        eligible={"0.5.14": False, "0.5.23": True},
        failing={"0.5.14": {"shared_engine_exists"}, "0.5.23": set()},
    ),
    Row(
        "pd-normalises-the-ib-list",
        flags=HICACHE + " --disaggregation-mode decode --disaggregation-ib-device 'mlx5_0, mlx5_1'",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0,mlx5_1"},
        sglang=False,
    ).both(True),
    Row(
        "pd-normalises-so-spaces-no-longer-match",
        flags=HICACHE + " --disaggregation-mode decode --disaggregation-ib-device 'mlx5_0, mlx5_1'",
        env={"MOONCAKE_MASTER": MASTER, "MOONCAKE_DEVICE": "mlx5_0, mlx5_1"},
        sglang=False,
    ).both(False, {"device_name_matches"}),
]


def _fill(value, master: str, http_metadata: str):
    if isinstance(value, str):
        return value.replace("{master}", master).replace("{http_metadata}", http_metadata)
    if isinstance(value, dict):
        return {k: _fill(v, master, http_metadata) for k, v in value.items()}
    return value


def materialise(
    row: Row,
    tmp_path: Path,
    master: str = "127.0.0.1:50051",
    http_metadata: str = "http://127.0.0.1:8080/metadata",
    small: bool = False,
):
    """(server args string, env dict) for a row; the file row is written under tmp_path.

    `small` adds a 16 MiB global_segment_size to the extra-config and the file (a real store
    set-up mounts it); the size is not part of the rule.
    """
    env = _fill(dict(row.env), master, http_metadata)
    flags = row.flags
    size = {"global_segment_size": 16 << 20} if small else {}
    if row.extra is not None:
        extra = {**_fill(row.extra, master, http_metadata), **size}
        flags += " --hicache-storage-backend-extra-config " + shlex.quote(json.dumps(extra))
    if row.file is not None:
        path = tmp_path / f"mooncake-{row.id}.json"
        path.write_text(json.dumps({**_fill(row.file, master, http_metadata), **size}))
        env["SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"] = str(path)
    return flags, env


# ---------------------------------------------------------------------------------------------
# The table against the rule (both versions)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("row", TABLE, ids=[r.id for r in TABLE])
def test_table_against_the_rule(row: Row, version: str, tmp_path):
    flags, env = materialise(row, tmp_path)
    if version == "0.5.14" and "--attn-dp-size" in flags:
        flags = flags.replace("--attn-dp-size 2", "--dp-size 2 --enable-dp-attention")
    report = check_reuse(version, server_args=flags, env=env)
    failing = {c.name for c in report.conditions if not c.ok}
    assert report.eligible is row.eligible[version], (failing, [c.why for c in report.conditions])
    assert failing == row.failing[version]
    if row.ranks is not None:
        assert [r.eligible for r in report.ranks] == row.ranks
    if row.why:
        assert any(row.why in c.why for c in report.conditions if not c.ok)
    data = json_data(report.result())
    assert [set(c) for c in data["conditions"]] == [{"name", "ok", "actual", "expected", "why"}] * 4
    if report.eligible:
        assert data["fix"] is None
    else:
        fix = data["fix"]
        assert fix["verified"] is True and fix["changes"] and fix["summary"]
        assert "optimisation" in fix["matters"]


def test_default_env_explains_the_empty_string_versus_none(tmp_path):
    report = check_reuse("0.5.23", env={"MOONCAKE_MASTER": "10.0.0.1:50051"})
    dev = report.conditions[1]
    assert (dev.actual, dev.expected) == ("", None)
    assert '"" == None is false' in dev.why
    assert report.server_args_assumed and report.conditions[0].ok
    changes = json_data(report.fix)["changes"]
    assert {c["name"] for c in changes} == {"MOONCAKE_DEVICE", "disaggregation_ib_device"}
    assert "MC_FORCE_TCP=1" in json_data(report.fix)["alternative"]  # for TCP-only deployments only


def test_fixes_name_the_source_that_really_holds_the_value(tmp_path):
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({"master_server_address": "10.0.0.1:50051", "device_name": "mlx5_1"}))
    report = check_reuse(
        "0.5.23",
        server_args=HICACHE + " --disaggregation-ib-device mlx5_0",
        env={"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path)},
    )
    assert json_data(report.fix)["changes"] == [
        {
            "kind": "config",
            "name": "device_name",
            "value": "mlx5_0",
            "text": f'set "device_name": "mlx5_0" in the Mooncake config file {path}',
        }
    ]
    # tcp deployments: keep TCP with MC_FORCE_TCP=1 and protocol "rdma"
    report = check_reuse("0.5.23", env={"MOONCAKE_MASTER": "10.0.0.1:50051", "MOONCAKE_PROTOCOL": "tcp"})
    names = [c["name"] for c in json_data(report.fix)["changes"]]
    assert names == ["MOONCAKE_PROTOCOL", "MC_FORCE_TCP"] and json_data(report.fix)["verified"]
    # per-rank store map without an IB flag: the same devices keyed by GPU id
    report = check_reuse(
        "0.5.23",
        server_args=HICACHE + " --tp-size 2 --base-gpu-id 4",
        env={"MOONCAKE_MASTER": "10.0.0.1:50051", "MOONCAKE_DEVICE": MAP2},
    )
    assert json_data(report.fix)["changes"][0]["value"] == '{"4":"mlx5_0","5":"mlx5_1"}'
    # DP attention: two ranks share storage tp rank 0, so the fix goes to the flag
    report = check_reuse(
        "0.5.23",
        server_args=HICACHE + f" --tp-size 2 --attn-dp-size 2 --disaggregation-ib-device '{MAP2}'",
        env={"MOONCAKE_MASTER": "10.0.0.1:50051", "MOONCAKE_DEVICE": '{"0": "mlx5_0"}'},
    )
    assert (
        json_data(report.fix)["changes"][0]["name"] == "disaggregation_ib_device" and json_data(report.fix)["verified"]
    )


def test_warnings_for_what_sglang_does_silently(tmp_path):
    report = check_reuse(
        "0.5.23",
        env={"MOONCAKE_MASTER": "1.2.3.4:5", "MC_FORCE_TCP": "yes", "SGLANG_HICACHE_MOONCAKE_REUSE_TE": "maybe"},
    )
    text = " ".join(report.warnings)
    assert 'compares it with "1" exactly' in text and "not a boolean" in text
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"master_server_address": "1.2.3.4:5", "protocol": "rdma"}))
    report = check_reuse(
        "0.5.23",
        env={"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path), "MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"},
    )
    assert report.eligible and any("does not compare them" in w for w in report.warnings)


# ---------------------------------------------------------------------------------------------
# Bad input (library)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        ({"server_args": HICACHE + " --tp-size '2"}, "not valid shell words"),
        ({"server_args": HICACHE + " --tp-size two"}, "not an integer"),
        ({"server_args": HICACHE + " --disaggregation-ib-device"}, "has no value"),
        ({"server_args": HICACHE + " --disaggregation-mode both"}, "is not one of"),
        ({"server_args": HICACHE + " --encoder-only --language-only"}, "contradict"),
        ({"server_args": "--enable-hierarchical-cache"}, "lack --hicache-storage-backend mooncake"),
        ({"server_args": HICACHE + " --hicache-storage-backend file"}, "no Mooncake store"),
        ({"server_args": HICACHE + " --hicache-storage-backend-extra-config '{bad'"}, "not valid JSON"),
        ({"server_args": HICACHE + " --hicache-storage-backend-extra-config '[1]'"}, "must be a JSON object"),
        ({"server_args": HICACHE + ' --disaggregation-ib-device \'{"0": "mlx5_0"}\' --tp-size 2'}, "runs on GPU 1"),
        ({"server_args": HICACHE + " --disaggregation-ib-device '{nope'"}, "not valid JSON"),
        ({"server_args": HICACHE + " --disaggregation-ib-device /nowhere/ib.json"}, "does not exist here"),
        ({"server_args": HICACHE + " --tp-size 3 --attn-dp-size 2"}, "not divisible"),
        ({"env": {"MOONCAKE_MASTER": "1.2.3.4:5", "MOONCAKE_TE_META_DATA_SERVER": "redis://10.0.0.1:6379"}}, "Redis"),
        ({"env": {"MOONCAKE_MASTER": "1.2.3.4:5", "MOONCAKE_TE_META_DATA_SERVER": "p2phandshake"}}, "misspelt"),
        ({"env": {}}, "no Mooncake config"),
        ({"extra_config": '{"master_server_address": "1.2.3.4:5", "device_name": null}'}, "TypeError"),
        ({"extra_config": '{"master_server_address": "1.2.3.4:5", "device_name": "{\\"0\\": 7}"}'}, "not a string"),
    ],
)
def test_bad_input_is_one_sentence(kwargs, phrase):
    kwargs.setdefault("env", {"MOONCAKE_MASTER": "1.2.3.4:5"})
    with pytest.raises(InputError) as err:
        check_reuse("0.5.23", **kwargs)
    assert phrase in err.value.message
    assert "\n" not in err.value.message


def test_version_specific_flags():
    with pytest.raises(InputError, match="0.5.14 has no --enable-hicache"):
        check_reuse(
            "0.5.14",
            server_args="--enable-hicache --hicache-storage-backend mooncake",
            env={"MOONCAKE_MASTER": "1.2.3.4:5"},
        )
    with pytest.raises(InputError, match="older than 0.5.14"):
        check_reuse("0.5.9", env={"MOONCAKE_MASTER": "1.2.3.4:5"})


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def invoke(*args: str, env: dict | None = None):
    return hicache(["te", "check", *args], env=env)


def test_human_output_leads_with_the_verdict_and_wraps_its_prose():
    """A real process at 100 columns: line 1 is the answer; no line (the long `why:` and `does it
    matter?` sentences included) is wider than the terminal, and no word is lost to the wrapping."""
    env = {**os.environ, "COLUMNS": "100", "MOONCAKE_MASTER": "1.2.3.4:5"}
    for args, verdict in ((["--env", "MC_FORCE_TCP=1"], "verdict: reused"), ([], "verdict: not reused")):
        run = subprocess.run(
            [sys.executable, "-m", "hicache_ops.cli", "te", "check", "--sglang-version", "0.5.23", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        lines = run.stdout.splitlines()
        assert lines[0].startswith(verdict), run.stdout
        for line in lines + run.stderr.splitlines():
            assert len(line) <= 100 and line == line.rstrip(), repr(line)
        data = json.loads(
            subprocess.run(
                [sys.executable, "-m", "hicache_ops.cli", "te", "check", "--sglang-version", "0.5.23", *args, "--json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            ).stdout
        )
        flat = " ".join(run.stdout.split())
        for cond in data["conditions"]:
            assert " ".join(cond["why"].split()) in flat
        if data["fix"]:
            assert " ".join(data["fix"]["matters"].split()) in flat


def test_cli_exit_codes_and_json_shape(tmp_path):
    ok = invoke("--json", "--sglang-version", "0.5.23", env={"MOONCAKE_MASTER": "1.2.3.4:5", "MC_FORCE_TCP": "1"})
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["eligible"] is True and data["fix"] is None
    assert [c["name"] for c in data["conditions"]] == [
        "shared_engine_exists",
        "device_name_matches",
        "metadata_server_p2phandshake",
        "protocol_rdma",
    ]
    bad = invoke("--json", "--sglang-version", "0.5.23", env={"MOONCAKE_MASTER": "1.2.3.4:5"})
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["eligible"] is False and data["fix"]["verified"] is True
    assert data["conditions"][1]["actual"] == "" and data["conditions"][1]["expected"] is None
    human = invoke("--sglang-version", "0.5.23", env={"MOONCAKE_MASTER": "1.2.3.4:5"})
    assert human.exit_code == 1
    assert "verdict: not reused" in human.stdout and "does it matter?" in human.stdout
    assert "device_name_matches" in human.stdout and "why:" in human.stdout
    per_rank = invoke(
        "--server-args",
        HICACHE + " --tp-size 2",
        "--env",
        f"MOONCAKE_DEVICE={MAP2}",
        "--sglang-version",
        "0.5.23",
        env={"MOONCAKE_MASTER": "1.2.3.4:5"},
    )
    assert per_rank.exit_code == 1 and "per rank" in per_rank.stdout
    assert per_rank.stdout.startswith("verdict: not reused"), per_rank.stdout
    one = invoke(
        "--server-args",
        HICACHE + " --tp-size 2",
        "--env",
        f"MOONCAKE_DEVICE={MAP2}",
        "--tp-rank",
        "1",
        "--json",
        "--sglang-version",
        "0.5.23",
        env={"MOONCAKE_MASTER": "1.2.3.4:5"},
    )
    data = json.loads(one.stdout)
    assert [r["rank"] for r in data["ranks"]] == ["tp1"] and data["conditions"][1]["actual"] == "mlx5_1"


def test_cli_config_file_and_extra_config(tmp_path):
    path = tmp_path / "mc.json"
    path.write_text(json.dumps({"master_server_address": "1.2.3.4:5", "device_name": "mlx5_0"}))
    res = invoke(
        "--config",
        str(path),
        "--server-args",
        HICACHE + " --disaggregation-ib-device mlx5_0",
        "--json",
        "--sglang-version",
        "0.5.23",
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["store_config"]["origin"] == "file"
    res = invoke(
        "--extra-config",
        '{"master_server_address": "1.2.3.4:5", "device_name": "mlx5_1"}',
        "--config",
        str(path),
        "--server-args",
        HICACHE + " --disaggregation-ib-device mlx5_0",
        "--json",
        "--sglang-version",
        "0.5.23",
    )
    assert res.exit_code == 1 and json.loads(res.stdout)["store_config"]["origin"] == "extra_config"


@pytest.mark.parametrize(
    "args, env, phrase",
    [
        (["--server-args", HICACHE + " '--tp-size"], {}, "not valid shell words"),
        (["--extra-config", "{nope"], {}, "not valid JSON"),
        (["--sglang-version", "0.4.0"], {}, "SGLang 0.4.0 is older than 0.5.14"),
        (["--server-args", HICACHE + " --encoder-only --disaggregation-mode prefill"], {}, "contradicts"),
        (["--tcp"], {}, "only apply with --live"),
        (["--master-rpc", "127.0.0.1:1"], {}, "only apply with --live"),
        (["--config", "/a.json"], {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "/b.json"}, "contradicts"),
        (
            [
                "--extra-config",
                '{"master_server_address": "1.2.3.4:5"}',
                "--server-args",
                HICACHE + ' --hicache-storage-backend-extra-config \'{"master_server_address": "5.6.7.8:9"}\'',
            ],
            {},
            "differ",
        ),
        (["--env", "NOEQUALS"], {}, "NAME=VALUE"),
        ([], {"MOONCAKE_TE_META_DATA_SERVER": "redis://x:1"}, "Redis"),
        (["--live", "--timeout", "0"], {}, "must be positive"),
    ],
)
def test_cli_bad_input_exits_2_with_one_sentence(args, env, phrase):
    res = invoke(*args, "--json", env={"MOONCAKE_MASTER": "1.2.3.4:5", **env})
    assert res.exit_code == 2, res.output
    error = json.loads(res.stdout)["error"]
    assert phrase in error["message"] and error["code"] == "input_error"
    human = invoke(*args, env={"MOONCAKE_MASTER": "1.2.3.4:5", **env})
    assert human.exit_code == 2 and "Traceback" not in human.output


def test_help_imports_no_torch_mooncake_or_sglang():
    code = (
        "import sys; from hicache_ops.cli.main import app; from typer.testing import CliRunner; "
        "r = CliRunner().invoke(app, ['te', 'check', '--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('torch', 'mooncake', 'sglang') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# --live: a real master on loopback, TCP
# ---------------------------------------------------------------------------------------------


def test_live_against_the_session_master_over_tcp(mooncake_master):
    res = invoke(
        "--live",
        "--tcp",
        "--master-rpc",
        mooncake_master.rpc_address,
        "--json",
        "--sglang-version",
        "0.5.23",
        env={"MOONCAKE_MASTER": "10.9.9.9:50051"},
    )
    data = json.loads(res.stdout)
    assert res.exit_code == 1, res.output  # the default deployment is not reused; the live path still works
    live = data["live"]
    assert live["ok"] and live["uses_shared_engine"] and not live["embedded_master"]
    assert live["store"]["hostname"] == live["engine"]["session"]
    assert [t["ok"] for t in live["transfers"]] == [True, True]
    assert all(t["bytes"] == 1 << 20 for t in live["transfers"])


def test_live_with_an_embedded_master_when_forced_tcp():
    res = invoke("--live", "--sglang-version", "0.5.23", env={"MOONCAKE_MASTER": "10.9.9.9:50051", "MC_FORCE_TCP": "1"})
    assert res.exit_code == 0, res.output
    assert "live transfer ok" in res.stdout and "(embedded)" in res.stdout and "the engine passed in" in res.stdout


def test_live_master_unreachable_exits_3_fast():
    from hicache_ops.mooncake.net import free_port

    started = time.monotonic()
    res = invoke(
        "--live",
        "--tcp",
        "--master-rpc",
        f"127.0.0.1:{free_port()}",
        "--json",
        "--sglang-version",
        "0.5.23",
        env={"MOONCAKE_MASTER": "10.9.9.9:50051"},
    )
    assert res.exit_code == 3, res.output
    assert json.loads(res.stdout)["error"]["code"] == "unreachable"
    assert time.monotonic() - started < 10


def test_live_against_a_silent_master_exits_3_within_the_timeout(fresh_mooncake_master, freeze_process):
    """A master that accepts connections but answers nothing is unreachable (exit 3), not a failed test (1)."""
    freeze_process(fresh_mooncake_master.pid)
    started = time.monotonic()
    res = invoke(
        "--live",
        "--tcp",
        "--master-rpc",
        fresh_mooncake_master.rpc_address,
        "--timeout",
        "10",
        "--json",
        "--sglang-version",
        "0.5.23",
        env={"MOONCAKE_MASTER": "10.9.9.9:50051"},
    )
    assert res.exit_code == 3, res.output
    assert fresh_mooncake_master.rpc_address in json.loads(res.stdout)["error"]["message"]
    assert time.monotonic() - started < 10 + 5


@pytest.mark.skipif(bool(rdma_devices()), reason="this machine has RDMA devices")
def test_live_rdma_without_rdma_hardware_says_so_and_offers_tcp():
    res = invoke("--live", "--json", "--sglang-version", "0.5.23", env={"MOONCAKE_MASTER": "10.9.9.9:50051"})
    assert res.exit_code == 2
    error = json.loads(res.stdout)["error"]
    assert "no RDMA device" in error["message"] and "--tcp" in error["hint"]


# ---------------------------------------------------------------------------------------------
# SGLang 0.5.23's own code
# ---------------------------------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def sglang_rt(tmp_path_factory):
    """SGLang's runtime pieces, a tiny local model config and a master with HTTP metadata."""
    pytest.importorskip("sglang")
    from importlib.metadata import version

    if version("sglang") != "0.5.23":
        pytest.skip("the cross-check needs sglang 0.5.23")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as te_mod
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.mooncake_store import mooncake_store as store_mod
    from sglang.srt.runtime_context import get_context, get_disagg, get_exec
    from sglang.srt.server_args import ServerArgs

    from hicache_ops.mooncake.master import EmbeddedMaster

    model = tmp_path_factory.mktemp("tiny-model")
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 256,
                "max_position_embeddings": 512,
                "rms_norm_eps": 1e-5,
                "torch_dtype": "bfloat16",
            }
        )
    )
    from mooncake.store import MooncakeDistributedStore

    class NotedClient(MooncakeDistributedStore):
        """Mooncake's client class as SGLang builds it; setup() notes its hostname and engine, then runs."""

        setups: list[dict] = []

        def setup(self, *args, **kwargs):
            # SGLang's call: (hostname, metadata_server, segment, buffer, protocol, device, master, engine)
            call = {"hostname": args[0], "engine": args[7] if len(args) > 7 else kwargs.get("transfer_engine")}
            NotedClient.setups.append(call)
            try:
                call["rc"] = super().setup(*args, **kwargs)
            except Exception as exc:
                call["raised"] = exc
                raise
            return call["rc"]

    master = EmbeddedMaster(http_metadata=True)
    master.start()
    lines = _Lines()
    store_logger = logging.getLogger(store_mod.__name__)
    store_logger.addHandler(lines)
    old_level = store_logger.level
    store_logger.setLevel(logging.INFO)
    ns = dict(
        te_mod=te_mod,
        store_mod=store_mod,
        HiCacheStorageConfig=HiCacheStorageConfig,
        ServerArgs=ServerArgs,
        get_context=get_context,
        get_disagg=get_disagg,
        get_exec=get_exec,
        model=str(model),
        master=master,
        lines=lines,
        NotedClient=NotedClient,
    )
    try:
        yield ns
    finally:
        store_logger.removeHandler(lines)
        store_logger.setLevel(old_level)
        te_mod._mooncake_transfer_engine = None
        master.stop()


def _sglang_resolve(rt, flags: str):
    """SGLang's own argparse + resolution pipeline, published as the runtime context."""
    import argparse

    parser = argparse.ArgumentParser()
    rt["ServerArgs"].add_cli_args(parser)
    ns = parser.parse_args(["--model-path", rt["model"], "--device", "cpu", *shlex.split(flags)])
    server_args = rt["ServerArgs"].from_cli_args(ns)
    server_args.resolve_once()
    rt["get_context"]().set_server_args(server_args)
    return ns


def _sglang_rank(rt, monkeypatch, rank, extra: dict | None, tp_size: int):
    """(engine exists, engine ib device, store reused) as SGLang decides them for one rank.

    Both answers are observed, never inferred from a failure: SGLang's store builds its Mooncake
    client from NotedClient, whose setup() call shows which path SGLang took
    (docs/transfer-engine.md#reuse-rule): the engine's session id and engine object (reuse, with the
    log line), or the config's local_hostname and no engine (a Transfer Engine of its own). Only
    Mooncake's setup() itself may fail here (a named RDMA device does not exist on this machine):
    any other failure fails the test.
    """
    te_mod = rt["te_mod"]
    noted = rt["NotedClient"]
    te_mod._mooncake_transfer_engine = None
    saved = os.environ.get("MOONCAKE_PROTOCOL")
    os.environ["MOONCAKE_PROTOCOL"] = "tcp"  # the engine initialises here; its protocol is not in the rule
    try:
        te_mod.maybe_init_shared_mooncake_transfer_engine(gpu_id=rank.gpu_id)
    except ImportError as exc:
        # --elastic-ep-backend mooncake hands the engine to mooncake.pg after creating it; this
        # wheel's mooncake.pg is built against another torch. The engine exists all the same.
        if "Mooncake PG" not in str(exc) and "mooncake.pg" not in str(exc):
            raise
    finally:
        if saved is None:
            os.environ.pop("MOONCAKE_PROTOCOL", None)
        else:
            os.environ["MOONCAKE_PROTOCOL"] = saved
    engine = te_mod.get_mooncake_transfer_engine()
    ib = engine.get_ib_device() if engine is not None else "<none>"
    lines = rt["lines"].lines
    lines.clear()
    noted.setups.clear()
    config = rt["HiCacheStorageConfig"](
        tp_rank=rank.store_tp_rank,
        tp_size=tp_size,
        pp_rank=rank.pp_rank,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="m",
        extra_config=dict(extra) if extra else None,
    )
    store_cls = rt["store_mod"].MooncakeStore
    monkeypatch.setattr(store_cls, "_import_mooncake_store", lambda self: noted)
    # Built in two steps so that the half-built store (its config) stays readable if __init__ raises.
    store = store_cls.__new__(store_cls)
    error = None
    try:
        store.__init__(config, None)
    except Exception as exc:
        error = exc
    try:
        assert len(noted.setups) == 1, f"{rank.label}: SGLang's store failed before setup(): {error!r}"
        call = noted.setups[0]
        logged = any(REUSE_LOG_LINE in line for line in lines)
        if error is not None:  # only Mooncake's setup may fail here: no RDMA device of that name
            assert call.get("raised") is error or call.get("rc", 0) != 0, (rank.label, error)
        if call["engine"] is not None:  # SGLang chose the shared engine
            assert engine is not None and call["hostname"] == engine.get_session_id(), rank.label
            assert logged, rank.label
            if error is None:
                assert store.store.get_hostname() == engine.get_session_id(), rank.label
            reused = True
        else:  # SGLang chose a Transfer Engine of its own
            assert call["hostname"] == store.config.local_hostname and not logged, rank.label
            reused = False
    finally:
        if error is None:
            store.store.close()
        te_mod._mooncake_transfer_engine = None
    return engine is not None, ib, reused


SGLANG_ROWS = [r for r in TABLE if r.sglang]


@pytest.mark.parametrize("row", SGLANG_ROWS, ids=[r.id for r in SGLANG_ROWS])
def test_table_against_sglang_0_5_23(row: Row, sglang_rt, clean_env, tmp_path):
    master = sglang_rt["master"]
    flags, env = materialise(row, tmp_path, master.rpc_address, master.metadata_server, small=True)
    for name, value in {**QUIET, **env}.items():
        clean_env.setenv(name, value)
    ours = check_reuse("0.5.23", server_args=flags)
    ns = _sglang_resolve(sglang_rt, flags)
    # our parse of the flags is SGLang's argparse's
    assert ours.args.disaggregation_ib_device == ns.disaggregation_ib_device
    assert ours.args.tp_size == ns.tp_size and ours.args.base_gpu_id == ns.base_gpu_id
    assert ours.args.disaggregation_transfer_backend == ns.disaggregation_transfer_backend
    # SGLang's own rewrites (mooncake_tcp) are ours
    if ns.disaggregation_transfer_backend == "mooncake_tcp":
        assert os.environ.get("MC_FORCE_TCP") == "1" and sglang_rt["get_disagg"]().disaggregation_ib_device is None
    extra = json.loads(ns.hicache_storage_backend_extra_config) if ns.hicache_storage_backend_extra_config else None
    for mine in ours.ranks:
        exists, ib, reused = _sglang_rank(sglang_rt, clean_env, mine.rank, extra, ours.args.tp_size)
        assert exists is ours.conditions[0].ok, mine.rank.label
        if exists:
            assert ib == mine.engine_ib_device, mine.rank.label
        assert reused is mine.eligible, (mine.rank.label, mine.store_device, mine.engine_ib_device)
    assert ours.eligible is all(r.eligible for r in ours.ranks)


def test_a_gpu_map_that_misses_a_rank_fails_in_sglang_and_here(sglang_rt, clean_env, tmp_path):
    for name, value in {**QUIET, "MOONCAKE_MASTER": sglang_rt["master"].rpc_address}.items():
        clean_env.setenv(name, value)
    flags = HICACHE + ' --tp-size 2 --disaggregation-ib-device \'{"0": "mlx5_0"}\''
    with pytest.raises(InputError, match="runs on GPU 1"):
        check_reuse("0.5.23", server_args=flags)
    _sglang_resolve(sglang_rt, flags)
    te_mod = sglang_rt["te_mod"]
    te_mod._mooncake_transfer_engine = None
    clean_env.setenv("MOONCAKE_PROTOCOL", "tcp")
    with pytest.raises(ValueError, match="No IB devices configured for GPU 1"):
        te_mod.maybe_init_shared_mooncake_transfer_engine(gpu_id=1)
    te_mod._mooncake_transfer_engine = None


@pytest.mark.parametrize(
    "flags",
    [
        HICACHE + " --tp-size 4",
        HICACHE + " --tp-size 2 --base-gpu-id 3 --gpu-id-step 2",
        HICACHE + " --tp-size 4 --pp-size 2 --nnodes 2 --node-rank 1",
        HICACHE + " --tp-size 4 --nnodes 2 --node-rank 1",
    ],
)
def test_rank_placement_is_sglangs(flags, sglang_rt):
    """GPU ids per rank: SGLang's _calculate_rank_ranges and compute_local_gpu_id."""
    from sglang.srt.entrypoints.engine import _calculate_rank_ranges
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.weight_cache.protocol import compute_local_gpu_id

    args = parse_server_args(flags, "0.5.23")
    _sglang_resolve(sglang_rt, flags)
    pp_range, tp_range, pp_per_node, tp_per_node = _calculate_rank_ranges(get_parallel().node_rank)
    theirs = [
        (pp, tp, compute_local_gpu_id(pp, tp, pp_per_node, tp_per_node, args.base_gpu_id, args.gpu_id_step))
        for pp in pp_range
        for tp in tp_range
    ]
    assert [(r.pp_rank, r.tp_rank, r.gpu_id) for r in node_ranks(args)] == theirs
