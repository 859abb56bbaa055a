"""What a running SGLang server says about its deployment (docs/server-info.md).

An on-call engineer has a URL, not the launch flags. Both supported versions serve their resolved
`ServerArgs` as one flat JSON object on `GET /server_info` (alias `/get_server_info`); this module
fetches it, checks that it is SGLang's, and turns it into the values the toolkit's options take
(page size, key-prefix parts, parallel sizes, HiCache flags). Flags the user gave explicitly win;
each one that disagrees with the server is reported, never silently dropped.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError, UnreachableError
from hicache_ops.sglang.launch import LaunchArgs
from hicache_ops.sglang.page_keys import Deployment
from hicache_ops.sglang.versions import NEWEST, OLDEST, V0_5_23, VersionChoice, family, resolve_version, since

# /get_hicache_l3_cache_layout exists since 0.5.23 (entrypoints/http_server.py).
L3_LAYOUT_SINCE = "0.5.23"

if TYPE_CHECKING:
    import httpx

    from hicache_ops.sglang.views import SglangServerView

# docs/server-info.md#routes: prefer the current route; the alias exists in both versions.
INFO_ROUTES = ("/server_info", "/get_server_info")
L3_LAYOUT_ROUTE = "/get_hicache_l3_cache_layout"
# Fields every SGLang server-info body has in both versions; their absence means another server.
REQUIRED_FIELDS = ("version", "model_path", "page_size", "tp_size")
DEFAULT_TIMEOUT_S = 5.0
# SGLang's defaults for the prefetch keys the controller takes out of the extra-config
# (docs/server-info.md#toolkit-use).
EXTRA_CONFIG_DEFAULTS = {"prefetch_threshold": 256, "prefetch_timeout_base": 1, "prefetch_timeout_per_ki_token": 0.25}
# A `hicache serve` instance's configuration field (path in /v1/stats "config") for each server value.
SERVE_CONFIG_FIELDS = {
    "sglang_version": ("sglang_version",),
    "page_size": ("page_size",),
    "tp_size": ("tp_size",),
    "key_prefix": ("key_prefix",),
    "layout": ("host_layout",),
    "write_policy": ("write_policy",),
    "prefetch_policy": ("stop_policy",),
    "prefetch_threshold": ("prefetch_threshold",),
    "prefetch_timeout_base": ("timeout_budget", "base"),
    "prefetch_timeout_per_ki_token": ("timeout_budget", "per_ki_token"),
}


@dataclass(frozen=True)
class ServerInfo:
    """A server's deployment as its info endpoint reports it (resolved values, after rewrites)."""

    url: str
    route: str
    version: str
    sglang_version: str | None  # the supported key scheme the version maps to, None when unknown
    page_size: int
    model_path: str
    served_model_name: str | None
    tp_size: int
    pp_size: int
    dp_size: int
    attn_dp_size: int
    attn_cp_size: int
    dcp_size: int
    storage_tp_size: int
    hierarchical_cache: bool
    mem_layout: str | None
    io_backend: str | None
    write_policy: str | None
    prefetch_policy: str | None
    hicache_ratio: float | None
    hicache_size_gb: int | None
    storage_backend: str | None
    extra_config: dict[str, Any] | None
    max_total_num_tokens: int | None
    l3_layout: dict[str, Any] | None
    launch_flags: str = ""
    notes: tuple[str, ...] = ()

    @property
    def mla(self) -> bool | None:
        """Whether the KV pool is MLA: from an L3 layout that names it, or DCP (0.5.23 only).

        SGLang accepts DCP > 1 with MLA only (docs/keys.md#dcp); otherwise the arguments do not
        say (the model's config is not served).
        """
        inner = (self.l3_layout or {}).get("hicache_object_layout") or {}
        value = inner.get("is_mla_backend")
        if isinstance(value, bool):
            return value
        return True if self.dcp_size > 1 else None

    @property
    def logical_page_size(self) -> int:
        """Tokens per page of the radix tree and the L3 keys: `page_size * dcp_size` under DCP.

        0.5.23's allocator widens its pages by the DCP size and the tree follows it
        (docs/keys.md#dcp); 0.5.14 has no DCP.
        """
        return self.page_size * self.dcp_size

    @property
    def model_name(self) -> str:
        """The model name SGLang hands its storage backend (docs/keys.md#key-prefix)."""
        return self.served_model_name or self.model_path

    def values(self) -> dict[str, Any]:
        """The toolkit's option values this server determines; unknown ones are left out."""
        extra = self.extra_config or {}
        tag = extra.get("extra_backend_tag")
        out: dict[str, Any] = {
            "sglang_version": self.sglang_version,
            "page_size": self.logical_page_size,
            "model_name": self.model_name,
            "extra_backend_tag": None if tag is None else str(tag),
            "tp_lcm_size": _positive_int(extra.get("tp_lcm_size")),
            "tp_size": self.storage_tp_size,
            "pp_size": self.pp_size,
            "dcp_size": self.dcp_size,
            "layout": self.mem_layout,
            "io_backend": self.io_backend,
            "write_policy": self.write_policy,
            "prefetch_policy": self.prefetch_policy,
            "hicache_ratio": self.hicache_ratio,
            "hicache_size": self.hicache_size_gb,
            "storage_backend": self.storage_backend,
            "mooncake": self.storage_backend == "mooncake",
            "device_tokens": self.max_total_num_tokens,
            "mla": self.mla,
            "server_args": self.launch_flags or None,
        }
        if self.extra_config is not None or self.storage_backend:
            for name, default in EXTRA_CONFIG_DEFAULTS.items():
                value = extra.get(name, default)
                out[name] = (
                    value if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None
                )
        return {name: value for name, value in out.items() if value is not None}

    def deployment(self, **given: Any) -> Deployment:
        """The key-naming deployment of this server, with `given` fields overriding it."""
        values = {**self.values(), **given}
        if "sglang_version" not in values:
            raise _unknown_version(self)
        return Deployment(
            version=values["sglang_version"],
            model_name=values.get("model_name"),
            extra_backend_tag=values.get("extra_backend_tag"),
            tp_size=values.get("tp_size", 1),
            pp_size=values.get("pp_size", 1),
            mla=values.get("mla", False),
            layout=values.get("layout", "page_first"),
            tp_lcm_size=values.get("tp_lcm_size"),
            dcp_size=values.get("dcp_size", 1),
            page_size=values.get("page_size"),
        ).validate()


