"""The JSON views of the sglang layer's value objects (geometry, host and device pools, side host
pools), rendered by hicache_ops.results.json_data. Loaded when a view is made, not on import of the
objects (`hicache --help` loads no pydantic)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from hicache_ops.results import OnlyWith, Result


class GeometryView(Result):
    """A model's KV geometry as JSON: MLA's latent sizes, or MHA's heads (the other kind's are absent)."""

    omit_if_none = ("kv_lora_rank", "qk_rope_head_dim", "kv_cache_dim", "kv_heads", "head_dim")

    name: str | None = Field(description="the preset's or model's name, `null` for a geometry given by its sizes")
    attention: Literal["mla", "mha"] = Field(description="MLA (one latent row per token) or MHA (K and V heads)")
    layers: int = Field(description="attention layers")
    dtype: str = Field(description="the KV cache dtype asked for")
    stored_dtype: str = Field(description="the dtype the buffers hold (fp8 kinds are stored as uint8)")
    itemsize: int = Field(description="bytes per element")
    kv_lora_rank: int | None = Field(None, description="MLA: the latent's rank")
    qk_rope_head_dim: int | None = Field(None, description="MLA: the rope part of the row")
    kv_cache_dim: int | None = Field(None, description="MLA: elements per row (kv_lora_rank + qk_rope_head_dim)")
    kv_heads: int | None = Field(None, description="MHA: KV heads of the model")
    head_dim: int | None = Field(None, description="MHA: elements per head")


class BufferPart(Result):
    name: str = Field(description="the part (`k`, `v`)")
    offset: int = Field(description="its byte offset in the buffer")
    nbytes: int = Field(description="its bytes")


class BufferView(Result):
    omit_if_none = ("parts",)

    name: str = Field(description="SGLang's buffer name")
    shape: list[int] = Field(description="the tensor's shape")
    dtype: str = Field(description="the stored dtype")
    nbytes: int = Field(description="the buffer's bytes")
    parts: list[BufferPart] | None = Field(None, description="K/V sub-ranges of one buffer (when it holds both)")


class PageObjectView(Result):
    omit_if_none = ("layer",)
    only_with = (OnlyWith("a split-heads layout", ("heads", "split")),)

    buffer: str = Field(description="the buffer the range is in")
    offset: int = Field(description="byte offset from the buffer's start")
    size: int = Field(description="bytes")
    part: str = Field(description="`k`, `v` (MHA) or `kv` (MLA's latent row)")
    layer: int | None = Field(None, description="layer_first: the layer of the piece")
    heads: list[int] | None = Field(None, description="split heads: [start, end) within this rank's heads")
    split: int | None = Field(None, description="split heads: the target-rank offset")


class PageMetaView(Result):
    index: int = Field(description="the page")
    objects: list[PageObjectView] = Field(description="the byte ranges SGLang hands to Mooncake for it, in order")


class DevicePoolView(Result):
    slots: int = Field(description="token slots (device tokens plus SGLang's padding page)")
    k_shape: list[int] = Field(description="(layers, slots, heads, head_dim) of K (MLA: the latent)")
    v_shape: list[int] | None = Field(description="the same for V; `null` for MLA")
    dtype: str = Field(description="the stored dtype")
    nbytes: int = Field(description="the pool's bytes")


class HostPoolView(Result):
    sglang_version: str = Field(description="the SGLang release whose rules apply")
    geometry: GeometryView = Field(description="the model geometry")
    layout: str = Field(description="the host layout SGLang runs with")
    page_size: int = Field(description="tokens per page")
    tp_size: int = Field(description="tensor-parallel size")
    tp_lcm_size: int | None = Field(description="--tp-lcm-size (split heads), `null` when not given")
    heads_per_rank: int = Field(description="KV heads one rank holds")
    device_tokens: int = Field(description="L1 tokens")
    hicache_ratio: int | float = Field(description="host pool size / device pool size")
    hicache_size_gb: int | float = Field(description="--hicache-size (GB; 0: the ratio decides)")
    bytes_per_token: int = Field(description="KV bytes of one token on one rank")
    bytes_per_page: int = Field(description="KV bytes of one page on one rank")
    size_tokens: int = Field(description="host pool tokens (page_num * page_size)")
    page_num: int = Field(description="host pool pages (one more than asked for)")
    host_bytes: int = Field(description="the host pool's bytes")
    buffers: list[BufferView] = Field(description="the host tensors")
    split_factor: int = Field(description="split heads: K/V pairs each page is written as (1: none)")
    objects_per_page: int = Field(description="byte ranges per page")
    mooncake_objects_per_page: int = Field(description="Mooncake objects per page")
    mooncake_zero_copy: bool = Field(description="Mooncake reads and writes the host buffers in place")


class SideObjectView(Result):
    omit_if_none = ("layer",)
    only_with = (OnlyWith("a split-heads layout", ("heads", "split")),)

    suffix: str = Field(description="the object's suffix (the key after the page key)")
    buffer: str = Field(description="the buffer the range is in")
    offset: int = Field(description="byte offset from the buffer's start")
    size: int = Field(description="bytes")
    part: str = Field(description="the part of the page the range holds")
    layer: int | None = Field(None, description="layer_first: the layer of the piece")
    heads: list[int] | None = Field(None, description="split heads: [start, end) within this rank's heads")
    split: int | None = Field(None, description="split heads: the target-rank offset")


class SidePageMetaView(Result):
    index: int = Field(description="the page (slot page for Mamba)")
    objects: list[SideObjectView] = Field(description="the byte ranges and objects of the page, in order")


class SideHostPoolView(Result):
    name: str = Field(description="SGLang's pool name")
    sglang_class: str = Field(description="the SGLang host pool class that holds it")
    layout: str = Field(description="its host layout")
    page_size: int = Field(description="slots per page (Mamba: 1)")
    size_slots: int = Field(description="host slots")
    page_num: int = Field(description="host pages")
    device_slots: int | None = Field(description="the device pool it mirrors; `null` when it follows another host pool")
    bytes_per_slot: int = Field(description="bytes of one slot")
    bytes_per_page: int = Field(description="bytes of one page")
    host_bytes: int = Field(description="the pool's host bytes")
    shapes: dict[str, Any] = Field(description="the pool's tensor shapes and dtypes")
    buffers: list[BufferView] = Field(description="the host tensors")
    suffixes: list[str] = Field(description="the object suffixes a page is written under")
    zero_copy: bool = Field(description="SGLang's page metadata works for this layout (else no byte ranges)")
    objects_per_page: int = Field(description="objects per page (0 without zero copy)")
    notes: list[str] = Field(description="plain-language remarks")
    warnings: list[str] = Field(description="what SGLang does silently with this pool")


class SidePoolView(Result):
    name: str = Field(description="SGLang's pool name")
    suffixes: list[str] = Field(description="the pool's object suffixes over every selected rank")
    hit_policy: str = Field(description="how SGLang counts the pool's hit pages")
    trailing_pages: int | None = Field(description="pages a trailing-pages pool reads, else `null`")


class L3LayoutView(Result):
    """A server's `/get_hicache_l3_cache_layout` reply, read and checked."""

    omit_if_none = ("rule_disagreements",)

    enabled: bool = Field(description="the server has an L3 layout (HiCache with a storage backend)")
    reason: str | None = Field(description="why it has none, `null` when enabled")
    backend: str | None = Field(description="the storage backend")
    page_size: int | None = Field(description="tokens per page")
    key_prefix: str | None = Field(description="what precedes every page key in object keys")
    is_mla_backend: bool | None = Field(description="the server's MLA flag for the store")
    pp_size: int = Field(description="pipeline stages")
    kv_suffixes: list[str] = Field(description="the KV's object suffixes over every stage")
    pools: list[SidePoolView] = Field(description="the side pools and their suffixes")
    rule_disagreements: list[dict[str, Any]] | None = Field(
        None, description="with --sglang-url: where our key rule disagrees with the server's layout"
    )


