"""Option declarations shared by several commands, so every command spells them the same way."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print stable JSON on stdout (diagnostics go to stderr).")
]
SglangVersionOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-version",
        help="SGLang key scheme: 0.5.14 or 0.5.23 (default: the installed sglang, else 0.5.23).",
        show_default=False,
    ),
]
PageSizeOption = Annotated[int, typer.Option("--page-size", help="Tokens per page (SGLang --page-size).")]
TokensOption = Annotated[
    str | None, typer.Option("--tokens", help="Token ids, comma separated: 1,2,3.", show_default=False)
]
TokensFileOption = Annotated[
    str | None,
    typer.Option(
        "--tokens-file",
        help="A JSON array of ids, or JSONL with input_ids (or text); - reads stdin.",
        show_default=False,
    ),
]
LineOption = Annotated[
    int | None,
    typer.Option("--line", help="Which prompt of a multi-line JSONL file (1-based).", show_default=False),
]
TextOption = Annotated[
    str | None, typer.Option("--text", help="Prompt text, tokenized with --tokenizer.", show_default=False)
]
TokenizerOption = Annotated[
    str | None,
    typer.Option("--tokenizer", help="Local Hugging Face tokenizer folder (tokenizer.json).", show_default=False),
]
ModelNameOption = Annotated[
    str | None,
    typer.Option(
        "--model-name",
        help="Served model name; 0.5.23 prefixes object keys with it ('/' becomes '-').",
        show_default=False,
    ),
]
ExtraBackendTagOption = Annotated[
    str | None,
    typer.Option("--extra-backend-tag", help="Mooncake extra_backend_tag (key prefix).", show_default=False),
]
ExtraKeyOption = Annotated[
    str | None, typer.Option("--extra-key", help="Request extra_key (0.5.23 namespace).", show_default=False)
]
CacheSaltOption = Annotated[
    str | None, typer.Option("--cache-salt", help="Request cache_salt (0.5.23 namespace).", show_default=False)
]
