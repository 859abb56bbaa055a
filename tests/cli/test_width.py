"""Human output at COLUMNS=100: the verdict first, no line wider than the terminal, no command or
diagnosis cut short ('…'), and long listings cut to a screenful with a pointer to --all. Every
--help at 80 and 100 columns: no option name cut, no line wider than the terminal.

Each command runs as a real process (Rich reads COLUMNS when the console starts) against a real
serve where it needs one."""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest
import typer

from cli_runner import hicache, leaf_commands
from hicache_ops.cli.main import app
from hicache_ops.commands.playbook import list_playbooks, load_playbook
from serve_process import HICACHE

WIDTH = 100
SERVE_ARGS = ("--device-tokens", "2048", "--page-size", "16", "--prefetch-threshold", "32")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(WIDTH)}
    return subprocess.run([HICACHE, *args], capture_output=True, text=True, env=env, timeout=120)


def assert_fits(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= WIDTH, f"{len(line)} columns: {line!r}"
        assert "…" not in line, f"cut: {line!r}"


def flat(text: str) -> str:
    """The text with its wrapping undone, to look for a whole sentence in it."""
    return " ".join(text.split())


def column(text: str, index: int) -> str:
    """One table column's cells, read top to bottom and joined (a wrapped cell reads whole again)."""
    cells = [line.split("│")[index + 1].strip() for line in text.splitlines() if line.startswith("│")]
    return " ".join(cells)


@pytest.fixture(scope="module")
def serve(shared_serve):
    # The session's serve for these arguments (tests/cli/test_width.py and
    # tests/warm/test_interrupt_and_silence.py share it): each test's prompts have seeds of its own.
    return shared_serve(*SERVE_ARGS)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """30 prompts, one too short for a page (a long note in its row)."""
    path = tmp_path_factory.mktemp("width-prompts") / "prompts-with-a-long-file-name.jsonl"
    rng = np.random.default_rng(14)
    with open(path, "w") as f:
        for i in range(30):
            f.write(json.dumps({"input_ids": rng.integers(0, 60_000, size=5 if i == 3 else 100).tolist()}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def long_prompt(tmp_path_factory):
    path = tmp_path_factory.mktemp("width-long") / "long.jsonl"
    ids = np.random.default_rng(128).integers(0, 60_000, size=128 * 1024).tolist()
    path.write_text(json.dumps({"input_ids": ids}) + "\n")
    return str(path)


def test_warm_leads_with_its_verdict_and_shows_a_screenful(serve, prompts):
    result = run("warm", prompts, "--serve", serve.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("complete:"), result.stdout
    assert_fits(result.stdout)
    assert "10 more prompts (use --all or --json)" in result.stdout
    # The short prompt's row comes first, its note whole.
    assert "5 tokens are less than one page of 16: it produces no page" in column(result.stdout, 6)
    everything = run("warm", prompts, "--serve", serve.url, "--all")
    assert_fits(everything.stdout)
    assert "more prompts" not in everything.stdout
    names = column(everything.stdout, 0).replace(" ", "")
    assert all(f"prompts-with-a-long-file-name.jsonl:{n}" in names for n in range(1, 31))


def test_prefetch_table_fits_and_keeps_details_behind_all(serve, prompts):
    assert run("warm", prompts, "--serve", serve.url).returncode == 0
    result = run("prefetch", prompts, "--serve", serve.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith("verified:"), result.stdout
    assert_fits(result.stdout)
    assert "10 more prompts (use --all or --json)" in result.stdout
    assert "timeout budget s" not in result.stdout
    everything = run("prefetch", prompts, "--serve", serve.url, "--all")
    assert_fits(everything.stdout)
    assert "timeout budget s" in everything.stdout and "more prompts" not in everything.stdout


def test_inspect_keys_of_128k_tokens_is_a_screenful(long_prompt):
    result = run("inspect", "keys", "--tokens-file", long_prompt, "--model-name", "Qwen/Qwen3-8B", "--tp-size", "2")
    assert result.returncode == 0, result.stderr
    assert_fits(result.stdout)
    assert len(result.stdout.splitlines()) <= 25
    assert "2044 more pages (use --all or --json)" in result.stdout  # 2048 pages of 64, 4 shown


def test_inspect_keys_live_diff_puts_the_verdict_first(serve, long_prompt):
    metrics = serve.info["master_metrics_address"]
    result = run(
        "inspect",
        "keys",
        "--tokens-file",
        long_prompt,
        "--page-size",
        "16",
        "--model-name",
        "hicache/tiny",
        "--master",
        metrics,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("incomplete: contiguous prefix 0/8192 pages"), result.stdout
    assert_fits(result.stdout)
    assert "more pages (use --all or --json)" in result.stdout


@pytest.mark.parametrize("name", [book.name for book in list_playbooks()])
def test_playbook_show_wraps_and_never_cuts(name):
    result = run("playbook", "show", name)
    assert result.returncode == 0, result.stderr
    assert_fits(result.stdout)
    shown = flat(result.stdout)
    for check in load_playbook(name).checks:
        for text in (check.run, check.diagnosis, check.fix):
            assert " ".join(text.split()) in shown, text


HELP_PATHS = sorted(leaf_commands()) + ["", "inspect", "bench", "trace", "playbook", "te", "lab"]


def option_names(path: str) -> list[str]:
    """Every option name (and alias, and --no- form) a command's --help lists, from Click's own params."""
    command = typer.main.get_command(app)
    for word in path.split():
        command = command.commands[word]
    return [
        name
        for param in command.get_params(command.make_context(path or "hicache", ["--help"], resilient_parsing=True))
        if param.param_type_name == "option" and not param.hidden
        for name in (*param.opts, *param.secondary_opts)
    ]


@pytest.mark.parametrize("columns", [80, 100])
@pytest.mark.parametrize("path", HELP_PATHS)
def test_help_never_cuts_an_option_name_and_wraps_its_prose(path, columns):
    # In-process: CliRunner sets COLUMNS in the environment Rich's console reads when help renders.
    result = hicache([*path.split(), "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    text = result.stdout
    for line in text.splitlines():
        assert len(line) <= columns, f"{len(line)} columns: {line!r}"
    assert not re.search(r"-[\w-]*…", text), [line for line in text.splitlines() if "…" in line]
    assert "…" not in text, [line for line in text.splitlines() if "…" in line]
    names = option_names(path)
    assert "--help" in names, names
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{name} not whole at {columns}:\n{text}"