class SglangRulesView(Result):
    """Which release's rules a command applied when the server's version chose them."""

    version: str = Field(description="the release whose rules apply")
    requested: str | None = Field(description="the version asked for (given, or the server's or the installed one)")
    reason: str = Field(description="what chose the rules: --sglang-version, --sglang-url or the installed sglang")
    notes: list[str] = Field(description="how the reported version maps onto a release's rules")


class SglangServerView(Result):
    """The SGLang server --sglang-url read: what a command's JSON says it took its settings from."""

    url: str = Field(description="the server's URL")
    version: str = Field(description="the SGLang version it reports")
    route: str = Field(description="the route its settings were read from")
    values: dict[str, Any] = Field(description="the settings read, by option name")
    notes: list[str] = Field(description="what was assumed or could not be read")


class ServerProvenance(Result):
    """What --sglang-url read from the server, in the JSON of the command it configured (beside the
    command's own fields): the server, where it disagrees with the options given, and the rules it chose."""

    omit_if_none: ClassVar[tuple[str, ...]] = ("sglang_rules",)

    sglang_server: SglangServerView = Field(description="the SGLang server the settings were read from")
    server_disagreements: list[dict[str, Any]] = Field(
        description="options given on the command line that differ from the server's"
    )
    sglang_rules: SglangRulesView | None = Field(
        None, description="the rules the server's version chose (absent with --sglang-version)"
    )
