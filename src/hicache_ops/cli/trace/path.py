"""`hicache trace write` and `hicache trace read`: one prompt's path, step by step."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    INPUT,
    AllowWritesOption,
    CacheSaltOption,
    DcpSizeOption,
    DeviceTokensOption,
    ExtraBackendTagOption,
    ExtraKeyOption,
    HostLayout,
    JsonOption,
    L3BandwidthOption,
    LayoutOption,
    LineOption,
    ModelNameOption,
    OptionalServeOption,
    PageSizeOption,
    PoolOption,
    PoolPresetOption,
    PrefetchThresholdOption,
    PresetOption,
    SglangVersionOption,
    StopPolicy,
    StopPolicyOption,
    TextOption,
    TimeoutOption,
    TokenizerOption,
    TokensFileOption,
    TokensOption,
    TpSizeOption,
    WritePolicy,
    WritePolicyOption,
)
from hicache_ops.cli.common.output import (
    json_data,
    native_stderr_to_file,
    print_wrapped,
    provenance_fields,
    reporting,
    stderr,
    stdout,
)
from hicache_ops.cli.common.sglang_url import option_flag, option_given, sglang_url_option
from hicache_ops.errors import InputError

if TYPE_CHECKING:
    from hicache_ops.commands.trace.tracer import Step

_STYLE = {"PASS": "green", "FAIL": "bold red", "INFO": "cyan", "SKIP": "yellow"}

InjectOption = Annotated[
    str | None,
    typer.Option(
        "--inject",
        help="Reproduce a known failure (embedded only): missing-v, tp-rank-mismatch, salt-mismatch, "
        "version-mismatch, below-threshold, write-back-no-eviction, prefetch-timeout, corrupted-object, "
        "missing-dcp-shard, dcp-mismatch, missing-side-object (with --pool/--pool-preset).",
        metavar="FAULT",
        show_default=False,
    ),
]
StepOption = Annotated[bool, typer.Option("--step", help="Wait for Enter between steps (an interactive walk).")]

WRITE_EXAMPLES = examples(
    "hicache trace write --tokens-file prompt.jsonl",
    "hicache trace write --tokens-file prompt.jsonl --inject write-back-no-eviction",
    "hicache trace write --tokens-file prompt.jsonl --serve http://127.0.0.1:18080 --json",
)
READ_EXAMPLES = examples(
    "hicache trace read --tokens-file prompt.jsonl --serve http://127.0.0.1:18080 --flush --allow-writes",
    "hicache trace read --tokens-file prompt.jsonl --inject prefetch-timeout --hicache-storage-prefetch-policy timeout",
    "hicache trace read --tokens-file prompt.jsonl --preset tiny-mla --tp-size 2 --dcp-size 2 --inject "
    "missing-dcp-shard --step",
)


def _render_step(step: Step) -> None:
    status = step.status
    print_wrapped(
        f"[bold]{step.step:>2}. {step.name}[/]  [{_STYLE.get(status, '')}]{status}[/]  "
        f"{step.summary}  [dim]({step.elapsed_ms:.1f} ms)[/]",
        4,
    )
    if step.invariant:
        print_wrapped(f"[dim]checks:[/] {step.invariant}", 6)
    if step.state:
        print_wrapped(f"[dim]state:[/]  {step.state}", 6)
    pages = step.detail.get("dcp_pages", [])
    for page in pages[:_DCP_PAGES_SHOWN]:
        for shard in page["shards"]:
            positions = shard["token_positions"]
            stdout.print(
                f"      page {page['page']}  DCP rank {shard['dcp_rank']}: tokens {_span(positions)} "
                f"-> {shard['object_key']}",
                soft_wrap=True,
            )
    if len(pages) > _DCP_PAGES_SHOWN:
        stdout.print(f"      [dim]... {len(pages) - _DCP_PAGES_SHOWN} more page(s) in --json[/]")
    for cause in step.causes:
        print_wrapped(f"[yellow]-[/] {cause}", 6)


def _verdict(kind: str, steps: list[Step]) -> None:
    """The answer in one line: where the path stops, or that it completed."""
    failed = next((s for s in steps if s.status == "FAIL"), None)
    if failed is not None:
        print_wrapped(f"[bold red]The {kind} path stops at step {failed.step} ({failed.name}).[/]")
    else:
        print_wrapped(f"[green]The {kind} path completed: every step's check holds.[/]")


_DCP_PAGES_SHOWN = 2


def _span(positions: list[int]) -> str:
    """Prompt positions of a shard's tokens: `16,18,..,30` (every dcp-th one)."""
    if len(positions) <= 3:
        return ",".join(map(str, positions))
    return f"{positions[0]},{positions[1]},..,{positions[-1]}"


