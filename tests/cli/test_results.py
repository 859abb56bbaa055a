"""Result models (hicache_ops/results.py) print the JSON a command printed before it had one: the same
fields in the same order, and the fields an option adds absent without that option."""

from __future__ import annotations

import json

import pytest
from pydantic import Field

from cli_runner import hicache
from hicache_ops.cli.common.output import json_data
from hicache_ops.results import OnlyWith, Result

KEYS_FIELDS = [
    "sglang_version",
    "page_size",
    "extra_key",
    "cache_salt",
    "namespace_seed",
    "key_prefix",
    "prompt_tokens",
    "trailing_tokens",
    "ranks",
    "pages",
    "notes",
    "pools",
    # which release's rules were applied, and why (docs/releases.md), added to every command's JSON
    "sglang_rules",
]


class _Live(Result):
    omit_if_none = ("extra",)
    only_with = (OnlyWith("--master", ("master", "found")),)

    name: str = Field(description="a name")
    extra: int | None = Field(None, description="added by an option")
    master: str | None = Field(None, description="with --master")
    found: int | None = Field(None, description="with --master, may be null")


def test_fields_an_option_adds_are_absent_without_it():
    assert json_data(_Live(name="a")) == {"name": "a"}
    # found stays (as null) once master is there: only master's absence removes it.
    assert json_data(_Live(name="a", master="m")) == {"name": "a", "master": "m", "found": None}
    assert list(json_data(_Live(name="a", extra=0, master="m", found=3))) == ["name", "extra", "master", "found"]
    assert _Live.optional_fields() == {"extra": None, "master": "--master", "found": "--master"}


class _Served(Result):
    # a group whose presence an excluded field says: present with the option even when all are null
    only_with = (OnlyWith("--sglang-url", ("layout", "note"), given="with_server"),)
    with_server: bool = Field(False, exclude=True)

    name: str = Field(description="a name")
    layout: dict | None = Field(None, description="with --sglang-url")
    note: str | None = Field(None, description="with --sglang-url, may be null")


def test_a_group_given_by_an_excluded_field():
    assert json_data(_Served(name="a")) == {"name": "a"}
    assert json_data(_Served(name="a", with_server=True)) == {"name": "a", "layout": None, "note": None}
    assert json_data(_Served(name="a", layout={}, note="n")) == {"name": "a"}  # without the option: none


def test_inspect_keys_json_fields_and_order_without_master():
    result = hicache(["inspect", "keys", "--tokens", ",".join(map(str, range(40))), "--page-size", "16", "--json"])
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert list(data) == KEYS_FIELDS
    assert [list(page) for page in data["pages"]] == [["index", "start", "end", "page_key", "object_keys"]] * 2


def test_inspect_keys_json_with_side_pools_keeps_pool_fields():
    args = ["--tokens", ",".join(map(str, range(40))), "--page-size", "16", "--pool-preset", "gpt-oss", "--json"]
    data = json.loads(hicache(["inspect", "keys", *args]).stdout)
    assert list(data) == KEYS_FIELDS
    assert data["pools"] and all(list(p) == ["name", "suffixes", "hit_policy", "trailing_pages"] for p in data["pools"])


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_no_result_model(flag):
    """The result models (pydantic) load with the command that runs, not with `hicache --help` or
    the plain `--version` (its --json model is apart, commands/version_result.py)."""
    import subprocess
    import sys

    code = (
        f"import sys, runpy; sys.argv = ['hicache', '{flag}'];\n"
        "try:\n    runpy.run_module('hicache_ops.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('LOADED', [m for m in ('pydantic', 'hicache_ops.results') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out


def test_inspect_layout_objects_carry_heads_and_split_only_when_heads_are_split():
    def objects(*args: str) -> list[list[str]]:
        result = hicache(["inspect", "layout", "--preset", "llama-3.1-8b", "--tp-size", "2", *args, "--json"])
        assert result.exit_code == 0, result.stdout
        return [list(o) for page in json.loads(result.stdout)["pages"] for o in page["objects"]]

    plain = ["buffer", "offset", "size", "part"]
    assert set(map(tuple, objects())) == {tuple(plain)}
    split = objects("--layout", "page_head", "--tp-lcm-size", "4")
    assert set(map(tuple, split)) == {(*plain, "heads", "split")}
