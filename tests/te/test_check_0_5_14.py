"""`hicache te check` for SGLang 0.5.14 against 0.5.14's own decision, row by row.

Every row of test_check.py's table that 0.5.23 is run on is run through SGLang 0.5.14's own code
in a child process (tests/sglang_0_5_14.py): its argparse and `ServerArgs` resolution (a tiny
local model config, --device cpu), `ModelRunner.init_shared_mooncake_transfer_engine` creating
the real shared engine for each rank's GPU, and the real `MooncakeStore.__init__` making its reuse
decision against a real mooncake_master. The decision is observed positively either way: the
arguments SGLang hands to Mooncake's `MooncakeDistributedStore.setup` (seen through a subclass
that records them and calls the real method) carry the shared engine and its session id when it
reuses, and no engine and the configured hostname when Mooncake is to create its own; reuse also
logs SGLang's "Reuse initialized ..." line. A store that crashes before that call fails the test;
after it, only Mooncake's own RDMA set-up may fail (this machine has no RDMA device).
The engine is created with MOONCAKE_PROTOCOL=tcp so it initialises without RDMA; SGLang's
decision never reads the engine's protocol.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from hicache_ops.commands.te.report import check_reuse
from hicache_ops.commands.te.rule import REUSE_LOG_LINE
from hicache_ops.mooncake.master import EmbeddedMaster
from sglang_0_5_14 import run_0_5_14


def _table_module():
    """test_check.py's table, one source for both versions (importlib mode: no sibling imports)."""
    spec = importlib.util.spec_from_file_location("te_check_table", Path(__file__).with_name("test_check.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_TABLE = _table_module()
CLEAN_ENV, QUIET, materialise = _TABLE.CLEAN_ENV, _TABLE.QUIET, _TABLE.materialise
ROWS = [r for r in _TABLE.TABLE if r.sglang]

SCRIPT = """
import argparse
import logging
import os
import shlex
import types

import mooncake.store as mooncake_store
from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as te_mod
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.mooncake_store import mooncake_store as store_mod
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs

SETUPS = []


class RecordingStore(mooncake_store.MooncakeDistributedStore):
    # Mooncake's real client; records what SGLang's decision hands it, then sets up for real.
    def setup(self, *args, **kwargs):
        hostname, protocol, device, engine = args[0], args[4], args[5], args[7]
        SETUPS.append({"hostname": hostname, "protocol": protocol, "device": device,
                       "engine_passed": engine is not None})
        return super().setup(*args, **kwargs)


mooncake_store.MooncakeDistributedStore = RecordingStore  # what MooncakeStore imports at __init__


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


LINES = Lines()
store_mod.logger.addHandler(LINES)
store_mod.logger.setLevel(logging.INFO)
os.environ["HF_HUB_OFFLINE"] = "1"
BASE_ENV = dict(os.environ)


def decide(row, rank):
    te_mod._mooncake_transfer_engine = None
    saved = os.environ.get("MOONCAKE_PROTOCOL")
    os.environ["MOONCAKE_PROTOCOL"] = "tcp"
    try:
        ModelRunner.init_shared_mooncake_transfer_engine(
            types.SimpleNamespace(server_args=row["server_args"], gpu_id=rank["gpu_id"]))
    finally:
        if saved is None:
            os.environ.pop("MOONCAKE_PROTOCOL", None)
        else:
            os.environ["MOONCAKE_PROTOCOL"] = saved
    engine = te_mod.get_mooncake_transfer_engine()
    LINES.lines.clear()
    SETUPS.clear()
    config = HiCacheStorageConfig(
        tp_rank=rank["store_tp_rank"], tp_size=row["tp_size"], pp_rank=rank["pp_rank"], pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="m", extra_config=row["extra"],
    )
    store, error = None, None
    try:
        store = store_mod.MooncakeStore(config, None)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if store is not None:
            store.store.close()
        te_mod._mooncake_transfer_engine = None
    return {
        "engine": engine is not None,
        "engine_ib": engine.get_ib_device() if engine is not None else None,
        "engine_session": engine.get_session_id() if engine is not None else None,
        "reuse_logged": any(PAYLOAD["reuse_line"] in line for line in LINES.lines),
        "setups": list(SETUPS),
        "error": error,
    }


RESULT = []
for row in PAYLOAD["rows"]:
    os.environ.clear()
    os.environ.update({k: v for k, v in BASE_ENV.items() if k not in PAYLOAD["clean_env"]})
    os.environ.update(row["env"])
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", PAYLOAD["model"], "--device", "cpu", *shlex.split(row["flags"])])
    row["server_args"] = ServerArgs.from_cli_args(ns)
    extra = row["server_args"].hicache_storage_backend_extra_config
    row["extra"] = json.loads(extra) if extra else None
    RESULT.append({
        "ib_device": row["server_args"].disaggregation_ib_device,
        "transfer_backend": row["server_args"].disaggregation_transfer_backend,
        "mc_force_tcp": os.environ.get("MC_FORCE_TCP"),
        "ranks": [decide(row, rank) for rank in row["ranks"]],
    })
"""


@pytest.fixture(scope="module")
def decisions(tmp_path_factory):
    """SGLang 0.5.14's decision for every row and rank, next to ours, from one child process."""
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
    master = EmbeddedMaster(http_metadata=True, log_path=tmp_path_factory.mktemp("master") / "mooncake_master.log")
    master.start()
    try:
        files = tmp_path_factory.mktemp("rows")
        ours, rows = [], []
        for row in ROWS:
            flags, env = materialise(row, files, master.rpc_address, master.metadata_server, small=True)
            flags = flags.replace("--attn-dp-size 2", "--dp-size 2 --enable-dp-attention")  # 0.5.14's spelling
            env = {**QUIET, **env}
            report = check_reuse("0.5.14", server_args=flags, env=env)
            ours.append(report)
            rows.append(
                {
                    "flags": flags,
                    "env": env,
                    "tp_size": report.args.tp_size,
                    "ranks": [
                        {"gpu_id": r.rank.gpu_id, "store_tp_rank": r.rank.store_tp_rank, "pp_rank": r.rank.pp_rank}
                        for r in report.ranks
                    ],
                }
            )
        payload = {"rows": rows, "model": str(model), "clean_env": list(CLEAN_ENV), "reuse_line": REUSE_LOG_LINE}
        theirs = run_0_5_14(SCRIPT, payload, timeout=600)
    finally:
        master.stop()
    return dict(zip((r.id for r in ROWS), zip(ours, theirs, strict=True), strict=True))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_table_against_sglang_0_5_14(row, decisions):
    ours, theirs = decisions[row.id]
    assert ours.eligible is row.eligible["0.5.14"]  # the table's expectation is the one compared below
    # SGLang's own rewrites (mooncake_tcp) are ours
    if theirs["mc_force_tcp"] == "1" and "mooncake_tcp" in row.flags:
        assert theirs["transfer_backend"] == "mooncake" and theirs["ib_device"] is None
    assert len(theirs["ranks"]) == len(ours.ranks) > 0
    for mine, sglang in zip(ours.ranks, theirs["ranks"], strict=True):
        label = mine.rank.label
        assert sglang["engine"] is ours.conditions[0].ok, label
        if sglang["engine"]:
            assert sglang["engine_ib"] == mine.engine_ib_device, label
        # SGLang decided: it called Mooncake's setup exactly once, whatever came after.
        assert len(sglang["setups"]) == 1, (label, sglang["error"])
        (setup,) = sglang["setups"]
        if mine.eligible:  # reuse: the shared engine and its session id go to Mooncake, and SGLang says so
            assert setup["engine_passed"] and sglang["reuse_logged"], (label, setup)
            assert setup["hostname"] == sglang["engine_session"], label
        else:  # its own engine: no engine handed over, the configured hostname, no reuse line
            assert not setup["engine_passed"] and not sglang["reuse_logged"], (label, setup)
            assert setup["hostname"] != sglang["engine_session"], label
        assert setup["device"] == mine.store_device, label
        if sglang["error"] is not None:  # only Mooncake's own RDMA set-up may fail here, after the decision
            assert sglang["error"].startswith("RuntimeError: Failed to setup Mooncake store"), (label, sglang["error"])
            assert setup["protocol"] == "rdma", label
