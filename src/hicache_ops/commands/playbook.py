"""On-call playbooks: Markdown files whose checks are runnable `hicache` commands.

A playbook is a Markdown file (playbooks/*.md): a `# Title`, a `**Symptom:**` line, prose for
people, and ordered checks. Each check is a fenced block with the info string `check`:

    ```check
    run: hicache trace read --serve {serve} --tokens-file {prompt} --json
    when: failed_step.name == "prefetch decision"
    diagnosis: The unmatched suffix is shorter than the prefetch threshold, so L3 is never asked.
    evidence: failed_step.summary
    fix: Lower extra-config prefetch_threshold, or expect no L3 hit for short prompts.
    ```

`run` is one hicache command line with {placeholders} (the run's variables: serve, master, rpc,
config, prompt, server_args, serve_* values read from the serve's /v1/stats, and opt_* ones that
may be empty, such as opt_try_namespaces from --try-extra-key/--try-cache-salt); its stdout is
read as JSON (or JSON lines, collected as {"steps": [...], "failed_step": ...}) with "exit"
added. `when` is a condition on that JSON; several `when` lines mean any of them. A check whose
condition holds is a finding: the run stops there and prints the diagnosis, the evidence (the
values of the listed paths) and the fix. Conditions:

    PATH OP VALUE [and PATH OP VALUE ...]     OP: == != < <= > >= contains
    PATH: dotted names with [N] or [*] (a list: == and contains hold if any element does)
    VALUE: a JSON literal ("text", 3, true, null)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.errors import InputError, SettingError
from hicache_ops.results import Result
from hicache_ops.sglang.launch import parse_server_args
from hicache_ops.sglang.versions import default_version

# -------------------------------------------------------------------------------------------
# Parsing
# -------------------------------------------------------------------------------------------


@dataclass
class Check:
    title: str
    run: str
    when: list[str]
    diagnosis: str
    fix: str
    evidence: list[str] = field(default_factory=list)

    def placeholders(self) -> set[str]:
        return set(re.findall(r"\{(\w+)\}", self.run))


@dataclass
class Playbook:
    name: str
    title: str
    symptom: str
    text: str
    checks: list[Check]


_FENCE = re.compile(r"^```check\s*$(.*?)^```\s*$", re.M | re.S)


def parse_playbook(name: str, text: str) -> Playbook:
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), name)
    found = re.search(r"\*\*Symptom:\*\*(.*?)(?:\n\s*\n|\Z)", text, re.S)
    symptom = " ".join(found.group(1).split()) if found else ""
    checks: list[Check] = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^###\s+(.*)$", before, re.M)
        fields: dict[str, list[str]] = {}
        for line in match.group(1).strip().splitlines():
            if not line.strip():
                continue
            key, sep, value = line.partition(":")
            if not sep:
                raise InputError(f"playbook {name}: the check line {line!r} has no 'key: value'.")
            fields.setdefault(key.strip(), []).append(value.strip())
        for required in ("run", "when", "diagnosis", "fix"):
            if required not in fields:
                raise InputError(
                    f"playbook {name}: a check under {headings[-1] if headings else 'the top'!r} lacks {required}:."
                )
        for cond in fields["when"]:
            parse_condition(cond)  # fail early on a bad condition
        evidence = [p.strip() for e in fields.get("evidence", []) for p in e.split(",") if p.strip()]
        checks.append(
            Check(
                headings[-1] if headings else f"check {len(checks) + 1}",
                fields["run"][0],
                fields["when"],
                fields["diagnosis"][0],
                fields["fix"][0],
                evidence,
            )
        )
    if not checks:
        raise InputError(f"playbook {name} has no ```check blocks.")
    return Playbook(name, title, symptom, text, checks)


def _folder():
    return resources.files("hicache_ops.playbooks")


def list_playbooks() -> list[Playbook]:
    out = []
    for entry in sorted(_folder().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".md") and entry.name != "README.md":
            out.append(parse_playbook(entry.name[:-3], entry.read_text(encoding="utf-8")))
    return out


def load_playbook(name: str) -> Playbook:
    names = [p.name for p in list_playbooks()]
    if name not in names:
        raise InputError(f"no playbook named {name!r}.", hint=f"Known playbooks: {', '.join(names)}.")
    entry = _folder() / f"{name}.md"
    return parse_playbook(name, entry.read_text(encoding="utf-8"))


# -------------------------------------------------------------------------------------------
# Conditions
# -------------------------------------------------------------------------------------------

_COND = re.compile(r"^\s*([A-Za-z_][\w.\[\]*]*)\s*(==|!=|<=|>=|<|>|contains)\s*(.+?)\s*$")
_MISSING = object()


def parse_condition(text: str) -> list[tuple[str, str, object]]:
    terms = []
    for part in re.split(r"\s+and\s+", text.strip()):
        m = _COND.match(part)
        if not m:
            raise InputError(f"condition {part!r} is not PATH OP VALUE.")
        path, op, raw = m.groups()
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise InputError(f"condition {part!r}: {raw!r} is not a JSON literal (quote strings).") from None
        terms.append((path, op, value))
    return terms


def resolve_path(data: object, path: str) -> object:
    """The value at `path`; a list where [*] was used; _MISSING when absent."""
    tokens = re.findall(r"[A-Za-z_]\w*|\[\*\]|\[\d+\]", path)
    values, spread = [data], False
    for tok in tokens:
        nxt = []
        for v in values:
            if tok == "[*]":
                if isinstance(v, list):
                    nxt.extend(v)
                spread = True
            elif tok.startswith("["):
                i = int(tok[1:-1])
                if isinstance(v, list) and -len(v) <= i < len(v):
                    nxt.append(v[i])
            elif isinstance(v, dict) and tok in v:
                nxt.append(v[tok])
        values = nxt
    if spread:
        return values
    return values[0] if values else _MISSING


def _compare(actual: object, op: str, expected: object) -> bool:
    if actual is _MISSING:
        return False
    if op == "contains":
        if isinstance(actual, (list, str)):
            return expected in actual
        return False
    if isinstance(actual, list):  # [*]: any element
        return any(_compare(a, op, expected) for a in actual)
    # Values read from JSON: an order between unlike types raises TypeError, answered below.
    a: Any = actual
    try:
        return {
            "==": actual == expected,
            "!=": actual != expected,
            "<": a < expected,
            "<=": a <= expected,
            ">": a > expected,
            ">=": a >= expected,
        }[op]
    except TypeError:
        return False


def holds(condition: str, data: object) -> bool:
    return all(_compare(resolve_path(data, path), op, value) for path, op, value in parse_condition(condition))


# -------------------------------------------------------------------------------------------
# Running
# -------------------------------------------------------------------------------------------


class PlaybookSummary(Result):
    """One row of `hicache playbook list --json` (a list of them)."""

    name: str = Field(description="the playbook's name (`hicache playbook run NAME`)")
    title: str = Field(description="its title")
    symptom: str = Field(description="the symptom it diagnoses")
    checks: int = Field(description="how many checks it runs")


class CheckSpec(Result):
    title: str = Field(description="the check's title")
    run: str = Field(description="the `hicache` command it runs, with {placeholders}")
    when: list[str] = Field(description="conditions on the command's JSON; any that holds is a finding")
    diagnosis: str = Field(description="what a finding means")
    fix: str = Field(description="what to do about it")
    evidence: list[str] = Field(description="JSON paths quoted as evidence with a finding")


class PlaybookShowResult(Result):
    """`hicache playbook show --json`."""

    name: str = Field(description="the playbook's name")
    title: str = Field(description="its title")
    symptom: str = Field(description="the symptom it diagnoses")
    markdown: str = Field(description="the playbook page itself")
    checks: list[CheckSpec] = Field(description="its checks, in order")


class CheckOutcome(Result):
    title: str = Field(description="the check's title")
    status: Literal["finding", "clear", "skipped", "error"] = Field(
        description="finding: its condition holds; clear: it does not; skipped: a placeholder has no value; "
        "error: the command could not run"
    )
    command: str = Field(description="the command run, placeholders filled")
    exit: int | None = Field(None, description="the command's exit code (`null` when skipped)")
    note: str = Field("", description="why it was skipped, or the command's error")


class Finding(Result):
    check: str = Field(description="the check that found it")
    diagnosis: str = Field(description="what it means")
    evidence: dict[str, Any] = Field(description="JSON path -> the value the command reported")
    fix: str = Field(description="what to do about it")
    command: str = Field(description="the command that shows it again")


class PlaybookRun(Result):
    """`hicache playbook run --json`."""

    name: str = Field(description="the playbook's name")
    title: str = Field(description="its title")
    symptom: str = Field(description="the symptom it diagnoses")
    status: Literal["finding", "pass", "incomplete"] = Field(
        description="finding: a check found the cause; pass: every check clear; incomplete: a check could not run "
        "or the run was stopped"
    )
    finding: Finding | None = Field(None, description="the first finding, `null` when none")
    interrupted: str | None = Field(None, description="the signal that stopped the run, `null` when it finished")
    checks: list[CheckOutcome] = Field(default_factory=list, description="every check run, in order")


def summary(book: Playbook) -> PlaybookSummary:
    return PlaybookSummary(name=book.name, title=book.title, symptom=book.symptom, checks=len(book.checks))


def show_result(book: Playbook) -> PlaybookShowResult:
    return PlaybookShowResult(
        name=book.name,
        title=book.title,
        symptom=book.symptom,
        markdown=book.text,
        checks=[CheckSpec(**dataclasses.asdict(c)) for c in book.checks],
    )


def _hicache_argv() -> list[str]:
    script = Path(sys.executable).with_name("hicache")
    if script.exists():
        return [str(script)]
    found = shutil.which("hicache")
    if found:
        return [found]
    return [sys.executable, "-m", "hicache_ops.cli"]


def serve_variables(serve_url: str, timeout_s: float = 3.0) -> dict[str, str]:
    """serve_* placeholders from a serve instance's configuration, and its master address."""
    from hicache_ops.server.client import ServeClient

    with ServeClient.open(serve_url, timeout_s=timeout_s) as client:
        stats = client.stats()
    config = stats["config"]
    scheme = [
        "--page-size",
        str(config["page_size"]),
        "--sglang-version",
        config["sglang_version"],
        "--tp-size",
        str(config["tp_size"]),
        "--layout",
        config["host_layout"],
    ]
    if config["model_name"]:
        scheme += ["--model-name", config["model_name"]]
    if config["extra_backend_tag"]:
        scheme += ["--extra-backend-tag", config["extra_backend_tag"]]
    if config["geometry"]["attention"] == "mla":
        scheme.append("--mla")
    out = {
        "serve_scheme": shlex.join(scheme),
        "serve_version": config["sglang_version"],
        "serve_page_size": str(config["page_size"]),
        "serve_write_policy": config["write_policy"],
    }
    # The namespaces its requests used, and those other serves on its master used: a prompt missed
    # without one is tried under each (check "Namespace or salt mismatch") before "Never written"
    # blames routing.
    seen = stats.get("namespaces") or []
    if config.get("master_metrics_address"):  # and those every serve sharing its master marked there
        from hicache_ops.server.namespaces import namespaces_on_master

        shared = namespaces_on_master(config["master_metrics_address"], timeout_s)
        seen = seen + [{"extra_key": e, "cache_salt": c} for e, c in shared]
    tries = [arg for ns in seen if ns.get("extra_key") is not None for arg in ("--try-extra-key", ns["extra_key"])]
    tries += [arg for ns in seen if ns.get("cache_salt") for arg in ("--try-cache-salt", ns["cache_salt"])]
    out["opt_serve_namespaces"] = shlex.join(tries)
    if config.get("master_metrics_address"):
        out["master"] = config["master_metrics_address"]
    if config.get("master_rpc_address"):
        out["rpc"] = config["master_rpc_address"]
    return out


