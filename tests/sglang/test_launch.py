"""The one SGLang launch parser (`hicache_ops.sglang.launch`) against SGLang's own code.

SGLang 0.5.23 (installed) and 0.5.14 (its real code in a child process, tests/sglang_0_5_14.py)
provide the flag names, the argparse behaviour (abbreviations, refusing unknown flags) and the
extra-config file reader that the parser must agree with.
"""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

from cli_runner import hicache
from hicache_ops.errors import InputError
from hicache_ops.sglang.flag_names import SGLANG_FLAGS
from hicache_ops.sglang.launch import _READ_FLAGS, load_extra_config, parse_server_args, resolve_flag
from sglang_0_5_14 import run_0_5_14

HICACHE = "--enable-hierarchical-cache --hicache-storage-backend mooncake"
FLAG_NAMES_SCRIPT = """
import argparse
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
RESULT = sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help")
"""


def sglang_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's launch parser, as prepare_server_args builds it."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


# --- flag names ----------------------------------------------------------------------------------


def test_flag_names_are_sglangs_own_for_both_versions():
    parser = sglang_parser()
    ours = {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert SGLANG_FLAGS["0.5.23"] == ours
    assert SGLANG_FLAGS["0.5.14"] == set(run_0_5_14(FLAG_NAMES_SCRIPT))
    every = SGLANG_FLAGS["0.5.14"] | SGLANG_FLAGS["0.5.23"]
    assert set(_READ_FLAGS) <= every  # each flag read here is one SGLang has


def test_flags_read_here_match_sglangs_argparse():
    flags = (
        HICACHE + ' --tp 4 --pp-size=2 --disaggregation-ib \'{"0": "mlx5_0"}\' --base-gpu-id 1'
        " --model-path Qwen/Qwen3-0.6B --mem-fraction-static 0.8 --enable-dp-attention --dp-size 2"
    )
    ours = parse_server_args(flags, "0.5.23")
    theirs = sglang_parser().parse_args(shlex.split(flags))
    assert (
        (ours.tp_size, ours.pp_size, ours.base_gpu_id)
        == (theirs.tp_size, theirs.pp_size, theirs.base_gpu_id)
        == (4, 2, 1)
    )
    assert ours.disaggregation_ib_device == theirs.disaggregation_ib_device == '{"0": "mlx5_0"}'
    assert ours.enable_hierarchical_cache and ours.warnings == []  # `--tp` is argparse's abbreviation of --tp-size


@pytest.mark.parametrize(
    "flag, suggestion",
    [
        ("--disaggregaton-ib-device", "--disaggregation-ib-device"),
        ("--mooncake-ib-devices", "--mooncake-ib-device"),
        ("--enable-hierachical-cache", "--enable-hierarchical-cache"),
    ],
)
def test_an_unknown_flag_is_a_warning_naming_the_closest(flag, suggestion):
    args = parse_server_args(f"{HICACHE} {flag} mlx5_0", "0.5.23")
    (warning,) = args.warnings
    assert flag in warning and f"did you mean {suggestion}?" in warning
    assert args.disaggregation_ib_device is None and args.mooncake_ib_device is None  # ignored, as the warning says
    with pytest.raises(SystemExit):  # "SGLang refuses to start on it": its argparse does
        sglang_parser().parse_args(shlex.split(f"--model-path m {flag} mlx5_0"))


def test_an_ambiguous_prefix_is_a_warning_and_another_versions_flag_says_so():
    _, warning = resolve_flag("--hicache-storage-p", "0.5.23")
    assert "ambiguous" in warning and "--hicache-storage-prefetch-policy" in warning
    with pytest.raises(SystemExit):
        sglang_parser().parse_args(["--model-path", "m", "--hicache-storage-p", "x"])
    args = parse_server_args(HICACHE + " --allowed-media-domains x", "0.5.14")  # a flag 0.5.23 added
    assert "SGLang 0.5.14 has no flag --allowed-media-domains (SGLang 0.5.23 has it)" in args.warnings[0]
    with pytest.raises(InputError, match="0.5.14 has no --enable-hicache"):
        parse_server_args("--enable-hicache", "0.5.14")


def test_server_args_from_a_file_with_a_launcher_prefix_and_comments(tmp_path):
    path = tmp_path / "launch.sh"
    path.write_text(
        "python -m sglang.launch_server --model-path Qwen/Qwen3-0.6B \\\n"
        "  --enable-hierarchical-cache --hicache-storage-backend mooncake  # L3\n"
        "  --tp-size=2 --disaggregation-ib-device mlx5_0\n"
    )
    args = parse_server_args(f"@{path}", "0.5.23")
    assert (args.tp_size, args.disaggregation_ib_device, args.enable_hierarchical_cache) == (2, "mlx5_0", True)
    assert parse_server_args(str(path), "0.5.23").tp_size == 2
    listed = tmp_path / "args.json"
    listed.write_text(json.dumps(["--enable-hicache", "--hicache-storage-backend", "mooncake", "--tp-size", "4"]))
    assert parse_server_args(f"@{listed}", "0.5.23").tp_size == 4


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("--tp-size '2", "not valid shell words"),
        ("--tp-size two", "not an integer"),
        ("--tp-size", "has no value"),
        ("--encoder-only=1", "takes no value"),
        ("--tp-size 3 --attn-dp-size 2", "not divisible"),
        ("@/no/such/args", "does not exist"),
    ],
)
def test_bad_flags_are_one_sentence(text, phrase):
    with pytest.raises(InputError) as err:
        parse_server_args(text, "0.5.23")
    assert phrase in err.value.message and "\n" not in err.value.message


