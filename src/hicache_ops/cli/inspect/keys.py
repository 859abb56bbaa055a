"""`hicache inspect keys`: page keys and object keys for a prompt, as SGLang computes them."""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    DEPLOYMENT,
    AllOption,
    CacheSaltOption,
    DcpSizeOption,
    ExtraBackendTagOption,
    ExtraKeyOption,
    HostLayout,
    JsonOption,
    LayoutOption,
    LineOption,
    MasterOption,
    MlaOption,
    ModelNameOption,
    PageSizeOption,
    PoolOption,
    PoolPresetOption,
    PpSizeOption,
    SglangVersionOption,
    TextOption,
    TimeoutOption,
    TokenizerOption,
    TokensFileOption,
    TokensOption,
    TpLcmSizeOption,
    TpRankOption,
    TpSizeOption,
    TryCacheSaltOption,
    TryExtraKeyOption,
)
from hicache_ops.cli.common.output import DETAIL_ROWS, emit, first_rows, print_left_out, reporting, stderr, stdout
from hicache_ops.cli.common.sglang_url import sglang_url_option
from hicache_ops.commands.inspect.key_listing import KeyReport, expected_keys
from hicache_ops.tokens import load_prompt

EXAMPLES = examples(
    "hicache inspect keys --tokens-file prompt.jsonl --page-size 64 --model-name Qwen/Qwen3-8B",
    "hicache inspect keys --tokens-file prompt.jsonl --model-name Qwen/Qwen3-8B --master 10.0.0.5:9003",
    "hicache inspect keys --tokens 1,2,3,4 --page-size 2 --tp-size 2 --json",
)


def _header(report: KeyReport, choice=None) -> None:
    stdout.print(
        f"SGLang {report.sglang_version}  page size {report.page_size}  "
        f"prompt {report.prompt_tokens} tokens  whole pages {len(report.pages)}",
    )
    stdout.print(f"key prefix {report.key_prefix or '(none)'}  namespace seed {report.namespace_seed or 'none'}")
    if choice is not None:
        stdout.print(f"side pools {choice.source_text}")
    from hicache_ops.commands.inspect.results import keys_result  # pydantic: not at --help time

    for pool in keys_result(report).pools:
        window = f" (last {pool.trailing_pages} page(s))" if pool.trailing_pages else ""
        stdout.print(f"pool {pool.name}  {pool.hit_policy}{window}  {', '.join(pool.suffixes)}")
    _render_disagreements(choice)


def _render_disagreements(choice) -> None:
    """Each disagreement met on the way to the side pools, one row each."""
    if choice is None:
        return
    for row in choice.pool_disagreements:
        stdout.print(f"[yellow]pool disagreement[/] {_disagreement(row, 'flag', '--pool')}", soft_wrap=False)
    for row in choice.rule_disagreements:
        stdout.print(f"[yellow]layout vs key rule[/] {_disagreement(row, 'rule', 'our rule')}", soft_wrap=False)


def _disagreement(row: dict, other: str, label: str) -> str:
    if row["field"] == "pool":
        if other == "rule":
            return f"{row['pool']}: a pool this toolkit has no key rule for; using the server's suffixes"
        side = "the server's L3 layout only" if row["server"] else "--pool only"
        return f"{row['pool']}: listed by {side}; using the server's pools"
    name = row["pool"] or "deployment"
    return f"{name} {row['field']}: server {_shown(row['server'])}, {label} {_shown(row[other])}; using the server's"


