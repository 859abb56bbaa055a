"""With --json anywhere on the command line every error is the JSON error object on stdout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cli_runner import hicache

PARSE_ERRORS = [
    (["inspect", "keys", "--bogus", "--json"], "--bogus"),
    (["inspect", "keys", "--json", "--page-size", "abc"], "valid integer"),
    (["prefetch", "--json"], "PROMPTS"),
    (["inspect", "layout", "--hicache-mem-layout", "page_last", "--json"], "'page_last' is not one of"),
    (["warm", "--rpc", "127.0.0.1:1", "--json"], "--rpc"),
    (["no-such-command", "--json"], "no-such-command"),
]
# Options a command does not have are errors too, --json itself included (serve prints no JSON).
NO_SUCH_JSON = [
    (["--json", "inspect", "keys"], "--json"),
    (["serve", "--json"], "--json"),
]


@pytest.mark.parametrize("args, fragment", PARSE_ERRORS + NO_SUCH_JSON)
def test_parse_error_with_json_is_the_json_error_object(args, fragment):
    result = hicache(args)
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert set(error) == {"code", "message", "hint"}
    assert error["code"] == "input_error" and fragment in error["message"]
    assert "\n" not in error["message"] and "--help" in error["hint"]
    assert result.stderr == ""


@pytest.mark.parametrize("args, fragment", PARSE_ERRORS)
def test_parse_error_without_json_is_typers_usage_message(args, fragment):
    result = hicache([a for a in args if a != "--json"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("Usage: ") and "Traceback" not in result.output


def test_json_mode_keeps_each_commands_exit_code(mooncake_master):
    listing = hicache(["playbook", "list", "--json"])
    assert listing.exit_code == 0 and isinstance(json.loads(listing.stdout), list)
    unknown = hicache(["playbook", "show", "no-such-book", "--json"])
    assert unknown.exit_code == 2 and json.loads(unknown.stdout)["error"]["code"] == "input_error"
    # Nothing was written under this prompt: the live diff finds it incomplete (exit 1).
    incomplete = hicache(
        [
            "inspect",
            "keys",
            "--tokens",
            "7,7,7,7",
            "--page-size",
            "2",
            "--model-name",
            "json-errors/none",
            "--master",
            mooncake_master.metrics_address,
            "--json",
        ]
    )
    assert incomplete.exit_code == 1, incomplete.output
    assert json.loads(incomplete.stdout)["contiguous_pages"] == 0


def test_console_script_prints_the_json_error_too():
    """The installed entry point (`run`) goes through the same root group as the tests' runner."""
    proc = subprocess.run(
        [sys.executable, "-c", "from hicache_ops.cli.main import run; run()", "inspect", "keys", "--nope", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--nope" in json.loads(proc.stdout)["error"]["message"]