def _run_command(argv: list[str], timeout_s: float, env: dict | None) -> tuple[int, object]:
    """Run one check's command; a stop request ends it (SIGINT, then SIGKILL) and raises Interrupted."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stdout, _ = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if interrupt.requested() or time.monotonic() > deadline:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.communicate(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                interrupt.check("the playbook")
                return 124, {"error": {"message": f"timed out after {timeout_s:.0f} s"}}
    text = stdout.strip()
    data: object
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError:
        data = None
    if data is None or (isinstance(data, dict) and "step" in data):  # JSON lines, one per trace step
        steps = []
        for line in text.splitlines():
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        data = {"steps": steps, "failed_step": next((s for s in steps if s.get("status") == "FAIL"), None)}
    if isinstance(data, dict):
        data.setdefault("exit", proc.returncode)
    return proc.returncode, data


# What the user passes for each placeholder (serve_* and rpc come from --serve).
_OPTION_FOR = {
    "serve": "--serve",
    "master": "--master (or --serve)",
    "rpc": "--serve",
    "config": "--config",
    "prompt": "--prompt",
    "server_args": "--server-args",
}


def _option_for(placeholder: str) -> str:
    return _OPTION_FOR.get(
        placeholder, "--serve" if placeholder.startswith("serve_") else f"--{placeholder.replace('_', '-')}"
    )


def missing_options(check: Check, variables: dict[str, str]) -> list[str]:
    """The options a check needs that were not given (opt_* placeholders may be empty)."""
    missing = {_option_for(p) for p in check.placeholders() if not p.startswith("opt_") and not variables.get(p)}
    return sorted(missing)


def run_playbook(
    playbook: Playbook,
    variables: dict[str, str],
    *,
    timeout_s: float = 180.0,
    env: dict | None = None,
    on_check=None,
) -> PlaybookRun:
    """Run the checks in order; stop at the first finding (or a stop request: `interrupted`).

    A playbook none of whose checks can run with these variables is an InputError naming what is
    missing, raised before anything runs: "no finding" must mean the checks ran.
    """
    needs = [missing_options(check, variables) for check in playbook.checks]
    if all(needs):
        wanted = sorted({option for need in needs for option in need})
        raise InputError(
            f"playbook {playbook.name}: no check can run without {', '.join(wanted)}.",
            hint=f"See `hicache playbook show {playbook.name}`.",
        )
    run = PlaybookRun(name=playbook.name, title=playbook.title, symptom=playbook.symptom, status="pass")
    cache: dict[str, tuple[int, object]] = {}
    for check, missing in zip(playbook.checks, needs, strict=True):
        if interrupt.requested():
            run.interrupted = interrupt.reason()
            run.status = "incomplete"
            return run
        command = check.run
        if missing:
            outcome = CheckOutcome(
                title=check.title, status="skipped", command=command, note=f"needs {', '.join(missing)}"
            )
            run.checks.append(outcome)
            run.status = "incomplete" if run.status == "pass" else run.status
            if on_check:
                on_check(outcome)
            continue
        values = {p: "" for p in check.placeholders() if p.startswith("opt_")} | variables
        # Single values are quoted; serve_scheme and opt_* hold ready-made argument lists.
        quoted = {k: v if (k.startswith("opt_") or k == "serve_scheme") else shlex.quote(v) for k, v in values.items()}
        command = " ".join(check.run.format(**quoted).split())
        argv = shlex.split(command)
        if argv and argv[0] == "hicache":
            argv = _hicache_argv() + argv[1:]
        if command not in cache:
            try:
                cache[command] = _run_command(argv, timeout_s, env)
            except interrupt.Interrupted:
                run.interrupted = interrupt.reason()
                run.status = "incomplete"
                return run
        code, data = cache[command]
        if any(holds(cond, data) for cond in check.when):
            evidence = {path: resolve_path(data, path) for path in check.evidence}
            evidence = {k: (None if v is _MISSING else v) for k, v in evidence.items()}
            outcome = CheckOutcome(title=check.title, status="finding", command=command, exit=code)
            run.checks.append(outcome)
            run.status = "finding"
            run.finding = Finding(
                check=check.title, diagnosis=check.diagnosis, evidence=evidence, fix=check.fix, command=command
            )
            if on_check:
                on_check(outcome)
            return run
        note = ""
        if code not in (0, 1) and isinstance(data, dict) and isinstance(data.get("error"), dict):
            note = data["error"].get("message") or ""
            outcome = CheckOutcome(title=check.title, status="error", command=command, exit=code, note=note)
            run.status = "incomplete"
        else:
            outcome = CheckOutcome(title=check.title, status="clear", command=command, exit=code)
        run.checks.append(outcome)
        if on_check:
            on_check(outcome)
    return run


def _flag_pairs(arguments: str) -> list[tuple[str, str]]:
    """("--try-extra-key", "tenant-a") pairs of a ready-made argument list."""
    words = shlex.split(arguments)
    return list(zip(words[::2], words[1::2], strict=True))


def variables_from(
    serve: str | None,
    master: str | None,
    config: str | None,
    prompt: str | None,
    server_args: str | None,
    try_extra_keys: Sequence[str] = (),
    try_cache_salts: Sequence[str] = (),
    timeout_s: float = 3.0,
) -> dict[str, str]:
    """The run's variables, every input checked first (InputError, exit 2) and the serve asked last."""
    from hicache_ops.mooncake.net import parse_host_port
    from hicache_ops.server.client import check_http_url, check_timeout
    from hicache_ops.tokens import load_prompt

    check_timeout(timeout_s)
    values: dict[str, str] = {}
    tries = [arg for k in try_extra_keys for arg in ("--try-extra-key", k)]
    tries += [arg for s in try_cache_salts for arg in ("--try-cache-salt", s)]
    values["opt_try_namespaces"] = shlex.join(tries)
    if serve:
        check_http_url(serve, "--serve")
    if master:
        parse_host_port(master, what="--master")
        values["master"] = master
    if config:
        if not os.path.isfile(config):
            raise SettingError("config", f"{config!r} is not a file.")
        values["config"] = config
    if prompt:
        if prompt == "-":
            raise SettingError("prompt", "- (stdin) cannot be read by several checks; give a file.")
        if not os.path.isfile(prompt):
            raise SettingError(
                "prompt",
                f"{prompt!r} is not a file.",
                hint="A JSON array of token ids, or one JSONL line with input_ids.",
            )
        load_prompt(tokens_file=prompt)  # malformed or several prompts: one error now, not one per check
        values["prompt"] = prompt
    if server_args:
        # The te checks pass these flags on: bad quoting or a flag SGLang refuses is bad input now.
        parse_server_args(server_args, default_version())
        values["server_args"] = server_args
    if serve:
        values["serve"] = serve
        values.update({k: v for k, v in serve_variables(serve, timeout_s).items() if not (k == "master" and master)})
        # The serve's own namespaces join those given (--try-extra-key / --try-cache-salt), once each.
        pairs = _flag_pairs(values["opt_try_namespaces"]) + _flag_pairs(values.pop("opt_serve_namespaces"))
        values["opt_try_namespaces"] = shlex.join([arg for pair in dict.fromkeys(pairs) for arg in pair])
    return values
