"""`hicache warm`: fill an L3 namespace with prompts (through a serve or a real SGLang server)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    INPUT,
    AllOption,
    CacheSaltOption,
    ExtraBackendTagOption,
    ExtraKeyOption,
    JsonOption,
    MasterOption,
    MasterRpcOption,
    MlaOption,
    ModelNameOption,
    PageSizeOption,
    PoolOption,
    PoolPresetOption,
    PrefetchThresholdOption,
    ServeOption,
    SglangVersionOption,
    TimeoutOption,
    TokenizerOption,
    TpSizeOption,
    value_of,
)
from hicache_ops.cli.common.output import emit, first_rows, json_data, print_left_out, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import option_flag, option_given
from hicache_ops.errors import InputError

if TYPE_CHECKING:
    from hicache_ops.commands.warm import MigrationReport

EXAMPLES = examples(
    "hicache warm prompts.jsonl --serve http://127.0.0.1:18080",
    "hicache warm prompts.jsonl --sglang-url http://10.0.0.7:30000 --master 10.0.0.5:9003 --model-name Qwen/Qwen3-8B",
    "hicache warm --migrate-prefix Qwen-Qwen3-8B_ Qwen-Qwen3-8B-v2_ --master 10.0.0.5:9003 --master-rpc 10.0.0.5:50051",
)

_STYLE = {
    "written": "green",
    "present": "cyan",
    "no_page": "yellow",
    "not_landed": "bold red",
    "failed": "bold red",
    "pending": "dim",
}


# The table names a status as the summary line does (JSON keeps the status itself).
_LABEL = {"pending": "not reached", "no_page": "no page", "not_landed": "not landed", "present": "already present"}

# Problems first, so the rows a cut listing keeps are the ones worth reading.
_ORDER = ("failed", "not_landed", "pending", "no_page", "written", "present")


def _verdict(data: dict) -> str:
    s = data["summary"]
    total = len(data["prompts"])
    if data["dry_run"]:
        return (
            f"[bold]dry run:[/] {s['pending']} of {total} prompt(s) would be written ({s['pages']} pages); "
            "nothing was written."
        )
    if data["complete"]:
        return f"[bold green]complete:[/] every page of {total} prompt(s) is in L3."
    missing = s["not_landed"] + s["failed"] + s["pending"]
    return f"[bold red]incomplete:[/] {missing} of {total} prompt(s) are not fully in L3."


def _label(status: str, dry_run: bool) -> str:
    if dry_run and status == "pending":
        return "would write"
    return _LABEL.get(status, status)


def _counts(s: dict, dry_run: bool) -> str:
    """The summary's counts, named as the table names them, zeros left out; pages and bytes in a
    clause of their own (a line that wraps never ends on a separator)."""
    counts = [f"{_label(status, dry_run)} {s[status]}" for status in _ORDER if s[status]] or ["none"]
    written = f", {s['bytes']:,} bytes written" if s["bytes"] else ""  # through SGLang: bytes not known
    return f"prompts: {', '.join(counts)} ({s['pages']} pages{written})"


def _render(data: dict, show_all: bool = False) -> None:
    stdout.print(f"warm {data['target']}" + (" (dry run)" if data["dry_run"] else ""))
    stdout.print(_verdict(data))
    s = data["summary"]
    stdout.print(_counts(s, data["dry_run"]), soft_wrap=False)
    if data["error"]:
        stderr.print(
            f"[bold red]stopped early:[/] {data['error']} Rerun to resume: finished prompts are skipped.",
            soft_wrap=False,
        )
    if data["interrupted"]:
        stderr.print(
            f"[bold yellow]interrupted[/] ({data['interrupted']}): prompts not reached were not written or not "
            "verified. Rerun to resume: finished prompts are skipped.",
            soft_wrap=False,
        )
    ordered = sorted(data["prompts"], key=lambda p: _ORDER.index(p["status"]))
    rows, left_out = first_rows(ordered, show_all)
    if not rows:
        return
    table = Table()
    table.add_column("prompt", overflow="fold")
    for col in ("tokens", "pages", "objects"):
        table.add_column(col, justify="right")
    table.add_column("status", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("note", overflow="fold")
    for p in rows:
        note = p["reason"] or (f"first missing {p['first_missing']}" if p["first_missing"] else "")
        table.add_row(
            p["source"],
            str(p["tokens"]),
            str(p["pages"]),
            str(p["objects"]),
            f"[{_STYLE[p['status']]}]{_label(p['status'], data['dry_run'])}[/]",
            f"{p['bytes']:,}",
            note,
        )
    stdout.print(table)
    print_left_out(left_out, "prompts")


def warm(
    ctx: typer.Context,
    prompts: Annotated[
        str | None,
        typer.Argument(
            help="JSONL with input_ids (or text with --tokenizer); - for stdin.", metavar="PROMPTS", show_default=False
        ),
    ] = None,
    tokenizer: TokenizerOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    serve: ServeOption = "http://127.0.0.1:18080",
    sglang_url: Annotated[
        str | None,
        typer.Option(
            "--sglang-url",
            help="Warm through a real SGLang server's /generate instead of a serve.",
            metavar="URL",
            show_default=False,
            rich_help_panel=INPUT,
        ),
    ] = None,
    master: MasterOption = None,
    master_rpc: MasterRpcOption = None,
    model_name: ModelNameOption = None,
    extra_backend_tag: ExtraBackendTagOption = None,
    sglang_version: SglangVersionOption = None,
    page_size: PageSizeOption = 64,
    tp_size: TpSizeOption = 1,
    mla: MlaOption = False,
    prefetch_threshold: PrefetchThresholdOption = 256,
    pool: PoolOption = None,
    pool_preset: PoolPresetOption = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Prompts in flight at once.", metavar="N")] = 4,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be written; write nothing.")] = False,
    synthetic: Annotated[
        bool, typer.Option("--synthetic", help="Allow synthetic KV into an existing Mooncake cluster.")
    ] = False,
    migrate_prefix: Annotated[
        tuple[str, str] | None,
        typer.Option(
            "--migrate-prefix",
            help="Re-key page objects from prefix FROM to TO ('' = unprefixed) instead of warming.",
            metavar="FROM TO",
            show_default=False,
        ),
    ] = None,
    remove_old: Annotated[
        bool, typer.Option("--remove-old", help="With --migrate-prefix: remove the originals once verified.")
    ] = False,
    timeout: TimeoutOption = 3.0,
    show_all: AllOption = False,
    json_output: JsonOption = False,
) -> None:
    """Fill an L3 namespace with prompts and verify every object landed; Ctrl-C stops with a summary; reruns resume.

    Through a serve by default. With --sglang-url, through a real SGLang server, checked on the
    master at --master (the deployment options describe that server, for the report). With
    --migrate-prefix, re-key objects on the master instead: --master lists, --master-rpc copies.
    """
    with reporting(json_output):
        from hicache_ops.server.client import check_timeout

        check_timeout(timeout)
        if migrate_prefix is not None:
            _migrate(migrate_prefix, master, master_rpc, remove_old, dry_run, timeout, json_output)
            return
        if prompts is None:
            raise InputError("give a PROMPTS file (JSONL with input_ids), or --migrate-prefix FROM TO.")
        if concurrency < 1:
            raise InputError(f"--concurrency {concurrency} must be >= 1.")
        if remove_old:
            raise InputError("--remove-old only applies to --migrate-prefix.")

        if sglang_url is not None and option_given(ctx, "serve"):
            raise InputError("--serve and --sglang-url name two targets; give one.")
        if sglang_url is None:
            sglang_only = ("page_size", "tp_size", "prefetch_threshold", "mla", "master")
            given = [option_flag(ctx, name) for name in sglang_only if option_given(ctx, name)]
            if given:
                raise InputError(
                    f"{', '.join(given)} only apply with --sglang-url; a serve uses its own settings and master.",
                    hint="Drop them, or warm through --sglang-url.",
                )
        from hicache_ops import interrupt
        from hicache_ops.tokens import Tokenizer, read_prompts

        items = read_prompts(prompts, Tokenizer(tokenizer) if tokenizer else None)
        with interrupt.stop_on_signals(), ProgressBar(len(items), json_output) as advance:
            if sglang_url is not None:
                report = _warm_sglang(
                    ctx, items, sglang_url, extra_key, cache_salt, concurrency, dry_run, timeout, advance
                )
            else:
                from hicache_ops.commands.warm import warm_serve
                from hicache_ops.server.client import ServeClient

                expect = {
                    "model_name": model_name,
                    "extra_backend_tag": extra_backend_tag,
                    "sglang_version": value_of(sglang_version),
                }
                with ServeClient.open(serve, timeout_s=timeout) as client:
                    report = warm_serve(
                        items,
                        client,
                        extra_key=extra_key,
                        cache_salt=cache_salt,
                        expect=expect,
                        pool_texts=pool or (),
                        pool_preset=pool_preset,
                        concurrency=concurrency,
                        dry_run=dry_run,
                        synthetic=synthetic,
                        on_progress=advance,
                    )
        emit(report.result(), json_output, lambda r: _render(json_data(r), show_all))
        if report.interrupted:
            raise typer.Exit(interrupt.EXIT_CODE)
        if report.error:
            raise typer.Exit(3)
        if not report.complete and not dry_run:
            raise typer.Exit(1)


def _warm_sglang(ctx: typer.Context, items, url, extra_key, cache_salt, concurrency, dry_run, timeout, advance):
    from hicache_ops.cli.common.deployment import deployment_settings, side_pools
    from hicache_ops.commands.warm import warm_sglang

    settings = deployment_settings(ctx)  # an MLA --pool-preset describes an MLA server, as in inspect keys
    if settings.l3.master is None:
        raise InputError("--sglang-url needs --master HOST:METRICS_PORT to check what SGLang wrote.")
    return warm_sglang(
        items,
        url,
        settings,
        extra_key=extra_key,
        cache_salt=cache_salt,
        pools=side_pools(ctx, settings),  # expected_keys checks each pool
        concurrency=concurrency,
        dry_run=dry_run,
        timeout_s=timeout,
        on_progress=advance,
    )


def _migrate(prefixes, master, rpc, remove_old, dry_run, timeout, json_output) -> None:
    from hicache_ops.commands.warm import migrate_prefix
    from hicache_ops.mooncake.store_client import StoreClient

    if master is None or rpc is None:
        raise InputError(
            "--migrate-prefix needs the master's --master HOST:METRICS_PORT (listing) and --master-rpc HOST:RPC_PORT "
            "(copying)."
        )

    from hicache_ops.cli.common.output import native_stderr_to_file

    with (
        native_stderr_to_file(None, "migrate_mooncake.log"),
        StoreClient.connect(rpc, segment_size=0, setup_timeout=timeout) as store,
    ):
        report = migrate_prefix(
            master, store, prefixes[0], prefixes[1], remove_old=remove_old, dry_run=dry_run, timeout_s=timeout
        )

    def render(report: MigrationReport) -> None:
        d = json_data(report)
        stdout.print(
            f"{d['objects']} object(s) under {d['source_prefix'] or '(unprefixed)'} -> "
            f"{d['target_prefix'] or '(unprefixed)'}: "
            f"copied {d['copied']}, already there {d['already_there']}, verified {d['verified']}, removed "
            f"{d['removed']}, "
            f"failed {len(d['failed'])}" + (" (dry run)" if d["dry_run"] else ""),
        )

    emit(report, json_output, render)
    if report.failed:
        raise typer.Exit(1)


class ProgressBar:
    """A progress bar on stderr (none in JSON mode, none off a terminal): done of total, pages and MB
    so far, elapsed and an ETA; yields a callback per finished prompt. `pages_of` / `bytes_of` read
    them from what the callback is given (warm's outcome by default)."""

    def __init__(self, total: int, quiet: bool, label: str = "warm", pages_of=None, bytes_of=None):
        self.total, self.quiet, self.label = total, quiet, label
        self.pages_of = pages_of or (lambda outcome: outcome.pages)
        self.bytes_of = bytes_of or (lambda outcome: outcome.bytes)
        self.pages = self.bytes = 0

    def __enter__(self):
        # A bar on a pipe or a file is only a blank line left behind: shown on a terminal only.
        self.quiet = self.quiet or not stderr.is_terminal
        if self.quiet:
            return lambda outcome: None
        self.bar = Progress(
            TextColumn(self.label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[pages]} pages {task.fields[mb]:.1f} MB"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=stderr,
            transient=True,
        )
        self.bar.start()
        self.task = self.bar.add_task(self.label, total=self.total, pages=0, mb=0.0)

        def advance(outcome) -> None:
            self.pages += self.pages_of(outcome)
            self.bytes += self.bytes_of(outcome)
            self.bar.update(self.task, advance=1, pages=self.pages, mb=self.bytes / 1e6)

        return advance

    def __exit__(self, *exc) -> None:
        if not self.quiet:
            self.bar.stop()
