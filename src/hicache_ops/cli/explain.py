"""`hicache explain`: one request sent to a server, its tier split beside the expected keys and the live diff."""

from __future__ import annotations

import typer

from hicache_ops.cli.common.help import examples
from hicache_ops.cli.common.options import (
    AllowWritesOption,
    CacheSaltOption,
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
    PpSizeOption,
    SglangVersionOption,
    TextOption,
    TimeoutOption,
    TokenizerOption,
    TokensFileOption,
    TokensOption,
    TpSizeOption,
)
from hicache_ops.cli.common.output import emit, reporting, stdout
from hicache_ops.cli.common.sglang_url import sglang_url_option

PAGE_FIRST = HostLayout("page_first")
EXAMPLES = examples(
    "hicache explain --sglang-url http://127.0.0.1:30000 --master 127.0.0.1:9003 --tokens-file prompt.jsonl "
    "--allow-writes",
    "hicache explain --sglang-url http://127.0.0.1:30000 --master 127.0.0.1:9003 --tokens 1,2,3,4 "
    "--allow-writes --json",
)


def _render(result) -> None:
    stdout.print(f"[bold]{result.summary}[/]", soft_wrap=False)
    t = result.tokens
    stdout.print(
        f"tokens: {t.device} device, {t.host} host, {t.storage} L3, {t.recomputed} recomputed "
        f"(prompt {result.prompt_tokens}, page size {result.page_size})"
    )
    stdout.print(
        f"before the request: master {result.master} held {result.present_objects}/{result.expected_objects} "
        f"objects, L3 prefix {result.l3_contiguous_pages}/{result.pages} pages"
    )
    if result.first_missing:
        stdout.print(f"[bold]first missing[/] {result.first_missing} (page {result.first_missing_page})")
    for entry in result.diagnosis:
        stdout.print(f"[yellow]{entry['kind']}:[/] {entry['message']}", soft_wrap=False)
        if entry.get("hint"):
            stdout.print(f"    [dim]hint:[/] {entry['hint']}", soft_wrap=False)


@sglang_url_option(
    "sglang_version", "page_size", "model_name", "extra_backend_tag", "tp_size", "pp_size", "mla", "layout"
)
def explain(
    ctx: typer.Context,
    tokens: TokensOption = None,
    tokens_file: TokensFileOption = None,
    line: LineOption = None,
    text: TextOption = None,
    tokenizer: TokenizerOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    master: MasterOption = None,
    allow_writes: AllowWritesOption = False,
    timeout: TimeoutOption = 30.0,
    page_size: PageSizeOption = 64,
    sglang_version: SglangVersionOption = None,
    model_name: ModelNameOption = None,
    extra_backend_tag: ExtraBackendTagOption = None,
    tp_size: TpSizeOption = 1,
    pp_size: PpSizeOption = 1,
    mla: MlaOption = False,
    layout: LayoutOption = PAGE_FIRST,
    json_output: JsonOption = False,
    sglang_server=None,
) -> None:
    """Send one prompt to a server and explain its tier split (WRITES: needs --allow-writes).

    First the live diff of the prompt's expected objects against --master (read-only), then one
    POST /generate with return_cached_tokens_details to --sglang-url (a real SGLang or a hicache
    serve). The request changes the server's cache. The deployment (page size, model name, tp)
    comes from the server's /server_info. Exit 3 when the server or master is unreachable.
    """
    with reporting(json_output):
        from hicache_ops.cli.common.deployment import deployment_settings
        from hicache_ops.commands.explain import explain as run_explain
        from hicache_ops.errors import InputError
        from hicache_ops.mooncake.admin import AdminClient
        from hicache_ops.tokens import load_prompt

        if sglang_server is None:
            raise InputError("explain needs --sglang-url URL: the server to send the prompt to.")
        if master is None:
            raise InputError("explain needs --master HOST:METRICS_PORT: the Mooncake master of the server's L3.")
        if not allow_writes:
            raise InputError(
                "sending the prompt changes the server's cache; pass --allow-writes if you mean it.",
                hint="For a read-only look use hicache inspect keys --sglang-url URL --master HOST:PORT.",
            )
        settings = deployment_settings(ctx)
        deployment = settings.topology
        prompt = load_prompt(tokens=tokens, tokens_file=tokens_file, line=line, text=text, tokenizer=tokenizer)
        with AdminClient(master, timeout=min(timeout, 10.0)) as admin:
            admin.health()  # an unreachable master fails here, before anything is sent
            result = run_explain(
                prompt.input_ids,
                settings.page_size,
                deployment,
                sglang_server.url,
                admin,
                extra_key=extra_key if extra_key is not None else prompt.extra_key,
                cache_salt=cache_salt if cache_salt is not None else prompt.cache_salt,
                timeout=timeout,
            )
        emit(result, json_output, _render)