# --- extra-config --------------------------------------------------------------------------------

CONFIG = {
    "master_server_address": "10.0.0.1:50051",
    "protocol": "rdma",
    "device_name": "mlx5_0",
    "global_segment_size": 4294967296,
    "extra_backend_tag": "t",
}
WRITERS = {
    ".json": json.dumps,
    ".toml": lambda d: "".join(f"{k} = {json.dumps(v)}\n" for k, v in d.items()),
    ".yaml": lambda d: "".join(f"{k}: {json.dumps(v)}\n" for k, v in d.items()),
    ".yml": lambda d: "".join(f"{k}: {json.dumps(v)}\n" for k, v in d.items()),
}


@pytest.mark.parametrize("suffix", list(WRITERS))
def test_extra_config_files_read_as_sglang_reads_them(tmp_path, suffix):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    path = tmp_path / f"mooncake{suffix}"
    path.write_text(WRITERS[suffix](CONFIG))
    theirs, *_ = HybridCacheController.parse_storage_backend_extra_config(f"@{path}")
    assert load_extra_config(f"@{path}", where="--extra-config") == theirs == CONFIG


def test_extra_config_inline_json():
    assert load_extra_config(json.dumps(CONFIG), where="--extra-config") == CONFIG
    assert (
        load_extra_config(None, where="--extra-config") is None
        and load_extra_config(" ", where="--extra-config") is None
    )


@pytest.mark.parametrize(
    "name, body, phrase",
    [
        (None, "{nope", "not valid JSON"),
        (None, "[1]", "must be a JSON object"),
        ("missing.json", None, "does not exist"),
        ("c.ini", "a = 1", "SGLang reads .json, .toml, .yaml"),
        ("c.json", "{nope", "not valid JSON"),
        ("c.toml", "a = ", "not valid TOML"),
        ("c.yaml", "a: [1", "not valid YAML"),
        ("c.yml", "- 1\n- 2\n", "must be a JSON object"),
    ],
)
def test_bad_extra_config_is_one_sentence(tmp_path, name, body, phrase):
    if name is None:
        text = body
    else:
        if body is not None:
            (tmp_path / name).write_text(body)
        text = f"@{tmp_path / name}"
    with pytest.raises(InputError) as err:
        load_extra_config(text, where="--extra-config")
    assert phrase in err.value.message and "\n" not in err.value.message


# --- the commands that share the parser ----------------------------------------------------------


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_te_check_and_tap_take_the_same_extra_config_files(tmp_path, suffix):
    path = tmp_path / f"mooncake{suffix}"
    path.write_text(WRITERS[suffix](CONFIG))
    te = hicache(
        [
            "te",
            "check",
            "--json",
            "--extra-config",
            f"@{path}",
            "--sglang-version",
            "0.5.23",
            "--server-args",
            HICACHE + " --disaggregation-ib-device mlx5_0",
        ]
    )
    assert te.exit_code == 0, te.output  # device_name mlx5_0 on both sides, rdma, P2PHANDSHAKE default
    assert json.loads(te.stdout)["store_config"]["origin"] == "extra_config"
    tap = hicache(["tap", "--json", "--extra-config", f"@{path}", "--path", str(tmp_path / "t.jsonl")])
    assert tap.exit_code == 0, tap.output
    assert {k: json.loads(tap.stdout)["extra_config"][k] for k in CONFIG} == CONFIG


def test_te_check_shows_an_unknown_flag_in_json_and_text():
    flags = HICACHE + " --disaggregaton-ib-device mlx5_0"
    env = {"MOONCAKE_MASTER": "10.0.0.1:50051", "MOONCAKE_DEVICE": "mlx5_0"}
    res = hicache(["te", "check", "--json", "--sglang-version", "0.5.23", "--server-args", flags], env=env)
    assert res.exit_code == 1, res.output  # the misspelt IB flag is not read: SGLang's engine has None
    data = json.loads(res.stdout)
    assert any("did you mean --disaggregation-ib-device?" in w for w in data["warnings"])
    text = hicache(["te", "check", "--sglang-version", "0.5.23", "--server-args", flags], env=env)
    assert text.exit_code == 1 and "did you mean --disaggregation-ib-device?" in text.stderr
