"""SGLang 0.5.14's own code for cross-checks, run in a child process.

0.5.14 and the installed 0.5.23 are both the package `sglang`, so one process cannot import
both. `make test` unpacks the 0.5.14 wheel under .cache/ (Makefile target `sglang-0.5.14`);
`run_0_5_14(script, payload)` runs `script` in a child Python whose `sglang` is 0.5.14's, with
the venv's other packages. The script reads `PAYLOAD` (JSON-decoded) and sets `RESULT` (JSON-
encodable), which comes back. A missing unpacked wheel is a test failure, never a skip.

One compatibility step happens in the child before the script: 0.5.14 registers Hugging Face
config names (e.g. `qwen3_asr`) that the newer transformers installed for 0.5.23 already has, and
transformers refuses a second registration; the child lets the registration pass (exist_ok).
Nothing of SGLang's own code is changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / ".cache" / "sglang-0.5.14"

_PRELUDE = """
import json, sys
from transformers.models.auto import configuration_auto as _ca
_register = _ca._LazyConfigMapping.register
_ca._LazyConfigMapping.register = lambda self, key, value, exist_ok=False: _register(self, key, value, exist_ok=True)
import sglang
assert sglang.__file__.startswith({root!r}), sglang.__file__
PAYLOAD = json.loads(sys.stdin.read())
RESULT = None
"""
_EPILOGUE = """
sys.stdout.write("\\n__RESULT__" + json.dumps(RESULT) + "\\n")
"""


def require_root() -> Path:
    if not (ROOT / "sglang" / "srt").is_dir():
        raise AssertionError(
            f"SGLang 0.5.14 is not unpacked at {ROOT}; run `make sglang-0.5.14` (make test does it)."
        )
    return ROOT


def run_0_5_14(script: str, payload: Any = None, *, timeout: float = 300) -> Any:
    """Run `script` against SGLang 0.5.14 in a child process and return its RESULT."""
    root = str(require_root())
    env = dict(os.environ, PYTHONPATH=root)
    code = _PRELUDE.format(root=root) + script + _EPILOGUE
    # -P: the child's sys.path does not get the current folder (the checkout's kernels/ would
    # shadow PyPI's `kernels`).
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=root,
    )
    marker = proc.stdout.rfind("\n__RESULT__")
    if proc.returncode != 0 or marker < 0:
        raise AssertionError(f"SGLang 0.5.14 child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout[marker + len("\n__RESULT__"):])
