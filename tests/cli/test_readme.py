"""The commands of the README and of every docs page run, so the docs cannot drift from the code.

Every ```bash block that holds a `.venv/bin/hicache` or `make` command is run line by line, the
README first, then docs/cli/ and the other docs pages (PAGES, then any other page with such a block),
each page in its own order, all in one temporary folder (a later block may use a file an earlier one
wrote), against a serve this test starts with `make serve`'s settings; the pages' addresses are
replaced by that serve's. A block that needs what this machine lacks (a GPU, root) is marked by a
`<!-- not run: REASON -->` line right above its fence, and is not run. A command must end with
exit 0, or with the code its trailing `# exit N` comment states. The lines around the commands
(writing a prompt file, `export`, a `curl` to the serve) run too and must succeed. Transcripts
(```console blocks, `$ ` prompts, outputs) are not commands and are not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from serve_process import HICACHE, Serve

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Run in this order after the README: the order of the sections they were before they left it.
PAGES = [
    "docs/cli/inspect.md",
    "docs/cli/tap.md",
    "docs/cli/te.md",
    "docs/cli/serve.md",
    "docs/cli/trace.md",
    "docs/cli/warm.md",
    "docs/cli/playbook.md",
    "docs/cli/lab.md",
    "docs/benchmarks.md",
]
NOT_RUN_MARK = re.compile(r"<!--\s*not run:\s*(\S.*?)\s*-->")
COMMAND_PREFIXES = (".venv/bin/hicache", "make")

# Commands this test does not run, each with the reason.
NOT_RUN = {
    "make serve": "runs until stopped; the test starts the same serve itself (tests/serve_process.py)",
    "make test": "recursive: it runs this test suite, this test included",
    "make gpu-check": "needs a CUDA host and runs for minutes (scripts/gpu_check.py)",
    "make install": "installs system and Python packages; the test environment is already installed",
}


def pages() -> list[Path]:
    """The README, PAGES, then every other docs page with a block of commands."""
    listed = [README, *(ROOT / p for p in PAGES)]
    others = sorted(p for p in (ROOT / "docs").rglob("*.md") if p not in listed and page_lines(p))
    return listed + others


def page_lines(page: Path, skipped: list[str] | None = None) -> list[tuple[int, str]]:
    """(line number, logical line) of every ```bash block holding a command, continuations joined;
    a block under a `<!-- not run: ... -->` line is left out (its reason appended to `skipped`)."""
    found: list[tuple[int, str]] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("```bash", "```sh"):
            mark = NOT_RUN_MARK.search(lines[i - 1]) if i else None
            block: list[tuple[int, str]] = []
            i += 1
            while lines[i].strip() != "```":
                start, text = i + 1, lines[i]
                while text.endswith("\\"):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                if text.strip() and not text.lstrip().startswith("#"):
                    block.append((start, text.strip()))
                i += 1
            if any(text.startswith(COMMAND_PREFIXES) for _, text in block):
                if mark is None:
                    found.extend(block)
                elif skipped is not None:
                    skipped.append(mark.group(1))
        i += 1
    return found


def readme_lines() -> list[tuple[int, str]]:
    return page_lines(README)


def expected_exit(line: str) -> int:
    match = re.search(r"#\s*exit (\d+)", line)
    return int(match.group(1)) if match else 0


def not_run_reason(line: str) -> str | None:
    words = shlex.split(line, comments=True)
    return NOT_RUN.get(" ".join(words[:2])) if words and words[0] == "make" else None


def test_readme_has_commands_to_run():
    lines = [text for _, text in readme_lines()]
    assert sum(text.startswith(".venv/bin/hicache") for text in lines) >= 3
    assert any(not_run_reason(text) for text in lines)  # the skip list matches the README's make lines
    every = [text for page in pages() for _, text in page_lines(page)]
    assert sum(text.startswith(".venv/bin/hicache") for text in every) >= 10
    for page in PAGES:
        assert (ROOT / page).exists(), page


def test_not_run_mark_leaves_out_only_its_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs a CUDA GPU -->\n```bash\n.venv/bin/hicache bench kernels --device cuda\n```\n\n"
        "```bash\n.venv/bin/hicache --help\n```\n"
    )
    skipped: list[str] = []
    assert page_lines(page, skipped) == [(7, ".venv/bin/hicache --help")]
    assert skipped == ["needs a CUDA GPU"]


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    s = Serve(tmp_path_factory.mktemp("readme-serve"))  # `make serve`: no flags
    yield s
    s.stop()


def test_every_readme_command_ends_with_its_exit_code(serve, tmp_path):
    config = serve.info
    substitutions = {
        "http://127.0.0.1:18080": serve.url,
        "127.0.0.1:18080": f"127.0.0.1:{serve.port}",
        "10.0.0.1:9003": config["master_metrics_address"],
        "10.0.0.1:50051": config["master_rpc_address"],
        "/var/tmp/": f"{tmp_path}/",
        ".venv/bin/hicache": HICACHE,
    }
    # TMPDIR: what a command keeps in a temporary folder (te check --live keeps its child's log) stays
    # in this test's folder.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")} | {"TMPDIR": str(tmp_path)}
    ran = 0
    lines = [(page, number, line) for page in pages() for number, line in page_lines(page)]
    for page, number, line in lines:
        if not_run_reason(line):
            continue
        command = line
        for readme_value, here in substitutions.items():
            command = command.replace(readme_value, here)
        if command.startswith("export "):
            name, _, value = command.removeprefix("export ").partition("=")
            env[name] = shlex.split(value, comments=True)[0]
            continue
        # stdin at EOF: an interactive walk (--step) goes on without waiting for Enter.
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
        )
        want = expected_exit(line)
        assert result.returncode == want, (
            f"{page.relative_to(ROOT)}:{number}: exit {result.returncode}, expected {want}\n{line}\n"
            f"stdout: {result.stdout[-2000:]}\nstderr: {result.stderr[-2000:]}"
        )
        ran += line.startswith(COMMAND_PREFIXES)
    assert ran >= 10
