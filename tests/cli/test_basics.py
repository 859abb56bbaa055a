"""What every CLI has: --version (with the SGLang and Mooncake releases), -h, shell completion, and a
`--help` that loads none of the heavy libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import hicache_ops
from cli_runner import hicache
from hicache_ops.mooncake import versions as mooncake_versions
from hicache_ops.sglang.versions import SUPPORTED_VERSIONS

HEAVY = ("numpy", "torch", "mooncake", "sglang")


def test_version_names_hicache_sglang_and_mooncake():
    result = hicache(["--version"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"hicache-ops {hicache_ops.__version__}"
    assert lines[1].startswith("SGLang " + ", ".join(SUPPORTED_VERSIONS))
    assert f"installed {metadata.version('sglang')}" in lines[1]
    assert lines[2].startswith(f"Mooncake {mooncake_versions.MEASURED} (measured; installed mooncake-transfer-engine")
    assert hicache(["-V"]).stdout == result.stdout


def test_version_json():
    result = hicache(["--version", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert list(info) == ["hicache_ops", "sglang", "mooncake"]
    assert list(info["sglang"]) == ["supported", "default", "installed"]
    assert list(info["mooncake"]) == ["measured", "installed"]
    assert info["hicache_ops"] == hicache_ops.__version__
    assert info["sglang"]["supported"] == list(SUPPORTED_VERSIONS)
    assert info["sglang"]["installed"] == metadata.version("sglang")
    installed = info["mooncake"]["installed"]
    assert metadata.version(installed["distribution"]) == installed["version"]


@pytest.mark.parametrize("path", [[], ["inspect"], ["inspect", "keys"], ["trace", "write"]])
def test_dash_h_is_help(path):
    long, short = hicache([*path, "--help"]), hicache([*path, "-h"])
    assert long.exit_code == short.exit_code == 0, short.output
    assert short.stdout == long.stdout and "Usage:" in short.stdout


def test_shell_completion_is_offered():
    """Typer's completion: the options in --help, the bash script, and a real completion of a word
    (through the environment protocol the script uses, so no shell needs detecting here)."""
    help_text = hicache(["--help"]).stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text
    script = hicache([], prog_name="hicache", env={"_HICACHE_COMPLETE": "source_bash"})
    assert script.exit_code == 0, script.output
    assert "_HICACHE_COMPLETE=complete_bash" in script.stdout and "complete -o default" in script.stdout
    words = {"_HICACHE_COMPLETE": "complete_bash", "COMP_WORDS": "hicache ins", "COMP_CWORD": "1"}
    completed = hicache([], prog_name="hicache", env=words)
    assert completed.exit_code == 0 and completed.stdout.split() == ["inspect"], completed.output


def test_help_imports_no_heavy_library():
    """`hicache --help` in a fresh interpreter, every import listed by -X importtime."""
    src = str(Path(hicache_ops.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hicache_ops.cli", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hicache_ops.cli.main" in loaded and "typer" in loaded  # the listing is read right
    heavy = sorted({name.split(".")[0] for name in loaded} & set(HEAVY))
    assert heavy == [], f"`hicache --help` imports {heavy}"
