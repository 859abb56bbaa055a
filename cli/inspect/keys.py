"""`hicache inspect keys`: page keys and object keys for a prompt, as SGLang computes them."""

from __future__ import annotations

from typing import Annotated

import typer

from hicache_ops.inspect_keys import Deployment, KeyReport, expected_keys
from hicache_ops.tokens import load_prompt
from hicache_ops.versions import default_version, validate_version

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
from ..output import emit, reporting, stderr, stdout


def _render(report: KeyReport) -> None:
    # Plain lines rather than a table: full keys stay greppable and copyable at any width.
    stdout.print(
        f"SGLang {report.sglang_version}  page size {report.page_size}  "
        f"prompt {report.prompt_tokens} tokens  whole pages {len(report.pages)}  "
        f"key prefix {report.key_prefix or '(none)'}  namespace seed {report.namespace_seed or 'none'}",
        highlight=False,
    )
    for page in report.pages:
        stdout.print(
            f"[bold]page {page.index}[/]  tokens [{page.start}, {page.end})  {page.page_key}", highlight=False
        )
        for key in page.object_keys:
            stdout.print(f"    {key}", highlight=False)
    for note in report.notes:
        stderr.print(f"[yellow]note:[/] {note}", highlight=False)


def keys(
    tokens: TokensOption = None,
    tokens_file: TokensFileOption = None,
    line: LineOption = None,
    text: TextOption = None,
    tokenizer: TokenizerOption = None,
    page_size: PageSizeOption = 64,
    sglang_version: SglangVersionOption = None,
    model_name: ModelNameOption = None,
    extra_backend_tag: ExtraBackendTagOption = None,
    extra_key: ExtraKeyOption = None,
    cache_salt: CacheSaltOption = None,
    tp_size: Annotated[int, typer.Option("--tp-size", help="Attention TP size.")] = 1,
    tp_rank: Annotated[
        int | None, typer.Option("--tp-rank", help="One tp rank (default: every rank).", show_default=False)
    ] = None,
    pp_size: Annotated[int, typer.Option("--pp-size", help="Pipeline-parallel size.")] = 1,
    pp_rank: Annotated[
        int | None, typer.Option("--pp-rank", help="One pp rank (default: every rank).", show_default=False)
    ] = None,
    mla: Annotated[bool, typer.Option("--mla", help="MLA model: one `_k` object per page.")] = False,
    layout: Annotated[
        str, typer.Option("--layout", help="Host-pool layout (page_head enables split heads).")
    ] = "page_first",
    tp_lcm_size: Annotated[
        int | None,
        typer.Option("--tp-lcm-size", help="Extra-config tp_lcm_size (heterogeneous TP).", show_default=False),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Page keys and Mooncake object keys SGLang derives for a prompt."""
    with reporting(json_output):
        from hicache_ops.layouts import check_layout_for

        version = validate_version(sglang_version or default_version())
        check_layout_for(layout, mla=mla)
        prompt = load_prompt(tokens=tokens, tokens_file=tokens_file, line=line, text=text, tokenizer=tokenizer)
        deployment = Deployment(
            version=version,
            model_name=model_name,
            extra_backend_tag=extra_backend_tag,
            tp_size=tp_size,
            tp_rank=tp_rank,
            pp_size=pp_size,
            pp_rank=pp_rank,
            mla=mla,
            layout=layout,
            tp_lcm_size=tp_lcm_size,
        )
        report = expected_keys(
            prompt.input_ids,
            page_size,
            deployment,
            extra_key=extra_key if extra_key is not None else prompt.extra_key,
            cache_salt=cache_salt if cache_salt is not None else prompt.cache_salt,
        )
        emit(report.to_json(), json_output, lambda _: _render(report))
