"""SGLang 0.5.14's own code for cross-checks, run in a child process.

0.5.14 and the installed 0.5.23 are both the package `sglang`, so one process cannot import
both. `make test` unpacks the 0.5.14 wheel under .cache/ (Makefile target `sglang-0.5.14`);
`run_0_5_14(script, payload)` runs `script` in a child Python whose `sglang` is 0.5.14's, with
the venv's other packages. The script reads `PAYLOAD` (JSON-decoded) and sets `RESULT` (JSON-
encodable), which comes back. A missing unpacked wheel is a test failure, never a skip.
`held_0_5_14(script, payload)` does the same but keeps the child alive until the `with` block
ends: Mooncake objects live in the segment of the client that put them, so objects SGLang 0.5.14
wrote exist only while its store (the child) is up.

One compatibility step happens in the child before the script: 0.5.14 registers Hugging Face
config names (e.g. `qwen3_asr`) that the newer transformers installed for 0.5.23 already has, and
transformers refuses a second registration; the child lets the registration pass (exist_ok).
Nothing of SGLang's own code is changed.

Importing 0.5.14 sets up torch inductor, which makes its cache folder (by default
/tmp/torchinductor_<user>); the child gets a temporary one instead, removed when it ends.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
PAYLOAD = json.loads(sys.stdin.readline())
RESULT = None
"""
# After the result, the child waits for its stdin to close (at once for run_0_5_14).
_EPILOGUE = """
sys.stdout.write("\\n__RESULT__" + json.dumps(RESULT) + "\\n")
sys.stdout.flush()
sys.stdin.readline()
"""
_MARKER = "__RESULT__"


def require_root() -> Path:
    if not (ROOT / "sglang" / "srt").is_dir():
        raise AssertionError(f"SGLang 0.5.14 is not unpacked at {ROOT}; run `make sglang-0.5.14` (make test does it).")
    return ROOT


def _command(script: str, inductor_cache: str) -> tuple[list[str], dict, str]:
    root = str(require_root())
    env = dict(os.environ, PYTHONPATH=root, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    code = _PRELUDE.format(root=root) + script + _EPILOGUE
    # -P: the child's sys.path does not get the current folder (the checkout's kernels/ would
    # shadow PyPI's `kernels`).
    return [sys.executable, "-P", "-c", code], env, root


def run_0_5_14(script: str, payload: Any = None, *, timeout: float = 300) -> Any:
    """Run `script` against SGLang 0.5.14 in a child process and return its RESULT."""
    with tempfile.TemporaryDirectory(prefix="sglang-0.5.14-inductor-") as inductor_cache:
        argv, env, root = _command(script, inductor_cache)
        proc = subprocess.run(
            argv, input=json.dumps(payload) + "\n", capture_output=True, text=True, timeout=timeout, env=env, cwd=root
        )
    marker = proc.stdout.rfind("\n" + _MARKER)
    if proc.returncode != 0 or marker < 0:
        raise AssertionError(f"SGLang 0.5.14 child failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout[marker + len(_MARKER) + 1 :])


@contextmanager
def held_0_5_14(script: str, payload: Any = None, *, timeout: float = 300) -> Iterator[Any]:
    """Like run_0_5_14, but the child stays alive (its Mooncake segment mounted) inside the block."""
    with (
        tempfile.TemporaryDirectory(prefix="sglang-0.5.14-inductor-") as inductor_cache,
        tempfile.TemporaryFile() as errors,  # unlinked at once: nothing is left in /tmp
    ):
        argv, env, root = _command(script, inductor_cache)
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env, cwd=root)
        try:
            proc.stdin.write(json.dumps(payload).encode() + b"\n")
            proc.stdin.flush()
            yield _read_result(proc, errors, time.monotonic() + timeout)
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            proc.stdout.close()


def _read_result(proc: subprocess.Popen, errors, deadline: float) -> Any:
    """The child's RESULT line, read from its stdout within the deadline (raw reads: no buffering)."""
    fd = proc.stdout.fileno()
    seen = b""
    marker = _MARKER.encode()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the child ended without a result
                break
            seen += chunk
            at = seen.rfind(marker)
            if at >= 0 and seen.endswith(b"\n"):
                return json.loads(seen[at + len(marker) :])
    proc.kill()
    proc.wait(timeout=10)
    errors.seek(0)
    tail = errors.read()[-4000:].decode(errors="replace")
    raise AssertionError(f"SGLang 0.5.14 child gave no result (exit {proc.returncode}):\n{tail}")


def draw(strategy, count: int) -> list:
    """`count` examples of `strategy`, drawn by hypothesis (generation only, no shrinking), to send
    to a 0.5.14 child in one payload: one child start for all of them."""
    from hypothesis import Phase, given, settings

    out: list = []

    @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate])
    @given(strategy)
    def collect(example):
        out.append(example)

    collect()
    return out