@dataclass
class Resolution:
    """Option values from a server overlaid with the flags given explicitly."""

    server: ServerInfo
    values: dict[str, Any]
    disagreements: list[dict[str, Any]] = field(default_factory=list)

    def view(self) -> SglangServerView:
        from hicache_ops.sglang.views import SglangServerView

        return SglangServerView(
            url=self.server.url,
            version=self.server.version,
            route=self.server.route,
            values=self.server.values(),
            notes=list(self.server.notes),
        )


def _unknown_version(info: ServerInfo) -> InputError:
    return InputError(
        f"the server at {info.url} runs SGLang {info.version}, whose key rules this toolkit does not know.",
        hint=f"Pass --sglang-version (a release from {OLDEST} to {NEWEST}) to choose the rules to apply.",
    )


def _check_url(url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(
            f"SGLang URL {url!r} must start with http:// or https://.", hint="For example http://127.0.0.1:30000."
        )
    return url.rstrip("/")


def _get(client: httpx.Client, url: str, route: str, timeout: float) -> httpx.Response:
    import httpx

    try:
        return client.get(route)
    except httpx.TimeoutException:
        raise UnreachableError(f"the SGLang server at {url} did not answer {route} within {timeout:g} s.") from None
    except httpx.TransportError as exc:
        raise UnreachableError(
            f"no SGLang server answers at {url} ({type(exc).__name__}).",
            hint="Check the URL (the server's --host and --port) and that the server is up.",
        ) from None


def _json_body(response: httpx.Response, url: str, route: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
        raise InputError(f"{url}{route} answered with {kind}, not JSON: it is not an SGLang server.") from None
    if not isinstance(body, dict) or any(name not in body for name in REQUIRED_FIELDS):
        raise InputError(
            f"{url}{route} answered JSON without SGLang's server arguments "
            f"({', '.join(REQUIRED_FIELDS)}): it is not an SGLang server."
        )
    return body


def fetch_server_info(url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[dict[str, Any], str]:
    """The raw info body of the SGLang server at `url`, and the route that answered.

    Every wait is bounded by `timeout` seconds; no answer is an UnreachableError (exit 3), an
    answer that is not SGLang's info an InputError (exit 2).
    """
    import httpx

    base = _check_url(url)
    if not timeout > 0:
        raise InputError(f"timeout {timeout:g} s must be positive.")
    with httpx.Client(base_url=base, timeout=httpx.Timeout(timeout), follow_redirects=False) as client:
        statuses = []
        for route in INFO_ROUTES:
            response = _get(client, base, route, timeout)
            if response.status_code == 200:
                return _json_body(response, base, route), route
            if response.status_code in (401, 403):
                raise InputError(
                    f"the server at {base} refused {route} (HTTP {response.status_code}).",
                    hint="It runs with an API key; this toolkit reads servers that answer without one.",
                )
            if response.status_code >= 500:
                raise UnreachableError(f"the server at {base} failed on {route} (HTTP {response.status_code}).")
            statuses.append(f"{route} HTTP {response.status_code}")
        raise InputError(f"{base} is not an SGLang server: {', '.join(statuses)}.")


def fetch_l3_layout(url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any] | None:
    """0.5.23's L3 object layout reply (docs/side-pools.md#l3-layout-endpoint), None when not served."""
    import httpx

    base = _check_url(url)
    with httpx.Client(base_url=base, timeout=httpx.Timeout(timeout)) as client:
        response = _get(client, base, L3_LAYOUT_ROUTE, timeout)
    if response.status_code != 200:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def served_choice(version: str) -> VersionChoice | None:
    """The rules a served version string gets (docs/releases.md), or None when it is older than
    0.5.14 or not a release number; a newer one gets the newest rules with a warning note."""
    try:
        return resolve_version(version or "", reason="the server's reported version")
    except InputError:
        return None


def supported_version(version: str) -> str | None:
    """The release whose rules a served version string gets, None when the toolkit has none."""
    choice = served_choice(version)
    return None if choice is None else choice.version


def _extra_config(source: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """The storage extra-config as a dict, or None with a note saying why it cannot be read."""
    if source is None or source == "":
        return None, []
    if not isinstance(source, str):
        return None, [f"the server's storage extra-config is {type(source).__name__}, not a string; ignored."]
    if source.startswith("@"):
        return None, [
            f"the storage extra-config is the file {source[1:]} on the server host, not readable over HTTP; "
            "pass --extra-backend-tag / --tp-lcm-size if it sets them."
        ]
    try:
        parsed = json.loads(source)
    except ValueError:
        return None, ["the server's storage extra-config is not valid JSON; ignored."]
    if not isinstance(parsed, dict):
        return None, ["the server's storage extra-config is not a JSON object; ignored."]
    return parsed, []


# Bookkeeping fields of LaunchArgs, not server arguments.
_LAUNCH_BOOKKEEPING = ("given", "warnings")


def launch_flags(body: dict[str, Any], version: str | None) -> str:
    """Launch flags equivalent to the resolved values the launch-flag parser reads (docs/launch.md).

    A value SGLang resolved is passed as the flag that would set it; false switches and unset
    values are left out, as is an extra-config that names a file on the server host. 0.5.23
    derives the deprecated enable_dp_attention from attn_dp_size, so only 0.5.14 sends it.
    """
    argv: list[str] = []
    for name in (f.name for f in fields(LaunchArgs) if f.name not in _LAUNCH_BOOKKEEPING):
        value = body.get(name)
        if (
            value is None
            or value is False
            or (name == "enable_dp_attention" and version is not None and family(version) == V0_5_23)
        ):
            continue
        if name == "hicache_storage_backend_extra_config" and (not isinstance(value, str) or value.startswith("@")):
            continue
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return shlex.join(argv)


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _int(body: dict[str, Any], name: str, default: int) -> int:
    value = _positive_int(body.get(name))
    return default if value is None else value


def _storage_tp_size(body: dict[str, Any]) -> int:
    """Attention TP with DP attention, else the whole TP (docs/server-info.md#storage-tp).

    0.5.23 reports the attention-DP width as `attn_dp_size`; 0.5.14 has `dp_size` with the
    `enable_dp_attention` switch. The storage backend's tp is the attention-TP group then.
    """
    tp = _int(body, "tp_size", 1)
    attn_dp = _attn_dp_size(body)
    if attn_dp <= 1:
        return tp
    return max(tp // attn_dp // _int(body, "attn_cp_size", 1), 1)


def _attn_dp_size(body: dict[str, Any]) -> int:
    if "attn_dp_size" in body:
        return _int(body, "attn_dp_size", 1)
    return _int(body, "dp_size", 1) if body.get("enable_dp_attention") else 1


def interpret(body: dict[str, Any], url: str, route: str, l3_layout: dict[str, Any] | None = None) -> ServerInfo:
    """Read a server-info body (docs/server-info.md#body-0514, #body-0523) into a ServerInfo."""
    notes: list[str] = []
    version = str(body["version"])
    choice = served_choice(version)
    scheme = None if choice is None else choice.version
    if choice is not None:
        notes.append(f"the server reports SGLang {version}: applying the {scheme} rules (from --sglang-url).")
        notes += [n for n in choice.notes]
    page_size = body["page_size"]
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise InputError(f"the server at {url} reports page_size {page_size!r}, not a positive integer.")
    if not body.get("enable_hierarchical_cache"):
        notes.append("the server runs without HiCache (enable_hierarchical_cache is false): it writes nothing to L3.")
    extra_source = body.get("hicache_storage_backend_extra_config")
    extra, extra_notes = _extra_config(extra_source)
    notes += extra_notes
    layout = body.get("hicache_object_layout") if l3_layout is None else l3_layout
    if not isinstance(layout, dict):
        layout = None
    ratio = body.get("hicache_ratio")
    size = body.get("hicache_size")
    max_tokens = body.get("max_total_num_tokens")
    info = ServerInfo(
        url=url,
        route=route,
        version=version,
        sglang_version=scheme,
        page_size=page_size,
        model_path=str(body["model_path"]),
        served_model_name=body.get("served_model_name") or None,
        tp_size=_int(body, "tp_size", 1),
        pp_size=_int(body, "pp_size", 1),
        dp_size=_int(body, "dp_size", 1),
        attn_dp_size=_attn_dp_size(body),
        attn_cp_size=_int(body, "attn_cp_size", 1),
        dcp_size=_int(body, "dcp_size", 1),
        storage_tp_size=_storage_tp_size(body),
        hierarchical_cache=bool(body.get("enable_hierarchical_cache")),
        mem_layout=body.get("hicache_mem_layout"),
        io_backend=body.get("hicache_io_backend"),
        write_policy=body.get("hicache_write_policy"),
        prefetch_policy=body.get("hicache_storage_prefetch_policy"),
        hicache_ratio=float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else None,
        hicache_size_gb=size if isinstance(size, int) and not isinstance(size, bool) else None,
        storage_backend=body.get("hicache_storage_backend") or None,
        extra_config=extra,
        max_total_num_tokens=_positive_int(max_tokens),
        l3_layout=layout,
        launch_flags=launch_flags(body, scheme),
        notes=tuple(notes),
    )
    return _with_prefix_check(info)


def _with_prefix_check(info: ServerInfo) -> ServerInfo:
    """Note when the L3 layout's key prefix differs from the one derived from the arguments.

    0.5.23's layout carries the store's own prefix (docs/side-pools.md#l3-layout-endpoint); a
    difference means a prefix part this toolkit does not model (a DCP part, a pool format tag).
    """
    inner = (info.l3_layout or {}).get("hicache_object_layout") or {}
    if "key_prefix" not in inner or info.sglang_version is None or not since(info.sglang_version, L3_LAYOUT_SINCE):
        return info
    served = inner["key_prefix"]
    try:
        derived = info.deployment().schemes()[0].prefix.rstrip("_") or None
    except InputError as exc:
        return replace(info, notes=(*info.notes, f"the server's arguments give no valid key scheme: {exc.message}"))
    if served == derived:
        return info
    note = f"the server's L3 layout names key prefix {served!r}; its arguments give {derived!r}."
    return replace(info, notes=(*info.notes, note))


def read_server(url: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> ServerInfo:
    """Fetch and interpret the server at `url`; 0.5.23's L3 layout route fills a missing layout."""
    body, route = fetch_server_info(url, timeout=timeout)
    base = _check_url(url)
    layout = None
    scheme = supported_version(str(body["version"]))
    if "hicache_object_layout" not in body and scheme is not None and since(scheme, L3_LAYOUT_SINCE):
        layout = fetch_l3_layout(base, timeout=timeout)
    return interpret(body, base, route, layout)


def resolve_from_server(url: str, given: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT_S) -> Resolution:
    """The server's option values with `given` (flags set explicitly) winning over them.

    Returns every value (given or from the server) and the list of `{field, flag, server}`
    where a given flag differs from what the server reports.
    """
    info = read_server(url, timeout=timeout)
    served = info.values()
    if "sglang_version" not in served and "sglang_version" not in given:
        raise _unknown_version(info)
    disagreements = [
        {"field": name, "flag": value, "server": served[name]}
        for name, value in given.items()
        if name in served and not _same(value, served[name])
    ]
    return Resolution(server=info, values={**served, **given}, disagreements=disagreements)


def serve_disagreements(serve_config: dict[str, Any], info: ServerInfo) -> list[dict[str, Any]]:
    """Where a `hicache serve` instance does not mirror the SGLang server: `[{field, serve, server}]`.

    Its prefetch verdicts describe its own configuration; each difference says how far they
    carry over to the server.
    """
    served = info.values()
    if "sglang_version" in served:
        try:
            served["key_prefix"] = info.deployment().schemes()[0].prefix
        except InputError:
            pass
    out = []
    for name, path in SERVE_CONFIG_FIELDS.items():
        value: Any = serve_config
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if name in served and value is not None and not _same(value, served[name]):
            out.append({"field": name, "serve": value, "server": served[name]})
    return out


def _same(flag: Any, server: Any) -> bool:
    if isinstance(flag, (int, float)) and isinstance(server, (int, float)) and not isinstance(flag, bool):
        return float(flag) == float(server)
    return bool(flag == server)
