"""The release model: every release 0.5.14..0.5.23 known, ranges, refusals, warnings, the default's reason."""

from __future__ import annotations

import json

import pytest

from cli_runner import hicache
from hicache_ops.errors import InputError
from hicache_ops.sglang import policy
from hicache_ops.sglang.versions import RELEASES, default_choice, family, parse, resolve_version, since


def test_every_release_is_known_and_ordered():
    assert RELEASES[0] == "0.5.14" and RELEASES[-1] == "0.5.23" and "0.5.15.post1" in RELEASES
    assert [parse(v) for v in RELEASES] == sorted(parse(v) for v in RELEASES)
    for v in RELEASES:
        assert resolve_version(v).version == v and resolve_version(v).notes == []


def test_post_releases_and_ranges():
    assert parse("0.5.15.post1") > parse("0.5.15") and parse("0.5.15post1") == parse("0.5.15.post1")
    assert since("0.5.15.post1", "0.5.15") and not since("0.5.15.post1", "0.5.16")
    # an unknown post release takes its base release's rules, with a note
    choice = resolve_version("0.5.19.post2")
    assert choice.version == "0.5.19" and "not a release the toolkit knows" in choice.notes[0]
    assert family("0.5.18") == "0.5.14" and family("0.5.19") == "0.5.23"


def test_newer_warns_older_and_garbage_refused():
    choice = resolve_version("0.5.24")
    assert choice.version == "0.5.23" and choice.notes[0].startswith("warning: SGLang 0.5.24 is newer")
    with pytest.raises(InputError, match="older than 0.5.14"):
        resolve_version("0.5.13.post1")
    with pytest.raises(InputError, match="not a release number"):
        resolve_version("main")


def test_default_names_the_installed_sglang():
    choice = default_choice()
    assert choice.version == "0.5.23" and choice.reason == "installed sglang"
    assert "installed sglang 0.5.23" in choice.notes[0]


@pytest.mark.parametrize(
    ("version", "limit", "budget", "retry"),
    [
        ("0.5.14", "0.8 x (host - device)", "min(30, 2.0", "never retries"),
        ("0.5.15", "0.5 x host", "min(30, 2.0", "never retries"),
        ("0.5.18", "0.5 x host", "min(30, 2.0", "never retries"),
        ("0.5.19", "0.5 x host", "hit tokens/1024, no maximum", "does not retry by default"),
        ("0.5.21", "0.5 x host", "hit tokens/1024, no maximum", "retries every 8 scheduler passes, up to 8"),
        ("0.5.23", "0.5 x host", "requested tokens/1024 from the first admission", "retries every 8"),
    ],
)
def test_policy_rules_per_release(version, limit, budget, retry):
    assert limit in policy.prefetch_limit_rule(version)
    assert budget in policy.budget_rule(version)
    assert retry in policy.retry_rule(version)
    assert policy.prefetch_limit_tokens(version, 1000, 200) == (640 if version == "0.5.14" else 500)
    tb = policy.TimeoutBudget()
    seconds = tb.seconds(version, requested_tokens=409600, hit_tokens=204800)
    assert seconds == {"0.5.19": 51.0, "0.5.21": 51.0, "0.5.23": 101.0}.get(version, 22.0)


def test_tlru_from_0_5_21():
    assert "tlru" not in policy.eviction_policies("0.5.20") and "tlru" in policy.eviction_policies("0.5.21")


def test_write_back_eviction_rules_per_release():
    """The drop from 0.5.15 (hiradix_cache.py `_drop_subtree_no_host`), victims held for the pass
    through the HiRadixCache releases (docs/controller.md#device-eviction); the engine's examples
    check 0.5.14, 0.5.15 and 0.5.23 against SGLang's trees (tests/engine/test_oracle.py)."""
    assert [policy.drops_unbacked_write_back(v) for v in ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.23")] == [
        False,
        True,
        True,
        True,
    ]
    assert [policy.defers_write_back_victims(v) for v in ("0.5.14", "0.5.18", "0.5.19", "0.5.23")] == [
        True,
        True,
        False,
        False,
    ]


def keys_json(*args):
    result = hicache(["inspect", "keys", "--tokens", "1,2,3,4", "--page-size", "2", *args, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_inspect_keys_model_prefix_since_0_5_17():
    assert keys_json("--sglang-version", "0.5.16", "--model-name", "Org/M")["key_prefix"] == ""
    assert keys_json("--sglang-version", "0.5.15.post1", "--model-name", "Org/M")["key_prefix"] == ""
    assert keys_json("--sglang-version", "0.5.17", "--model-name", "Org/M")["key_prefix"] == "Org-M_"


def test_inspect_keys_namespace_seed_since_0_5_20():
    assert keys_json("--sglang-version", "0.5.19", "--extra-key", "t")["namespace_seed"] is None
    assert keys_json("--sglang-version", "0.5.20", "--extra-key", "t")["namespace_seed"]


def test_the_chosen_rules_and_why_are_in_the_output():
    data = keys_json("--sglang-version", "0.5.19")
    assert data["sglang_rules"] == {
        "version": "0.5.19",
        "requested": "0.5.19",
        "reason": "--sglang-version",
        "notes": [],
    }
    data = keys_json()
    assert data["sglang_rules"]["reason"] == "installed sglang"
    result = hicache(["inspect", "keys", "--tokens", "1,2", "--page-size", "2", "--sglang-version", "0.5.25", "--json"])
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["sglang_rules"]["version"] == "0.5.23"
    assert any("0.5.25 is newer than 0.5.23" in n for n in data["notes"])
    assert "0.5.25 is newer" in result.stderr


@pytest.mark.parametrize(
    ("version", "limit", "budget", "retry"),
    [
        ("0.5.15", "0.5.15: 0.5 x host", "min(30, 2.0 + 0.1 x hit tokens/1024)", "0.5.15 never retries"),
        ("0.5.19", "0.5.19: 0.5 x host", "1.0 + 0.25 x hit tokens/1024, no maximum", "does not retry by default"),
        ("0.5.21", "0.5.21: 0.5 x host", "1.0 + 0.25 x hit tokens/1024, no maximum", "0.5.21 retries every 8"),
    ],
)
def test_trace_read_names_the_release_rules(tmp_path, version, limit, budget, retry):
    prompt = tmp_path / "prompt.json"
    prompt.write_text(json.dumps(list(range(1, 700))))
    result = hicache(
        ["trace", "read", "--tokens-file", prompt, "--sglang-version", version, "--page-size", "64", "--json"]
    )
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert records[0]["sglang_rules"]["version"] == version
    decision = next(r for r in records if r.get("name") == "prefetch decision")
    assert decision["detail"]["capacity_rule"].startswith(limit)
    assert budget in decision["detail"]["budget_rule"] and retry in decision["detail"]["retry_rule"]
