"""`--sglang-url`: fill a command's deployment options from a running SGLang server.

One decorator gives a command the option; the command itself stays unchanged. Options the user
set on the command line keep their value; each that disagrees with the server is printed as a
warning and listed as `server_disagreements` in the command's JSON (docs/server-info.md#toolkit-use).
The server is asked within the command's `--timeout` (added when the command has none).
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

import typer

from hicache_ops.cli.common.options import INPUT, TimeoutOption
from hicache_ops.cli.common.output import PROVENANCE, reporting, stderr

SglangUrlOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-url",
        metavar="URL",
        help="A running SGLang server: options not given are read from its /server_info; "
        "a given option that disagrees with it is reported.",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
SglangCompareUrlOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-url",
        metavar="URL",
        help="A running SGLang server: report where the serve instance's configuration differs from it.",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
SglangLayoutUrlOption = Annotated[
    str | None,
    typer.Option(
        "--sglang-url",
        metavar="URL",
        help="A running SGLang 0.5.23 server: check the pools of its L3 layout against the keys "
        "(docs/side-pools.md#l3-layout-endpoint).",
        show_default=False,
        rich_help_panel=INPUT,
    ),
]
DEFAULT_TIMEOUT_S = 3.0
# The command parameter that receives the ServerInfo itself (no option).
SERVER_PARAM = "sglang_server"
# Where a value came from when the user typed it (click's ParameterSource names).
_GIVEN_SOURCES = ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def option_given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in _GIVEN_SOURCES


def option_flag(ctx: typer.Context, name: str, value: Any = None) -> str:
    """The option as a user would type it: `--page-size 32`, `--mla`, `--no-mooncake`."""
    param = next((p for p in ctx.command.params if p.name == name), None)
    flag = max(param.opts, key=len) if param is not None and param.opts else "--" + name.replace("_", "-")
    if isinstance(value, bool):
        off = param.secondary_opts if param is not None else []
        return flag if value else (off[0] if off else f"{flag}=false")
    if isinstance(value, Enum):
        value = value.value
    return flag if value is None else f"{flag} {value}"


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _choices_of(annotation: Any) -> type[Enum] | None:
    """The Enum an option's annotation takes (`Annotated[HostLayout | None, ...]` -> HostLayout)."""
    base = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    if isinstance(base, types.UnionType) or typing.get_origin(base) is typing.Union:
        base = next((a for a in typing.get_args(base) if a is not type(None)), base)
    return base if isinstance(base, type) and issubclass(base, Enum) else None


def _as_option(value: Any, choices: type[Enum] | None, flag: str) -> Any:
    """A server value in the type the option takes; one the option does not offer is an InputError."""
    if choices is None:
        return value
    try:
        return choices(value)
    except ValueError:
        from hicache_ops.errors import InputError

        raise InputError(
            f"the SGLang server's {flag} {value!r} is not one this toolkit knows "
            f"({', '.join(member.value for member in choices)})."
        ) from None


def _rules_from_server(resolution, given: dict):
    """The rules the server's version chose (None when --sglang-version was given or no version was read)."""
    from hicache_ops.sglang.views import SglangRulesView

    if "sglang_version" in given or resolution.server.sglang_version is None:
        return None
    return SglangRulesView(
        version=resolution.server.sglang_version,
        requested=resolution.server.version,
        reason="--sglang-url",
        notes=[n for n in resolution.server.notes if "rules" in n],
    )


def _report(ctx: typer.Context, resolution, applied: list[str]) -> None:
    server = resolution.server
    if applied:
        shown = ", ".join(option_flag(ctx, f, resolution.values[f]) for f in applied)
        stderr.print(f"[dim]from SGLang {server.version} at {server.url}:[/] {shown}", highlight=False)
    for item in resolution.disagreements:
        stderr.print(
            f"[bold yellow]warning:[/] {option_flag(ctx, item['field'], item['flag'])} disagrees with "
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


def sglang_url_option(*fields: str) -> Callable:
    """Decorate a command so `--sglang-url URL` fills the options named here from the server.

    `fields` are names of `ServerInfo.values()`, which are also the command's parameter names
    (one flag, one parameter name: tests/cli/test_options.py).
    A command parameter named `sglang_server` is no option: it receives the `ServerInfo` read
    (None without --sglang-url), for what is not an option value (the L3 layout's pools).
    """

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        takes_server = SERVER_PARAM in signature.parameters
        if takes_server:
            signature = signature.replace(
                parameters=[p for p in signature.parameters.values() if p.name != SERVER_PARAM]
            )
        params = {p.name: p for p in signature.parameters.values()}
        unknown = set(fields) - set(params)
        if unknown:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(unknown))}")
        choices = {name: _choices_of(params[name].annotation) for name in fields}
        keyword = inspect.Parameter.KEYWORD_ONLY
        # typer hands the context to one parameter only: reuse the command's own when it has one.
        ctx_name = next((n for n, p in params.items() if p.annotation is typer.Context), None)
        added = [inspect.Parameter("sglang_url", keyword, default=None, annotation=SglangUrlOption)]
        if "timeout" not in params:
            added.append(inspect.Parameter("timeout", keyword, default=DEFAULT_TIMEOUT_S, annotation=TimeoutOption))
        if ctx_name is None:
            added.append(inspect.Parameter("sglang_ctx", keyword, annotation=typer.Context))
        own = [p.replace(kind=keyword) for p in params.values()]
        at = next((i for i, p in enumerate(own) if p.name == "json_output"), len(own))

        @functools.wraps(command)
        def wrapper(*, sglang_url: str | None, **kwargs: Any):
            ctx = kwargs[ctx_name] if ctx_name else kwargs.pop("sglang_ctx")
            timeout = kwargs["timeout"] if "timeout" in params else kwargs.pop("timeout")
            if takes_server:
                kwargs[SERVER_PARAM] = None
            if sglang_url is None:
                return command(**kwargs)
            json_output = bool(kwargs.get("json_output", False))
            with reporting(json_output):
                from hicache_ops.sglang.server_info import resolve_from_server

                given = {f: _plain(kwargs[f]) for f in fields if option_given(ctx, f)}
                resolution = resolve_from_server(sglang_url, given, timeout=timeout)
                applied = [f for f in fields if f in resolution.values and f not in given]
                for name in applied:
                    kwargs[name] = _as_option(resolution.values[name], choices[name], option_flag(ctx, name))
                if takes_server:
                    kwargs[SERVER_PARAM] = resolution.server
            _report(ctx, resolution, applied)
            from hicache_ops.sglang.views import ServerProvenance

            # The values the command runs with, for deployment_settings(ctx), and what the server said
            # (emit adds it to the command's JSON).
            ctx.params.update({name: kwargs[name] for name in applied})
            ctx.meta[PROVENANCE] = ServerProvenance(
                sglang_server=resolution.view(),
                server_disagreements=resolution.disagreements,
                sglang_rules=_rules_from_server(resolution, given),
            )
            return command(**kwargs)

        signature = signature.replace(parameters=[*own[:at], *added, *own[at:]])
        wrapper.__signature__ = signature  # type: ignore[attr-defined]  # typer reads the options from it
        return wrapper

    return decorate
