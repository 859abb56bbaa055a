"""Any SGLang release's own code for cross-checks, run in a child process (generalises sglang_0_5_14.py).

`make test` downloads and unpacks every release wheel from 0.5.14 to 0.5.22 under
.cache/sglang-X (Makefile target `sglang-releases`); the installed 0.5.23 is the venv's own.
`run_release(version, script, payload)` runs `script` in a child Python whose `sglang` is that
release's (the venv's other packages beside it), with the same prelude and result protocol as
run_0_5_14. A missing unpacked wheel is a test failure, never a skip.

From 0.5.15 SGLang hashes pages with a C++ extension that torch builds on first use (a minute or
two each). Releases whose extension source is the same byte for byte share one build folder under
.cache/torch_extensions (named by the source's digest), so a fresh clone builds it once, not once per
release; each child gets a temporary torch inductor cache removed when it ends.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sglang_0_5_14 import _EPILOGUE, _MARKER, _PRELUDE

CACHE = Path(__file__).resolve().parents[1] / ".cache"
INSTALLED = "0.5.23"
# Every release between 0.5.14 and the installed one, post releases included (versions.RELEASES).
UNPACKED = ("0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22")


def release_root(version: str) -> Path | None:
    """The folder whose `sglang` is `version` (None: the installed one)."""
    if version == INSTALLED:
        return None
    root = CACHE / f"sglang-{version}"
    if not (root / "sglang" / "srt").is_dir():
        raise AssertionError(
            f"SGLang {version} is not unpacked at {root}; run `make sglang-releases` (make test does it)."
        )
    return root


def _extension_key(version: str, root: Path | None) -> str:
    """The build folder's name: the digest of the release's page-hash extension source, else the release."""
    if root is None:
        spec = importlib.util.find_spec("sglang")
        package = Path(spec.origin).parent if spec and spec.origin else None
    else:
        package = root / "sglang"
    source = package / "srt" / "mem_cache" / "cpp_utils" / "hash_binding.cpp" if package else None
    if source is None or not source.is_file():
        return f"sglang-{version}"
    return "hash-" + hashlib.sha256(source.read_bytes()).hexdigest()[:16]


def run_release(version: str, script: str, payload: Any = None, *, timeout: float = 900) -> Any:
    """Run `script` against SGLang `version` in a child process and return its RESULT."""
    root = release_root(version)
    ext_dir = CACHE / "torch_extensions" / _extension_key(version, root)
    ext_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"sglang-{version}-inductor-") as inductor_cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=inductor_cache, TORCH_EXTENSIONS_DIR=str(ext_dir))
        if root is not None:
            env["PYTHONPATH"] = str(root)
        where = str(root) if root is not None else str(Path(sys.executable).resolve().parents[1])
        prelude = _PRELUDE.format(root=str(root) if root is not None else "")
        code = prelude + script + _EPILOGUE
        proc = subprocess.run(
            [sys.executable, "-P", "-c", code],
            input=json.dumps(payload) + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(CACHE),
        )
    marker = proc.stdout.rfind("\n" + _MARKER)
    if proc.returncode != 0 or marker < 0:
        raise AssertionError(
            f"SGLang {version} child ({where}) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout[marker + len(_MARKER) + 1 :])
