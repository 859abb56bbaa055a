"""`hicache trace write` and `hicache trace read`: one prompt's path, step by step."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from hicache_ops.errors import InputError

from ..options import (
    CacheSaltOption,
    ExtraBackendTagOption,
    ExtraKeyOption,
    JsonOption,
    LineOption,
    ModelNameOption,
    PageSizeOption,
    SglangVersionOption,
    TextOption,
    TokenizerOption,
    TokensFileOption,
    TokensOption,
)
from ..output import native_stderr_to_file, reporting, stderr, stdout

_STYLE = {"PASS": "green", "FAIL": "bold red", "INFO": "cyan", "SKIP": "yellow"}

InjectOption = Annotated[
    str | None,
    typer.Option(
        "--inject",
        help="Reproduce a known failure (embedded only): missing-v, tp-rank-mismatch, salt-mismatch, "
        "version-mismatch, below-threshold, write-back-no-eviction, prefetch-timeout, corrupted-object.",
        show_default=False,
    ),
]
ServeOption = Annotated[
    str | None,
    typer.Option("--serve", help="Trace on a running `hicache serve` (URL) instead of an embedded engine.", show_default=False),
]
StepOption = Annotated[bool, typer.Option("--step", help="Wait for Enter between steps (an interactive walk).")]


def _render_step(step: dict) -> None:
    status = step["status"]
    stdout.print(
        f"[bold]{step['step']:>2}. {step['name']}[/]  [{_STYLE.get(status, '')}]{status}[/]  "
        f"{step['summary']}  [dim]({step['elapsed_ms']:.1f} ms)[/]",
        highlight=False,
    )
    if step.get("invariant"):
        stdout.print(f"      [dim]checks:[/] {step['invariant']}", highlight=False)
    if step.get("state"):
        stdout.print(f"      [dim]state:[/]  {step['state']}", highlight=False)
    for cause in step.get("causes", []):
        stdout.print(f"      [yellow]-[/] {cause}", highlight=False)


def _emit_step(step: dict, json_output: bool, interactive: bool) -> None:
    if json_output:
        record = {k: step[k] for k in ("step", "name", "status", "detail", "elapsed_ms")}
        record.update(summary=step["summary"], causes=step["causes"])
        sys.stdout.write(json.dumps(record, default=str) + "\n")
        sys.stdout.flush()
    else:
        _render_step(step)
    if interactive and step["status"] not in ("FAIL",):
        stderr.print("[dim]Enter for the next step...[/]", end="")
        sys.stdin.readline()


def _trace(kind: str, prompt_args: dict, engine_args: dict, extra_key, cache_salt, inject, serve_url, flush, step, json_output) -> None:
    with reporting(json_output):
        from hicache_ops.tokens import load_prompt

        prompt = load_prompt(**prompt_args)
        extra_key = extra_key if extra_key is not None else prompt.extra_key
        cache_salt = cache_salt if cache_salt is not None else prompt.cache_salt
        if serve_url is not None:
            if inject is not None:
                raise InputError("--inject works with the embedded engine only, not with --serve.")
            from hicache_ops.server.client import ServeClient

            with ServeClient(serve_url, timeout_s=120) as client:
                run = client.trace(kind, prompt.input_ids, extra_key, cache_salt, flush=flush)
            for s in run["steps"]:
                _emit_step(s, json_output, step)
        else:
            if flush:
                raise InputError("--flush applies to --serve; the embedded engine starts empty.")
            from hicache_ops.trace.run import check_fault, run_embedded

            check_fault(kind, inject)
            spec = _spec(**engine_args)
            with native_stderr_to_file(None, "trace_mooncake.log"):
                run = run_embedded(
                    kind, prompt.input_ids, spec, extra_key=extra_key, cache_salt=cache_salt, inject=inject,
                    on_step=lambda s: _emit_step(s.to_json(), json_output, step),
                ).to_json()
        failed = run["failed_step"]
        if failed is not None:
            if not json_output:
                stdout.print(f"\n[bold red]The {kind} path stops at step {failed['step']} ({failed['name']}).[/]", highlight=False)
            raise typer.Exit(1)
        if not json_output:
            stdout.print(f"\n[green]The {kind} path completed: every step's check holds.[/]", highlight=False)


def _spec(preset, page_size, device_tokens, tp_size, sglang_version, model_name, extra_backend_tag, write_policy, stop_policy, prefetch_threshold, layout):
    from hicache_ops.engine.builder import EngineSpec
    from hicache_ops.sglang.geometry import preset as load_preset
    from hicache_ops.sglang.versions import default_version, validate_version

    spec = EngineSpec(
        geometry=load_preset(preset), page_size=page_size, device_tokens=device_tokens, tp_size=tp_size,
        sglang_version=validate_version(sglang_version or default_version()), model_name=model_name,
        extra_backend_tag=extra_backend_tag, write_policy=write_policy, stop_policy=stop_policy,
        prefetch_threshold=prefetch_threshold, layout=layout,
    )
    spec.cache_config(spec.host_layout(mooncake=True))  # validate before starting a master
    return spec


def _command(kind: str):
    def command(
        tokens: TokensOption = None,
        tokens_file: TokensFileOption = None,
        line: LineOption = None,
        text: TextOption = None,
        tokenizer: TokenizerOption = None,
        extra_key: ExtraKeyOption = None,
        cache_salt: CacheSaltOption = None,
        serve: ServeOption = None,
        flush: Annotated[bool, typer.Option("--flush", help="With --serve: flush L1/L2 first.")] = False,
        inject: InjectOption = None,
        step: StepOption = False,
        page_size: PageSizeOption = 16,
        preset: Annotated[str, typer.Option("--preset", help="Embedded engine geometry preset.")] = "tiny",
        device_tokens: Annotated[int, typer.Option("--device-tokens", help="Embedded L1 tokens per rank.")] = 4096,
        tp_size: Annotated[int, typer.Option("--tp-size", help="Embedded engine TP ranks.")] = 1,
        sglang_version: SglangVersionOption = None,
        model_name: ModelNameOption = "hicache/tiny",
        extra_backend_tag: ExtraBackendTagOption = None,
        write_policy: Annotated[str, typer.Option("--hicache-write-policy", help="Embedded write policy.")] = "write_through",
        stop_policy: Annotated[
            str, typer.Option("--hicache-storage-prefetch-policy", help="Embedded prefetch stop policy (SGLang's default: timeout).")
        ] = "timeout",
        prefetch_threshold: Annotated[int, typer.Option("--prefetch-threshold", help="Embedded prefetch threshold.")] = 256,
        layout: Annotated[str, typer.Option("--hicache-mem-layout", help="Embedded host layout.")] = "page_first",
        json_output: JsonOption = False,
    ) -> None:
        _trace(
            kind,
            dict(tokens=tokens, tokens_file=tokens_file, line=line, text=text, tokenizer=tokenizer),
            dict(preset=preset, page_size=page_size, device_tokens=device_tokens, tp_size=tp_size,
                 sglang_version=sglang_version, model_name=model_name, extra_backend_tag=extra_backend_tag,
                 write_policy=write_policy, stop_policy=stop_policy, prefetch_threshold=prefetch_threshold, layout=layout),
            extra_key, cache_salt, inject, serve, flush, step, json_output,
        )

    command.__doc__ = {
        "write": "Trace a prompt from device slots to verified Mooncake objects, step by step.",
        "read": "Trace a prompt from the local match through L3 to verified device bytes, step by step.",
    }[kind]
    return command


write = _command("write")
read = _command("read")

