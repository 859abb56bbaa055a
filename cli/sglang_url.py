"""`--sglang-url`: fill a command's deployment options from a running SGLang server.

One decorator gives a command the option; the command itself stays unchanged. Options the user
set on the command line keep their value; each that disagrees with the server is printed as a
warning and listed as `server_disagreements` in the command's JSON (docs/server-info.md).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .output import JSON_EXTRAS, reporting, stderr

SglangUrlOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-url",
        metavar="URL",
        help="A running SGLang server: options not given are read from its /server_info; "
        "a given option that disagrees with it is reported.",
        show_default=False,
    ),
]
SglangCompareUrlOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-url",
        metavar="URL",
        help="A running SGLang server: report where the serve instance's configuration differs from it.",
        show_default=False,
    ),
]
SglangTimeoutOption = Annotated[
    float, typer.Option("--sglang-timeout", metavar="SECONDS", help="With --sglang-url: seconds to wait for the server.")
]
# Where a value came from when the user typed it (click's ParameterSource names).
_GIVEN_SOURCES = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in _GIVEN_SOURCES


def _flag(ctx: typer.Context, name: str, value: Any = None) -> str:
    """The option as a user would type it: `--page-size 32`, `--mla`, `--no-mooncake`."""
    param = next((p for p in ctx.command.params if p.name == name), None)
    flag = max(param.opts, key=len) if param is not None and param.opts else "--" + name.replace("_", "-")
    if isinstance(value, bool):
        off = param.secondary_opts if param is not None else []
        return flag if value else (off[0] if off else f"{flag}=false")
    return flag if value is None else f"{flag} {value}"


def _report(ctx: typer.Context, resolution, params_for: dict[str, str], applied: list[str]) -> None:
    server = resolution.server
    if applied:
        shown = ", ".join(_flag(ctx, params_for[f], resolution.values[f]) for f in applied)
        stderr.print(f"[dim]from SGLang {server.version} at {server.url}:[/] {shown}", highlight=False)
    for item in resolution.disagreements:
        stderr.print(
            f"[bold yellow]warning:[/] {_flag(ctx, params_for[item['field']], item['flag'])} disagrees with "
            f"the SGLang server ({item['server']}); using the flag.",
            highlight=False,
        )
    for note in server.notes:
        stderr.print(f"[yellow]note:[/] {note}", highlight=False)


def warn_serve_disagreements(disagreements: list[dict]) -> None:
    """One warning line per field where a serve instance does not mirror the SGLang server."""
    for item in disagreements:
        stderr.print(
            f"[bold yellow]warning:[/] serve {item['field']} {item['serve']} differs from the SGLang server's "
            f"{item['server']}; the verdicts describe the serve.",
            highlight=False,
        )


def sglang_url_option(*fields: str, **renamed: str) -> Callable:
    """Decorate a command so `--sglang-url URL` fills the options named here from the server.

    `fields` are names of `ServerInfo.values()` that are also the command's parameter names;
    `renamed` maps such a name to the command's parameter of another name (layout="layout_").
    """
    params_for = {**{name: name for name in fields}, **renamed}

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        unknown = set(params_for.values()) - {p.name for p in params}
        if unknown:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(unknown))}")
        at = next((i for i, p in enumerate(params) if p.name == "json_output"), len(params))
        added = [
            inspect.Parameter("sglang_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=SglangUrlOption),
            inspect.Parameter("sglang_timeout", inspect.Parameter.KEYWORD_ONLY, default=5.0, annotation=SglangTimeoutOption),
            inspect.Parameter("sglang_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
        ]
        kinds = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]

        @functools.wraps(command)
        def wrapper(*, sglang_url: str | None, sglang_timeout: float, sglang_ctx: typer.Context, **kwargs: Any):
            if sglang_url is None:
                return command(**kwargs)
            json_output = bool(kwargs.get("json_output", False))
            with reporting(json_output):
                from hicache_ops.sglang.server_info import resolve_from_server

                given = {f: kwargs[p] for f, p in params_for.items() if _given(sglang_ctx, p)}
                resolution = resolve_from_server(sglang_url, given, timeout=sglang_timeout)
            applied = [f for f in params_for if f in resolution.values and f not in given]
            for name in applied:
                kwargs[params_for[name]] = resolution.values[name]
            _report(sglang_ctx, resolution, params_for, applied)
            token = JSON_EXTRAS.set(
                {"sglang_server": resolution.to_json(), "server_disagreements": resolution.disagreements}
            )
            try:
                return command(**kwargs)
            finally:
                JSON_EXTRAS.reset(token)

        wrapper.__signature__ = signature.replace(parameters=[*kinds[:at], *added, *kinds[at:]])
        return wrapper

    return decorate