def _shown(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "(none)"
    return "(none)" if value is None else str(value)


def _objects_per_page(report: KeyReport) -> int:
    # Trailing side pools add objects to the last pages only: budget for the fullest page.
    return max((len(page.object_keys) for page in report.pages), default=0)


def _pages_shown(pages: list, lines_per_page: int, show_all: bool) -> tuple[list, int]:
    """Whole pages, as many as fit the detail budget in lines."""
    return first_rows(pages, show_all, max(1, DETAIL_ROWS // lines_per_page))


def _render(report: KeyReport, show_all: bool, choice=None) -> None:
    # Plain lines rather than a table: full keys stay greppable and copyable at any width.
    _header(report, choice)
    shown, left_out = _pages_shown(report.pages, 1 + _objects_per_page(report), show_all)
    for page in shown:
        stdout.print(f"[bold]page {page.index}[/]  tokens [{page.start}, {page.end})  {page.page_key}")
        for key in page.object_keys:
            stdout.print(f"    {key}")
    print_left_out(left_out, "pages")
    for note in report.notes:
        stderr.print(f"[yellow]note:[/] {note}")


def _render_live(report: KeyReport, diff, show_all: bool, choice=None) -> None:
    """The verdict first, then the pages with each object marked present (+) or missing (-):
    incomplete pages before complete ones when the listing is cut."""
    total = len(report.pages)
    verdict = "[bold green]complete[/]" if diff.complete else "[bold red]incomplete[/]"
    if diff.pool_hit_pages is None:
        stdout.print(
            f"{verdict}: contiguous prefix {diff.contiguous_pages}/{total} pages "
            f"({diff.contiguous_pages * report.page_size} tokens), as SGLang's batch_exists returns",
        )
    else:
        pools = ", ".join(f"{name} {pages}" for name, pages in diff.pool_hit_pages.items())
        stdout.print(
            f"{verdict}: loadable prefix {diff.contiguous_pages}/{total} pages "
            f"({diff.contiguous_pages * report.page_size} tokens), as SGLang's batch_exists_v2 returns: "
            f"KV {diff.kv_contiguous_pages}, {pools}",
            soft_wrap=False,
        )
        if diff.restorable_prefix_pages is not None:
            stops = diff.restorable_prefix_pages
            stdout.print(f"[bold]restorable stop points[/] {', '.join(map(str, stops)) or 'none'}", soft_wrap=False)
    if diff.first_missing:
        stdout.print(f"[bold]first missing[/] {diff.first_missing}")
    for entry in diff.diagnosis:
        # Prose wraps at the terminal width (the console keeps key lines whole by default).
        stdout.print(f"[yellow]{entry['kind']}:[/] {entry['message']}", soft_wrap=False)
        if entry.get("hint"):
            stdout.print(f"    [dim]hint:[/] {entry['hint']}", soft_wrap=False)
    _header(report, choice)
    stdout.print(f"master {diff.master}")
    pages = list(zip(report.pages, diff.present, strict=True))
    ordered = [p for p in pages if not all(p[1])] + [p for p in pages if all(p[1])]
    shown, left_out = _pages_shown(ordered, 2 + _objects_per_page(report), show_all)
    for page, present in sorted(shown, key=lambda p: p[0].index):
        mark = "[green]complete[/]" if all(present) else "[red]missing[/]"
        stdout.print(f"[bold]page {page.index}[/] {mark}  tokens [{page.start}, {page.end})")
        stdout.print(f"    {page.page_key}")
        for key, ok in zip(page.object_keys, present, strict=True):
            stdout.print(f"  {'[green]+[/]' if ok else '[red]-[/]'} {key}")
    print_left_out(left_out, "pages")
    for note in report.notes:
        stderr.print(f"[yellow]note:[/] {note}")


@sglang_url_option(
    "sglang_version",
    "page_size",
    "model_name",
    "extra_backend_tag",
    "tp_size",
    "pp_size",
    "mla",
    "layout",
    "tp_lcm_size",
    "dcp_size",
)
def keys(
    ctx: typer.Context,
    tokens: TokensOption = None,
    tokens_file: TokensFileOption = None,
    line: LineOption = None,
    text: TextOption = None,
    tokenizer: TokenizerOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    master: MasterOption = None,
    try_extra_key: TryExtraKeyOption = None,
    try_cache_salt: TryCacheSaltOption = None,
    timeout: TimeoutOption = 3.0,
    page_size: PageSizeOption = 64,
    sglang_version: SglangVersionOption = None,
    model_name: ModelNameOption = None,
    extra_backend_tag: ExtraBackendTagOption = None,
    tp_size: TpSizeOption = 1,
    tp_rank: TpRankOption = None,
    pp_size: PpSizeOption = 1,
    pp_rank: Annotated[
        int | None,
        typer.Option(
            "--pp-rank",
            help="Only this pp rank (default: every rank).",
            metavar="N",
            show_default=False,
            rich_help_panel=DEPLOYMENT,
        ),
    ] = None,
    dcp_size: DcpSizeOption = 1,
    dcp_rank: Annotated[
        int | None,
        typer.Option(
            "--dcp-rank",
            help="Only this DCP shard (default: every shard).",
            metavar="N",
            show_default=False,
            rich_help_panel=DEPLOYMENT,
        ),
    ] = None,
    mla: MlaOption = False,
    layout: LayoutOption = HostLayout.page_first,
    tp_lcm_size: TpLcmSizeOption = None,
    pool: PoolOption = None,
    pool_preset: PoolPresetOption = None,
    show_all: AllOption = False,
    json_output: JsonOption = False,
    sglang_server=None,
) -> None:
    """Page keys and Mooncake object keys SGLang derives for a prompt.

    With --master, a live diff against that master: which objects exist, SGLang's contiguous
    prefix, and a diagnosis (exit 1 when the prompt's objects are incomplete); --try-extra-key and
    --try-cache-salt look for other namespaces' keys there too.
    """
    with reporting(json_output):
        from hicache_ops.cli.common.deployment import deployment_settings, side_pools
        from hicache_ops.commands.inspect.results import keys_result

        settings = deployment_settings(ctx)
        deployment = settings.topology
        pools = list(side_pools(ctx, settings))
        prompt = load_prompt(tokens=tokens, tokens_file=tokens_file, line=line, text=text, tokenizer=tokenizer)
        choice = None
        if sglang_server is not None:  # --sglang-url: an enabled L3 layout's pools replace the flags'
            from hicache_ops.sglang.l3_layout import choose_pools

            choice = choose_pools(sglang_server.l3_layout, pools, deployment)
            pools = choice.pools
            for note in choice.notes:
                stderr.print(f"[yellow]note:[/] {note}", highlight=False)
        report = expected_keys(
            prompt.input_ids,
            settings.page_size,
            deployment,
            extra_key=extra_key if extra_key is not None else prompt.extra_key,
            cache_salt=cache_salt if cache_salt is not None else prompt.cache_salt,
            pools=pools,
        )
        if master is None:
            if try_extra_key or try_cache_salt:
                from hicache_ops.errors import InputError

                raise InputError("--try-extra-key and --try-cache-salt need --master.")
            emit(keys_result(report, choice=choice), json_output, lambda _: _render(report, show_all, choice))
            return
        from hicache_ops.commands.inspect.live_diff import live_diff
        from hicache_ops.mooncake.admin import AdminClient

        with AdminClient(master, timeout=timeout) as admin:
            admin.health()  # an unreachable or silent master fails here, within --timeout
            diff = live_diff(
                prompt.input_ids,
                settings.page_size,
                deployment,
                admin,
                extra_key=report.extra_key,
                cache_salt=report.cache_salt,
                try_extra_keys=try_extra_key or (),
                try_cache_salts=try_cache_salt or (),
                report=report,
            )
        emit(
            keys_result(report, diff, choice),
            json_output,
            lambda _: _render_live(report, diff, show_all, choice),
        )
    if master is not None and not diff.complete:
        raise typer.Exit(1)
