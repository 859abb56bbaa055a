"""One meaning per option name: an option that two commands share has one type and one help text."""

from __future__ import annotations

from collections import defaultdict

import pytest

from cli_runner import hicache, leaf_commands

# (option, command) uses that differ from the shared declaration on purpose, and why.
DIFFERENT_ON_PURPOSE = {
    ("--tokens", "bench keys"): "a benchmark size (a count of tokens), not a prompt's token ids",
    ("--tokens", "bench kernels"): "a benchmark size (a count of tokens), not a prompt's token ids",
    ("--heads", "bench kernels"): "the kernels move one rank's slice: KV heads per rank, not before TP",
    ("--dtype", "bench kernels"): "the tensor dtype moved (uint8 stands for fp8), not a model's KV dtype name",
    ("--layout", "bench kernels"): "repeatable: the host layouts to measure, not one deployment's layout",
    ("--l3", "bench replay"): "a simulated L3's capacity, where serve's --l3 says which master backs it",
    ("--limit", "bench replay"): "how many requests of the trace to replay, not how many rows to show",
    (
        "--sglang-url",
        "warm",
    ): "the server to warm through (its /generate), not only the one to read the deployment from",
    ("--concurrency", "bench multiturn"): "clients arriving together, default none (one at a time, the published "
    "simulation), where warm's is prompts in flight with a default of 4",
    (
        "--sglang-url",
        "prefetch",
    ): "prefetch has no deployment options to fill: the serve's settings are compared with it",
    ("--sglang-url", "watch"): "repeatable: the servers whose /metrics to scrape, not one deployment to read",
    ("--sglang-version", "watch"): "the release whose metric meanings apply when /server_info does not say, "
    "not a key scheme; no default (inferred from the exported names)",
    ("--sglang-url", "inspect store"): "inspect store has no deployment options to fill: the pools of the server's "
    "L3 layout are checked against the keys",
}
EXCEPTIONS = DIFFERENT_ON_PURPOSE


def option_uses() -> dict[str, dict[str, tuple]]:
    """option name -> {command: (type, help)}, aliases and --no- forms included."""
    uses: dict[str, dict[str, tuple]] = defaultdict(dict)
    for path, command in leaf_commands().items():
        for param in command.params:
            if param.param_type_name != "option":
                continue
            for name in [*param.opts, *param.secondary_opts]:
                uses[name][path] = (param.type_descriptor.annotation, param.help)
    return uses


def test_a_shared_option_has_one_type_and_one_help_text():
    problems = []
    for name, by_command in sorted(option_uses().items()):
        kept = {path: use for path, use in by_command.items() if (name, path) not in EXCEPTIONS}
        if len(by_command) < 2 or len(set(kept.values())) <= 1:
            continue
        lines = [f"  {path}: {kind!r} {text!r}" for path, (kind, text) in sorted(kept.items())]
        problems.append(f"{name} differs between commands:\n" + "\n".join(lines))
    assert not problems, "\n".join(problems)


def test_every_exception_is_still_needed():
    uses = option_uses()
    for (name, path), why in EXCEPTIONS.items():
        assert path in uses.get(name, {}), f"{name} is no longer an option of `{path}`: drop its exception ({why})"
        others = {use for other, use in uses[name].items() if other != path}
        assert others and uses[name][path] not in others, (
            f"`{path}` {name} now matches the shared declaration: drop its exception ({why})"
        )


def test_master_is_the_admin_address_and_master_rpc_the_rpc_address():
    uses = option_uses()
    admin = {use[1] for path, use in uses["--master"].items() if ("--master", path) not in EXCEPTIONS}
    assert len(admin) == 1 and "HOST:METRICS_PORT" in admin.pop()
    assert {"warm"} <= set(uses["--master-rpc"]) and "--rpc" not in uses
    (rpc_help,) = {use[1] for use in uses["--master-rpc"].values()}
    assert "HOST:RPC_PORT" in rpc_help


def test_layout_alias_and_hicache_size_type():
    uses = option_uses()
    assert set(uses["--hicache-mem-layout"]) <= set(uses["--layout"])
    assert {"inspect keys", "inspect layout", "serve"} <= set(uses["--hicache-mem-layout"])
    assert {kind for kind, _ in uses["--hicache-size"].values()} == {float}


