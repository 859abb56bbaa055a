"""SGLang's launch flags, its storage extra-config and its environment, read the way SGLang reads them.

    args = parse_server_args("python -m sglang.launch_server --tp-size 2 --enable-hierarchical-cache", "0.5.23")
    args.tp_size, args.warnings          # 2, [] (a misspelt flag would be named here)
    load_extra_config("@mooncake.toml", where="--extra-config")   # {"master_server_address": ...}

One parser for every command that takes SGLang's flags (`te check`, `tap`, `playbook run`); the
rules are in docs/launch.md. Flags are split like a shell would (quotes, backslash-newline, `#`
comments in files); flags this module reads are typed and validated as SGLang's argparse and
start-up checks do; every other flag SGLang has is skipped with its value; a flag SGLang does not
have becomes a warning naming the closest one it does; a unique prefix of a flag is that flag, as
with argparse. Nothing here imports sglang, torch or mooncake.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hicache_ops.errors import InputError, SettingError
from hicache_ops.sglang.flag_names import SGLANG_FLAGS
from hicache_ops.sglang.versions import V0_5_14, V0_5_23, family

_BOOL, _STR, _INT = "bool", "str", "int"

# The flags read here: flag -> (LaunchArgs field, kind). Which versions have a flag comes from
# SGLANG_FLAGS.
_READ_FLAGS: dict[str, tuple[str, str]] = {
    "--enable-hierarchical-cache": ("enable_hierarchical_cache", _BOOL),
    "--enable-hicache": ("enable_hierarchical_cache", _BOOL),
    "--hicache-storage-backend": ("hicache_storage_backend", _STR),
    "--hicache-storage-backend-extra-config": ("hicache_storage_backend_extra_config", _STR),
    "--disaggregation-mode": ("disaggregation_mode", _STR),
    "--disaggregation-transfer-backend": ("disaggregation_transfer_backend", _STR),
    "--disaggregation-ib-device": ("disaggregation_ib_device", _STR),
    "--mooncake-ib-device": ("mooncake_ib_device", _STR),
    "--encoder-only": ("encoder_only", _BOOL),
    "--language-only": ("language_only", _BOOL),
    "--encoder-transfer-backend": ("encoder_transfer_backend", _STR),
    "--elastic-ep-backend": ("elastic_ep_backend", _STR),
    "--enable-elastic-expert-backup": ("enable_elastic_expert_backup", _BOOL),
    "--tp-size": ("tp_size", _INT),
    "--tensor-parallel-size": ("tp_size", _INT),
    "--pp-size": ("pp_size", _INT),
    "--pipeline-parallel-size": ("pp_size", _INT),
    "--dp-size": ("dp_size", _INT),
    "--data-parallel-size": ("dp_size", _INT),
    "--attn-dp-size": ("attn_dp_size", _INT),
    "--attention-data-parallel-size": ("attn_dp_size", _INT),
    "--attn-cp-size": ("attn_cp_size", _INT),
    "--attention-context-parallel-size": ("attn_cp_size", _INT),
    "--enable-dp-attention": ("enable_dp_attention", _BOOL),
    "--base-gpu-id": ("base_gpu_id", _INT),
    "--gpu-id-step": ("gpu_id_step", _INT),
    "--nnodes": ("nnodes", _INT),
    "--node-rank": ("node_rank", _INT),
}
_DISAGG_MODES = ("null", "prefill", "decode")
_ELASTIC_EP = ("mooncake", "nixl")
_ENCODER_BACKENDS = {
    V0_5_14: ("zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
    V0_5_23: ("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
}


@dataclass
class LaunchArgs:
    """The SGLang server args read here, with SGLang's defaults."""

    enable_hierarchical_cache: bool = False
    hicache_storage_backend: str | None = None
    hicache_storage_backend_extra_config: str | None = None
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_ib_device: str | None = None
    mooncake_ib_device: str | None = None
    encoder_only: bool = False
    language_only: bool = False
    encoder_transfer_backend: str | None = None  # the version's default, filled in by default_args
    elastic_ep_backend: str | None = None
    enable_elastic_expert_backup: bool = False
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1
    attn_cp_size: int = 1
    enable_dp_attention: bool = False
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    nnodes: int = 1
    node_rank: int = 0
    given: list[str] = field(default_factory=list)  # flags read from the command line, in order
    warnings: list[str] = field(default_factory=list)  # flags SGLang does not have, ambiguous prefixes


def default_args(version: str) -> LaunchArgs:
    """SGLang's defaults for `version` (no flag given)."""
    return LaunchArgs(encoder_transfer_backend=_ENCODER_BACKENDS[family(version)][0])


