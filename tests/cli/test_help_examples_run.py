"""Every --help example that needs nothing outside this machine runs as pasted: a real `hicache`
process in a folder holding the files the examples name, against a serve this test starts (the
examples' http://127.0.0.1:18080 becomes its URL). It may find a problem (exit 1) but never
refuse its own flags (2) or miss a service (3). The rest are listed with what they need."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from cli_runner import hicache, leaf_commands
from hicache_ops.cli.common.help import example_commands
from serve_process import HICACHE, Serve

EXAMPLE_URL = "http://127.0.0.1:18080"

# What an example needs that this test does not provide: matched against the command text.
NEEDS = [
    ("sudo ", "root and network namespaces (hicache lab)"),
    ("hicache lab status", "a lab that is up (sudo hicache lab up)"),
    ("10.0.0.", "a real deployment's hosts"),
    ("--sglang-url", "an SGLang server"),
    ("--device cuda", "a CUDA GPU"),
    ("hicache serve", "it runs until stopped (the serve tests start it)"),
    ("@launch-flags.txt", "the deployment's launch flags"),
    ("@extra.json", "the deployment's extra-config"),
    ("hicache-tap", "a recording from a live server under the tap"),
    ("trace.jsonl", "a request trace (tests/bench run replay on one)"),
    ("hicache bench keys", "minutes of CPU (tests/bench)"),
    ("hicache bench kernels", "minutes of CPU (tests/bench)"),
    ("hicache bench store", "minutes of CPU (tests/bench)"),
    ("hicache bench multiturn --clients", "minutes of CPU (tests/bench)"),
    ("hicache bench multiturn --accounting-only --hicache", "minutes of CPU (tests/bench)"),
    ("--inject prefetch-timeout", "a minute of injected L3 latency (tests/trace)"),
]


def all_examples() -> list[str]:
    found: list[str] = []
    for path in ["", *sorted({" ".join(p.split()[:1]) for p in leaf_commands()}), *sorted(leaf_commands())]:
        result = hicache([*path.split(), "--help"], env={"COLUMNS": "100"})
        for command in example_commands(result.stdout):
            if command not in found:
                found.append(command)
    return found


def needs(command: str) -> str | None:
    return next((why for pattern, why in NEEDS if pattern in command), None)


EXAMPLES = all_examples()
RUNNABLE = [c for c in EXAMPLES if needs(c) is None]


def test_every_example_is_run_or_says_what_it_needs():
    assert len(RUNNABLE) >= 20, RUNNABLE
    for command in EXAMPLES:
        assert command in RUNNABLE or needs(command), command


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("examples")
    prompt = {"input_ids": list(range(1000, 1000 + 512))}
    (folder / "prompt.jsonl").write_text(json.dumps(prompt) + "\n")
    (folder / "prompts.jsonl").write_text(
        "".join(json.dumps({"input_ids": list(range(n, n + 300))}) + "\n" for n in (0, 5000))
    )
    (folder / "mooncake.json").write_text(json.dumps({"master_server_address": "127.0.0.1:50051"}))
    return folder


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("examples-serve"), "--device-tokens", "2048")
    yield s
    s.stop()


@pytest.mark.parametrize("command", RUNNABLE)
def test_example_runs_as_pasted(command, workdir, serve):
    words = shlex.split(command.replace(EXAMPLE_URL, serve.url))
    env = {**os.environ, "HICACHE_SERVE": serve.url}  # the default --serve of the commands that take one
    while "=" in words[0]:  # a leading NAME=VALUE is the shell's environment for the command
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "hicache"
    proc = subprocess.run(
        [HICACHE, *words[1:]],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode in (0, 1), f"{command}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