def test_one_flag_has_one_parameter_name():
    """A flag is one parameter name in every command, so values pass whole with no renaming table."""
    names: dict[str, dict[str, str]] = defaultdict(dict)
    for path, command in leaf_commands().items():
        for param in command.params:
            if param.param_type_name == "option":
                for flag in [*param.opts, *param.secondary_opts]:
                    names[flag][path] = param.name
    problems = [
        f"{flag}: " + ", ".join(f"{path} {name}" for path, name in sorted(by_command.items()))
        for flag, by_command in sorted(names.items())
        if len(set(by_command.values())) > 1
    ]
    assert not problems, "flags with more than one parameter name:\n" + "\n".join(problems)


def test_every_setting_the_library_names_is_a_flag():
    """A SettingError names a setting in library words; the CLI prints the flag of that name, so each is one."""
    import re
    from pathlib import Path

    library = Path(__file__).resolve().parents[2] / "src" / "hicache_ops"
    settings = {
        match.group(1)
        for path in library.rglob("*.py")
        if "cli" not in path.relative_to(library).parts
        for match in re.finditer(r'SettingError\(\s*"([a-z0-9_]+)"', path.read_text())
    }
    assert {"page_size", "pool", "timeout", "device_tokens"} <= settings
    names = {param.name for command in leaf_commands().values() for param in command.params}
    flags = set(option_uses())
    unknown = sorted(s for s in settings if s not in names and "--" + s.replace("_", "-") not in flags)
    assert not unknown, f"settings no command has an option for: {unknown}"


def test_a_setting_error_names_the_running_commands_flag():
    from hicache_ops.cli.common.output import COMMAND_FLAGS, error_message
    from hicache_ops.errors import SettingError

    err = SettingError("layout", "'x' is unknown.")
    assert err.message == "layout 'x' is unknown."
    token = COMMAND_FLAGS.set({"layout": "--hicache-mem-layout"})
    try:
        assert error_message(err) == "--hicache-mem-layout 'x' is unknown."
    finally:
        COMMAND_FLAGS.reset(token)
    assert error_message(SettingError("tp_size", "0 must be >= 1.")) == "--tp-size 0 must be >= 1."


def test_choice_enums_hold_their_library_tables():
    from hicache_ops.cli.common.options import CHOICE_TABLES

    for choices, table in CHOICE_TABLES.items():
        assert tuple(member.value for member in choices) == table, choices.__name__


# ---------------------------------------------------------------------------------------------
# --l3-bandwidth-gbps: the modelled L3 transfer rate (docs/controller.md#transfer-time)
# ---------------------------------------------------------------------------------------------

ENGINE_SPEC_COMMANDS = (("serve",), ("trace", "read"), ("trace", "write"), ("bench", "multiturn"))


def test_l3_bandwidth_is_one_flag_of_every_command_that_builds_the_engine():
    uses = option_uses()
    assert {" ".join(c) for c in ENGINE_SPEC_COMMANDS} <= set(uses["--l3-bandwidth-gbps"])


@pytest.mark.parametrize("value", ["0", "-2.5", "nan"])
@pytest.mark.parametrize("command", ENGINE_SPEC_COMMANDS)
def test_l3_bandwidth_of_zero_or_less_is_refused_in_one_sentence(command, value):
    result = hicache([*command, "--l3-bandwidth-gbps", value])
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())  # the error box wraps the sentence
    assert "Gbit/s is not a bandwidth: give a rate above 0, or leave it out (unlimited)." in text
    assert "Traceback" not in result.output


def test_l3_bandwidth_makes_the_timeout_stop_policy_cut_bench_multiturns_prefetches():
    """The flag reaches the engine: at 0.0001 Gbit/s (12.5 kB/s) every L3 read outlasts SGLang's
    timeout budget (the default stop policy), so the same prefetches are issued and none lands;
    unlimited, they land (tests/engine/test_transfer_time.py has the engine's arithmetic)."""
    import json

    args = ["bench", "multiturn", "--accounting-only", "--clients", "8", "--rounds", "6", "--new-tokens", "512"]
    args += ["--l1-tokens", "8192", "--workers", "1", "--json", "-q"]
    runs = {}
    for name, extra in (("unlimited", []), ("slow", ["--l3-bandwidth-gbps", "0.0001"])):
        result = hicache([*args, *extra])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads(result.stdout)["configurations"]["l1_l2_l3"]
    assert runs["unlimited"]["prefetches"]["issued"] == runs["slow"]["prefetches"]["issued"] > 0
    assert runs["unlimited"]["storage_hit_tokens"] > 0
    assert runs["slow"]["storage_hit_tokens"] == 0