# ---------------------------------------------------------------------------------------------
# Text to argv
# ---------------------------------------------------------------------------------------------


def _read_server_args_file(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"the server-args file {path!r} does not exist.", hint="Pass the flags inline or fix the path."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the server-args file {path!r}: {exc}.") from None
    stripped = text.strip()
    if stripped.startswith("["):  # a JSON list of arguments (container specs hold them like this)
        try:
            items = json.loads(stripped)
        except ValueError as exc:
            raise InputError(
                f"the server-args file {path!r} starts like a JSON list but is not valid JSON: {exc}."
            ) from None
        if not isinstance(items, list) or not all(isinstance(i, (str, int, float)) for i in items):
            raise InputError(f"the server-args file {path!r} must hold a JSON list of strings.")
        return shlex.join(str(i) for i in items)
    return text


def split_server_args(text: str, *, comments: bool = False) -> list[str]:
    """The argv a shell would pass: quotes, backslash-newline continuations, # comments (files)."""
    if not isinstance(text, str):
        raise SettingError("server_args", "must be a string of SGLang launch flags.")
    body = text.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        lexer = shlex.shlex(body, posix=True, punctuation_chars=False)
        lexer.whitespace_split = True
        lexer.commenters = "#" if comments else ""
        return list(lexer)
    except ValueError as exc:
        raise SettingError(
            "server_args",
            f"are not valid shell words ({exc}).",
            hint='Check the quoting, e.g. --hicache-storage-backend-extra-config \'{"device_name": "mlx5_0"}\'.',
        ) from None


def server_argv(text: str) -> tuple[list[str], str]:
    """(argv, where it came from) for flags given inline, as "@FILE", or as an existing file's path."""
    stripped = text.strip()
    if text.startswith("@"):
        return split_server_args(_read_server_args_file(text[1:]), comments=True), text[1:]
    if stripped and not stripped.startswith("-") and "\n" not in text and os.path.isfile(stripped):
        return split_server_args(_read_server_args_file(stripped), comments=True), stripped
    return split_server_args(text), "--server-args"


# ---------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------


def resolve_flag(name: str, version: str) -> tuple[str | None, str | None]:
    """(the flag SGLang's argparse reads `name` as, or None; a warning, or None).

    argparse accepts a unique prefix of a flag as that flag (`--tp 2` is `--tp-size 2`); a flag
    SGLang does not have, or an ambiguous prefix, makes SGLang refuse to start.
    """
    known = SGLANG_FLAGS[family(version)]
    if name in known:
        return name, None
    prefixed = sorted(flag for flag in known if flag.startswith(name))
    if len(prefixed) == 1:
        return prefixed[0], None
    if len(prefixed) > 1:
        shown = ", ".join(prefixed[:4]) + (", ..." if len(prefixed) > 4 else "")
        return None, f"{name} is ambiguous in SGLang {version} (it could be {shown}); SGLang refuses to start on it."
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    other = next((v for v in SGLANG_FLAGS if v != family(version) and name in SGLANG_FLAGS[v]), None)
    where = f" (SGLang {other} has it)" if other else ""
    hint = f"; did you mean {close[0]}?" if close else "."
    return (
        None,
        f"SGLang {version} has no flag {name}{where}: it is ignored here and SGLang refuses to start on it{hint}",
    )


def parse_server_args(text: str, version: str) -> LaunchArgs:
    """Parse SGLang launch flags (a string, or "@FILE" / an existing file path holding them).

    Flags not read here are skipped with their values; a program prefix such as
    `python -m sglang.launch_server` is skipped too. The last occurrence of a flag wins, as with
    argparse. Raises InputError for bad quoting, a missing or malformed value, a flag read here
    that this SGLang version does not have, or what SGLang refuses at start-up (check_accepted).
    """
    args = default_args(version)
    argv, source = server_argv(text)
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--") or token == "--":
            continue  # the program and its module, or the value of a flag skipped here
        written, eq, inline = token.partition("=")
        name, warning = resolve_flag(written, version)
        if warning and warning not in args.warnings:
            args.warnings.append(warning)
        if name is None:
            if written in _READ_FLAGS:  # another version's flag that changes what is read here
                field_name = _READ_FLAGS[written][0]
                other = "--enable-hierarchical-cache" if field_name == "enable_hierarchical_cache" else None
                raise InputError(
                    f"SGLang {version} has no {written} flag (it would refuse to start).",
                    hint=f"Use {other}." if other else f"Remove {written}, or check --sglang-version.",
                )
            continue
        spec = _READ_FLAGS.get(name)
        if spec is None:
            continue
        field_name, kind = spec
        if kind == _BOOL:
            if eq:
                raise InputError(f"{name} takes no value (got {token!r}).", hint=f"Write {name} alone.")
            setattr(args, field_name, True)
            args.given.append(name)
            continue
        if eq:
            value: str | int = inline
        else:
            if i >= len(argv) or (argv[i].startswith("--") and len(argv[i]) > 2):
                raise InputError(f"{name} in {source} has no value.", hint=f"Write {name} VALUE.")
            value = argv[i]
            i += 1
        if kind == _INT:
            try:
                value = int(value)
            except ValueError:
                raise InputError(f"{name} {value!r} is not an integer.") from None
        setattr(args, field_name, value)
        args.given.append(name)
    check_accepted(args, version)
    return args


def check_accepted(args: LaunchArgs, version: str) -> None:
    """What SGLang itself refuses at start-up; applies SGLang's DP-attention rewrite of the sizes."""
    if args.disaggregation_mode not in _DISAGG_MODES:
        raise InputError(
            f"--disaggregation-mode {args.disaggregation_mode!r} is not one of {', '.join(_DISAGG_MODES)}."
        )
    if args.elastic_ep_backend is not None and args.elastic_ep_backend.lower() == "none":
        args.elastic_ep_backend = None
    if args.elastic_ep_backend is not None and args.elastic_ep_backend not in _ELASTIC_EP:
        raise InputError(f"--elastic-ep-backend {args.elastic_ep_backend!r} is not one of mooncake, nixl.")
    if args.encoder_transfer_backend not in _ENCODER_BACKENDS[family(version)]:
        raise InputError(
            f"--encoder-transfer-backend {args.encoder_transfer_backend!r} is not one of "
            f"{', '.join(_ENCODER_BACKENDS[family(version)])} in SGLang {version}."
        )
    for name in ("tp_size", "pp_size", "dp_size", "attn_dp_size", "attn_cp_size", "gpu_id_step", "nnodes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1.")
    if args.base_gpu_id < 0 or not 0 <= args.node_rank < args.nnodes:
        raise InputError(
            f"--base-gpu-id {args.base_gpu_id} / --node-rank {args.node_rank} out of range for --nnodes {args.nnodes}."
        )
    if args.encoder_only and args.language_only:
        raise InputError("--encoder-only and --language-only contradict each other (SGLang refuses both).")
    if args.encoder_only and args.disaggregation_mode != "null":
        raise InputError(
            f"--encoder-only contradicts --disaggregation-mode {args.disaggregation_mode} (SGLang refuses both)."
        )
    attn_dp_given = "--attn-dp-size" in args.given or "--attention-data-parallel-size" in args.given
    if args.enable_dp_attention and family(version) == V0_5_23 and not attn_dp_given:
        # 0.5.23 reads `--dp-size N --enable-dp-attention` as attn_dp_size = N, dp_size = 1.
        args.attn_dp_size, args.dp_size = args.dp_size, 1
    elif args.enable_dp_attention and family(version) == V0_5_14:
        args.attn_dp_size = args.dp_size
    attn = args.attn_dp_size * args.attn_cp_size
    if args.tp_size % attn:
        raise InputError(
            f"--tp-size {args.tp_size} is not divisible by attention DP x CP = {attn} (SGLang refuses it)."
        )


# ---------------------------------------------------------------------------------------------
# IB device flags (--disaggregation-ib-device, --mooncake-ib-device)
# ---------------------------------------------------------------------------------------------


def parse_ib_device(raw: str | None, *, flag: str) -> str | dict[int, str] | None:
    """None/blank -> None; a device list -> it stripped; a JSON map or .json file -> {gpu_id: devices}."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if not text.endswith(".json") and not text.startswith("{"):
        return text
    if text.endswith(".json"):
        try:
            with open(text, encoding="utf-8") as fh:
                mapping = json.load(fh)
        except FileNotFoundError:
            raise InputError(
                f"{flag} names the JSON file {text!r}, which does not exist here (SGLang fails to start without it).",
                hint="Run the check where the file exists, or pass the mapping inline as JSON.",
            ) from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{flag} file {text!r} is not readable JSON ({exc}); SGLang fails to start.") from None
    else:
        try:
            mapping = json.loads(text)
        except ValueError:
            raise InputError(
                f"{flag} {raw!r} is not valid JSON; SGLang fails to start on it.",
                hint='Write a map of GPU id to devices, e.g. \'{"0": "mlx5_0", "1": "mlx5_1"}\'.',
            ) from None
    if not isinstance(mapping, dict):
        raise InputError(f"{flag} must map GPU ids to device strings; SGLang fails to start on {raw!r}.")
    out: dict[int, str] = {}
    for key, value in mapping.items():
        if not str(key).isdigit() or not isinstance(value, str):
            raise InputError(
                f"{flag} maps {key!r} to {value!r}: keys must be GPU ids and values device strings (SGLang fails to "
                "start)."
            )
        out[int(key)] = value.strip()
    if not out:
        raise InputError(f"{flag} is an empty map; SGLang fails to start on it.")
    return out


def normalise_ib_device(raw: str | None, *, flag: str) -> str | None:
    """SGLang's start-up IB validation (PD/encoder over mooncake): de-duplicated, stripped lists.

    The availability check against /sys/class/infiniband happens on the deployment's machine and
    is not repeated here.
    """
    if raw is None:
        return None
    if not raw.strip():
        raise InputError(f"{flag} is empty; SGLang refuses it when mooncake transfers KV.")

    def group(value: str, context: str) -> str:
        devices = [d.strip() for d in value.split(",") if d.strip()]
        if not devices:
            raise InputError(f"{flag} has no device for {context}; SGLang refuses it.")
        return ",".join(dict.fromkeys(devices))

    parsed = parse_ib_device(raw, flag=flag)
    if isinstance(parsed, str):
        return group(raw.strip(), "all GPUs")
    assert parsed is not None
    return json.dumps({str(k): group(v, f"GPU {k}") for k, v in parsed.items()}, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# Extra-config and the environment
# ---------------------------------------------------------------------------------------------

EXTRA_CONFIG_SUFFIXES = (".json", ".toml", ".yaml", ".yml")


def load_extra_config(text: str | None, *, where: str) -> dict[str, Any] | None:
    """--hicache-storage-backend-extra-config: a JSON object, or "@FILE" (.json, .toml, .yaml/.yml).

    None or "" -> None. `where` names the option in error sentences.
    """
    if text is None or not text.strip():
        return None
    if text.startswith("@"):
        data = _read_extra_config_file(text[1:], where)
    else:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc}).",
                hint='Write a JSON object, e.g. \'{"master_server_address": "10.0.0.1:50051"}\', or @FILE.',
            ) from None
    if not isinstance(data, dict):
        raise InputError(
            f"{where} must be a JSON object, got {type(data).__name__}.",
            hint="Pass the same object as --hicache-storage-backend-extra-config.",
        )
    return data


def _read_extra_config_file(path: str, where: str) -> object:
    ext = os.path.splitext(path)[1].lower()
    if ext not in EXTRA_CONFIG_SUFFIXES:
        raise InputError(
            f"{where} file {path!r} has extension {ext or '(none)'!r}; SGLang reads .json, .toml, .yaml, .yml.",
            hint="Rename the file, or pass the JSON text itself.",
        )
    if ext in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InputError(
                f"{where} names a YAML file but PyYAML is not installed here.",
                hint="Convert it to JSON or TOML, or pip install pyyaml.",
            ) from None
    try:
        if ext == ".json":
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        if ext == ".toml":
            import tomllib

            with open(path, "rb") as fh:
                return tomllib.load(fh)
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise InputError(f"{where} names {path!r}, which does not exist.", hint="Check the path after '@'.") from None
    except OSError as exc:
        raise InputError(
            f"cannot read the {where} file {path!r}: {exc.strerror}.", hint="Check the path after '@'."
        ) from None
    except Exception as exc:  # json, toml and yaml raise different decode errors
        reason = " ".join(str(exc).split())
        raise InputError(f"{where} file {path!r} is not valid {ext[1:].upper()}: {reason}.") from None


def parse_env_overrides(items: list[str] | None) -> dict[str, str]:
    """--env NAME=VALUE items as a dict (the deployment's environment over this shell's)."""
    out: dict[str, str] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        if not eq or not name or any(c.isspace() for c in name):
            raise SettingError("env", f"{item!r} is not NAME=VALUE.", hint="For example --env MC_FORCE_TCP=1.")
        out[name] = value
    return out


def env_bool(env: Mapping[str, str], name: str, default: bool, warnings: list[str]) -> bool:
    """A boolean variable as SGLang reads it: true/1/yes/y, false/0/no/n (any case); else warn, default."""
    if name not in env:
        return default
    low = env[name].lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    warnings.append(f"{name}={env[name]!r} is not a boolean; SGLang warns and uses the default {default}.")
    return default