def _emit_step(step: Step, json_output: bool, interactive: bool, extras: dict[str, Any]) -> None:
    """--json: the step's record at once; --step: the step at once, then wait for Enter; otherwise the
    step waits for the verdict, which comes first. `extras` join the record (--sglang-url's fields, on the
    first record only)."""
    if json_output:
        record = {**json_data(step.record()), **extras}
        sys.stdout.write(json.dumps(record, default=str) + "\n")
        sys.stdout.flush()
    elif interactive:
        _render_step(step)
    if interactive and step.status != "FAIL":
        stderr.print("[dim]Enter for the next step...[/]", end="")
        sys.stdin.readline()


# The options of the prompt traced (tokens.load_prompt's arguments).
PROMPT_OPTIONS = ("tokens", "tokens_file", "line", "text", "tokenizer")


def _trace(ctx: typer.Context, kind: str) -> None:
    """One trace, from the command's options (ctx.params, after --sglang-url filled the ones not given)."""
    options = ctx.params
    json_output, step, flush, allow_writes = (options[n] for n in ("json_output", "step", "flush", "allow_writes"))
    inject, serve_url, timeout = options["inject"], options["serve"], options["timeout"]
    first_extras = [provenance_fields()]  # joins the first --json record
    with reporting(json_output):
        from hicache_ops.server.client import check_timeout
        from hicache_ops.tokens import load_prompt

        check_timeout(timeout)
        prompt = load_prompt(**{name: options[name] for name in PROMPT_OPTIONS})
        extra_key = options["extra_key"] if options["extra_key"] is not None else prompt.extra_key
        cache_salt = options["cache_salt"] if options["cache_salt"] is not None else prompt.cache_salt
        if serve_url is not None:
            if inject is not None:
                raise InputError("--inject works with the embedded engine only, not with --serve.")
            given = [option_flag(ctx, name) for name in ENGINE_OPTIONS if option_given(ctx, name)]
            if given:
                raise InputError(
                    f"{', '.join(given)} configure the embedded engine; with --serve the serve's own settings apply.",
                    hint="Drop them, or trace without --serve.",
                )
            if flush and not allow_writes:
                raise InputError(
                    "--flush drops the serve's L1 and L2: that changes the serve; pass --allow-writes if you mean it.",
                    hint="Without --allow-writes a trace on a serve observes the path and changes nothing.",
                )
            from hicache_ops import interrupt
            from hicache_ops.commands.trace.run import check_traceable
            from hicache_ops.server.client import ServeClient

            with ServeClient.open(serve_url, timeout_s=timeout) as client:
                check_traceable(prompt.input_ids, client.stats()["config"]["page_size"])
                with interrupt.stop_on_signals():
                    run = interrupt.call(
                        client.trace,
                        kind,
                        prompt.input_ids,
                        extra_key,
                        cache_salt,
                        flush=flush,
                        observe=not allow_writes,
                    )
            from hicache_ops.commands.trace.tracer import Step

            steps = [Step.model_validate(s) for s in run["steps"]]
            for s in steps:
                _emit_step(s, json_output, step, first_extras.pop() if first_extras else {})
        else:
            if flush:
                raise InputError("--flush applies to --serve; the embedded engine starts empty.")
            if allow_writes:
                raise InputError(
                    "--allow-writes applies to --serve; the embedded engine is a scratch instance of its own."
                )
            from hicache_ops.commands.trace.run import check_fault, run_embedded

            check_fault(kind, inject)
            spec = _spec(ctx)
            steps = []  # every step as it is made (an injected fault's scenario, step 0, included)

            def on_step(s: Step) -> None:
                steps.append(s)
                _emit_step(s, json_output, step, first_extras.pop() if first_extras else {})

            with native_stderr_to_file(None, "trace_mooncake.log"):
                run_embedded(
                    kind,
                    prompt.input_ids,
                    spec,
                    extra_key=extra_key,
                    cache_salt=cache_salt,
                    inject=inject,
                    on_step=on_step,
                )
        if not json_output:
            if step:  # the steps were shown as they were made: the answer follows them
                stdout.print()
                _verdict(kind, steps)
            else:
                _verdict(kind, steps)
                for s in steps:
                    _render_step(s)
        if any(s.status == "FAIL" for s in steps):
            raise typer.Exit(1)


