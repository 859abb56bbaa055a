"""`hicache inspect keys` end to end: JSON shape, token inputs, bad input, and --help's imports."""

from __future__ import annotations

import json
import subprocess
import sys
from array import array

import pytest

from cli_runner import hicache


def run_json(*args: str, input: str | None = None) -> tuple[int, dict]:
    result = hicache(["inspect", "keys", *args, "--json"], input=input)
    return result.exit_code, json.loads(result.stdout)


def test_json_reproduces_sglang_storage_keys_and_object_names():
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    tokens = list(range(100, 200))
    code, data = run_json(
        "--tokens",
        ",".join(map(str, tokens)),
        "--page-size",
        "16",
        "--sglang-version",
        "0.5.23",
        "--model-name",
        "Qwen/Qwen3-0.6B",
        "--extra-key",
        "tenantA",
        "--tp-size",
        "2",
    )
    assert code == 0
    theirs = get_storage_hash_str(RadixKey(array("q", tokens[:96]), extra_key="tenantA"), None, page_size=16)
    assert [p["page_key"] for p in data["pages"]] == list(theirs)
    assert data["trailing_tokens"] == 4
    assert data["namespace_seed"] is not None
    assert set(data) >= {"sglang_version", "page_size", "namespace_seed", "trailing_tokens", "pages"}
    page = data["pages"][1]
    assert (page["index"], page["start"], page["end"]) == (1, 16, 32)
    pk = page["page_key"]
    assert page["object_keys"] == [
        f"Qwen-Qwen3-0.6B_{pk}_0_k",
        f"Qwen-Qwen3-0.6B_{pk}_0_v",
        f"Qwen-Qwen3-0.6B_{pk}_1_k",
        f"Qwen-Qwen3-0.6B_{pk}_1_v",
    ]


def test_tp_rank_and_mla_select_objects():
    code, data = run_json(
        "--tokens", "1,2,3,4", "--page-size", "2", "--tp-size", "4", "--tp-rank", "3", "--sglang-version", "0.5.23"
    )
    assert code == 0 and data["pages"][0]["object_keys"][0].endswith("_3_k")
    code, data = run_json(
        "--tokens", "1,2,3,4", "--page-size", "2", "--tp-size", "4", "--mla", "--sglang-version", "0.5.23"
    )
    assert code == 0 and data["pages"][0]["object_keys"] == [data["pages"][0]["page_key"] + "__k"]


def test_tokens_file_json_jsonl_and_stdin(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(list(range(32))))
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"input_ids": list(range(32))})
        + "\n\n"
        + json.dumps({"input_ids": [5] * 32, "cache_salt": "s"})
        + "\n"
    )
    _, a = run_json("--tokens-file", str(tmp_path / "a.json"), "--page-size", "16")
    _, b1 = run_json("--tokens-file", str(tmp_path / "b.jsonl"), "--line", "1", "--page-size", "16")
    _, b2 = run_json(
        "--tokens-file", str(tmp_path / "b.jsonl"), "--line", "2", "--page-size", "16", "--sglang-version", "0.5.23"
    )
    _, s = run_json("--tokens-file", "-", "--page-size", "16", input=json.dumps(list(range(32))))
    assert a["pages"] == b1["pages"] == s["pages"]
    assert b2["cache_salt"] == "s" and b2["namespace_seed"] is not None


def test_text_with_local_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    code, data = run_json("--text", "hello world hello world", "--tokenizer", str(tmp_path), "--page-size", "2")
    _, direct = run_json("--tokens", "1,2,1,2", "--page-size", "2")
    assert code == 0 and data["pages"] == direct["pages"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--tokens", "1,-2,3"], "negative"),
        (["--tokens", "1,x"], "not an integer"),
        (["--tokens", " , "], "empty"),
        (["--tokens", "1,2", "--page-size", "0"], "--page-size 0"),
        (["--tokens", "1,2", "--sglang-version", "0.4.9"], "SGLang 0.4.9 is older than 0.5.14"),
        (["--tokens", "1,2", "--layout", "weird"], "'weird' is not one of"),
        (["--tokens", "1,2", "--mla", "--layout", "page_head"], "not supported for MLA"),
        (["--tokens", "1,2", "--tp-size", "2", "--tp-rank", "2"], "outside"),
        (["--tokens", "1,2", "--mla", "--tp-size", "2", "--tp-rank", "1"], "only tp rank 0"),
        (["--text", "hi", "--tokenizer", "/nonexistent/tok"], "does not exist"),
        (["--text", "hi"], "needs --tokenizer"),
        ([], "exactly once"),
        (["--tokens", "1", "--text", "x"], "exactly once"),
        (["--tokens-file", "/nonexistent.json"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(args, fragment):
    result = hicache(["inspect", "keys", *args, "--json"])
    assert result.exit_code == 2, result.stdout
    error = json.loads(result.stdout)["error"]
    assert fragment in error["message"]
    assert "Traceback" not in result.stdout + (result.stderr or "")


def test_malformed_jsonl_line_is_named(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [1, 2]}\n{"input_ids": [1, 2\n')
    result = hicache(["inspect", "keys", "--tokens-file", str(f), "--line", "1", "--json"])
    assert result.exit_code == 2
    assert "p.jsonl:2 is not valid JSON" in json.loads(result.stdout)["error"]["message"]


def test_empty_prompt_and_short_prompt():
    f_code, _ = run_json("--tokens", "1,2,3", "--page-size", "16")
    assert f_code == 0  # a short prompt is valid: it just has no whole page
    code, data = run_json("--tokens", "1,2,3", "--page-size", "16")
    assert data["pages"] == [] and any("less than one page" in n for n in data["notes"])


def test_help_imports_neither_torch_nor_mooncake():
    code = (
        "import sys, runpy; sys.argv = ['hicache', '--help'];\n"
        "try:\n    runpy.run_module('hicache_ops.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'mooncake', 'sglang') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_cli_and_kernels_are_not_top_level_names():
    import importlib.util

    import hicache_ops.cli
    import hicache_ops.kernels  # noqa: F401

    # `kernels` must stay the PyPI package SGLang depends on, not our folder.
    spec = importlib.util.find_spec("kernels")
    assert spec is None or "site-packages" in (spec.origin or "")