def _spec(ctx: typer.Context):
    """The embedded engine the deployment options describe (geometry from --preset), checked before a master starts."""
    from hicache_ops.cli.common.deployment import deployment_settings, side_pools
    from hicache_ops.cli.common.options import l3_bandwidth_bytes_s
    from hicache_ops.engine.builder import EngineSpec
    from hicache_ops.sglang.geometry import preset as load_preset

    geometry = load_preset(ctx.params["preset"])
    settings = deployment_settings(ctx, mla=geometry.mla)
    return EngineSpec.of(
        geometry,
        settings,
        side_pools=side_pools(ctx, settings),
        l3_bandwidth_bytes_s=l3_bandwidth_bytes_s(ctx.params["l3_bandwidth_gbps"]),
    ).validate(mooncake=True)


# The options that configure the embedded engine (refused with --serve, whose own settings apply).
ENGINE_OPTIONS = (
    "page_size",
    "preset",
    "device_tokens",
    "tp_size",
    "dcp_size",
    "sglang_version",
    "model_name",
    "extra_backend_tag",
    "write_policy",
    "prefetch_policy",
    "prefetch_threshold",
    "l3_bandwidth_gbps",
    "layout",
    "pool",
    "pool_preset",
)


def _command(kind: str):
    def command(
        ctx: typer.Context,
        tokens: TokensOption = None,
        tokens_file: TokensFileOption = None,
        line: LineOption = None,
        text: TextOption = None,
        tokenizer: TokenizerOption = None,
        extra_key: ExtraKeyOption = None,
        cache_salt: CacheSaltOption = None,
        serve: OptionalServeOption = None,
        flush: Annotated[
            bool, typer.Option("--flush", help="With --serve: flush L1/L2 first.", rich_help_panel=INPUT)
        ] = False,
        inject: InjectOption = None,
        step: StepOption = False,
        allow_writes: AllowWritesOption = False,
        page_size: PageSizeOption = 16,
        preset: PresetOption = "tiny",
        device_tokens: DeviceTokensOption = 4096,
        tp_size: TpSizeOption = 1,
        dcp_size: DcpSizeOption = 1,
        sglang_version: SglangVersionOption = None,
        model_name: ModelNameOption = "hicache/tiny",
        extra_backend_tag: ExtraBackendTagOption = None,
        write_policy: WritePolicyOption = WritePolicy.write_through,
        prefetch_policy: StopPolicyOption = StopPolicy.timeout,
        prefetch_threshold: PrefetchThresholdOption = 256,
        l3_bandwidth_gbps: L3BandwidthOption = None,
        layout: LayoutOption = HostLayout.page_first,
        pool: PoolOption = None,
        pool_preset: PoolPresetOption = None,
        timeout: TimeoutOption = 3.0,
        json_output: JsonOption = False,
    ) -> None:
        _trace(ctx, kind)

    command.__doc__ = (
        {
            "write": "Trace a prompt from device slots to verified Mooncake objects, step by step.",
            "read": "Trace a prompt from the local match through L3 to verified device bytes, step by step.",
        }[kind]
        + "\n\nWithout --serve the trace runs on an embedded engine (with its own loopback master) built from the "
        "deployment options."
    )
    return command


write = _command("write")
# The embedded engine reproduces the server's key path and policies (its geometry stays --preset).
read = sglang_url_option(
    "sglang_version",
    "page_size",
    "tp_size",
    "dcp_size",
    "model_name",
    "extra_backend_tag",
    "write_policy",
    "prefetch_threshold",
    "layout",
    "prefetch_policy",
)(_command("read"))
