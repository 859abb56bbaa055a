"""Host-pool (L2) and device-pool (L1) geometry as SGLang lays them out (FACTS §3).

What lives here:
- `ModelGeometry` and named `PRESETS`: the numbers that decide KV bytes per token.
- `resolve_layout`: the layout / IO-backend rewrites SGLang applies at start-up
  (0.5.14 `server_args.py::_handle_hicache`, 0.5.23 `arg_groups/hicache_hook.py::handle_hicache`).
- `HostPoolLayout`: the host pool one rank allocates (size, page count, buffer shapes) and the
  per-page zero-copy metadata the Mooncake store hands to `batch_put_from` / `batch_get_into`
  (SGLang's `get_page_buffer_meta` / `get_split_heads_page_buffer_meta`), as byte offsets.
- `DevicePoolLayout`: the layer-first L1 pool the embedded engine allocates.
- `inspect_layout`: the report behind `hicache inspect layout`.

Pure Python: nothing here imports torch at module level (`hicache --help` stays fast).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .errors import InputError
from .versions import NEWEST, V0_5_14, V0_5_23, validate_version

# The host layouts a deployment can choose (--hicache-mem-layout). 0.5.23's page_unified is
# internal (not a CLI choice) and is not modelled; page_first_kv_split is Ascend-only.
LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_first_direct", "page_head")
# The IO backends between device and host on CUDA/ROCm (kernel_ascend is Ascend-only).
IO_BACKENDS: tuple[str, ...] = ("kernel", "direct")
# Layouts each IO backend can actually move (the transfer branches of the host pools).
KERNEL_IO_LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_head")
DIRECT_IO_LAYOUTS: tuple[str, ...] = ("layer_first", "page_first_direct")
MLA_LAYOUTS: tuple[str, ...] = ("layer_first", "page_first", "page_first_direct")

# dtype name -> (bytes per element, dtype the buffers are stored in). SGLang stores fp8 KV as
# uint8 because index_put is not implemented for the float8 types.
DTYPES: dict[str, tuple[int, str]] = {
    "bfloat16": (2, "bfloat16"),
    "float16": (2, "float16"),
    "float32": (4, "float32"),
    "fp8_e4m3": (1, "uint8"),
    "fp8_e5m2": (1, "uint8"),
}
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
}
# torch attribute names, resolved lazily by ModelGeometry.torch_dtype().
_TORCH_NAMES: dict[str, str] = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "uint8": "uint8",
}

DEFAULT_HICACHE_RATIO = 2.0
# The buffer name SGLang's host pools use for their one KV tensor.
KV_BUFFER = "kv_buffer"


def check_layout_for(layout: str, *, mla: bool) -> str:
    """Return `layout` if SGLang accepts it for this attention kind, else raise an InputError."""
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is unknown.", hint=f"Use one of: {', '.join(LAYOUTS)}.")
    if mla and layout == "page_head":
        raise InputError(
            "layout 'page_head' is not supported for MLA models.",
            hint="Use page_first or page_first_direct for MLA.",
        )
    return layout


def check_io_backend(io_backend: str) -> str:
    """Return `io_backend` if it is one this toolkit models, else raise an InputError."""
    if io_backend not in IO_BACKENDS:
        raise InputError(
            f"io backend {io_backend!r} is unknown.", hint=f"Use one of: {', '.join(IO_BACKENDS)}."
        )
    return io_backend


def normalise_dtype(name: str) -> str:
    """The canonical dtype name for `name` (aliases like bf16 or float8_e4m3fn accepted)."""
    key = str(name).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise InputError(
            f"dtype {name!r} is unknown.", hint=f"Use one of: {', '.join(DTYPES)} (fp8 is stored as uint8)."
        )
    return key


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} {value!r} must be a positive integer.", hint=f"Pass --{name} 1 or more.")
    return value


# ---------------------------------------------------------------------------------------------
# Model geometry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelGeometry:
    """What decides the KV bytes of one token: layers, KV heads (total, before TP), head size
    and dtype for MHA; layers, kv_lora_rank and qk_rope_head_dim for MLA (one latent row of
    kv_lora_rank + qk_rope_head_dim per token and layer, the same on every rank).

    For MLA `kv_heads` is 1 and `head_dim` the latent row width, as SGLang's MLA pool stores
    (tokens, 1, kv_lora_rank + qk_rope_head_dim) per layer.
    """

    layers: int
    kv_heads: int = 1
    head_dim: int = 0
    dtype: str = "bfloat16"
    mla: bool = False
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalise_dtype(self.dtype))
        _positive("layers", self.layers)
        if self.mla:
            _positive("kv-lora-rank", self.kv_lora_rank)
            _positive("qk-rope-head-dim", self.qk_rope_head_dim)
            object.__setattr__(self, "kv_heads", 1)
            object.__setattr__(self, "head_dim", self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            _positive("heads", self.kv_heads)
            _positive("head-dim", self.head_dim)
            if self.kv_lora_rank or self.qk_rope_head_dim:
                raise InputError(
                    "kv-lora-rank and qk-rope-head-dim describe MLA models only.",
                    hint="Add --mla, or drop --kv-lora-rank/--qk-rope-head-dim.",
                )

    @classmethod
    def mha(cls, layers: int, kv_heads: int, head_dim: int, dtype: str = "bfloat16", name: str | None = None):
        return cls(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, name=name)

    @classmethod
    def mla_model(
        cls, layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: str = "bfloat16", name: str | None = None
    ):
        return cls(
            layers=layers,
            mla=True,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
            dtype=dtype,
            name=name,
        )

    @property
    def itemsize(self) -> int:
        """Bytes per stored element (1 for fp8)."""
        return DTYPES[self.dtype][0]

    @property
    def stored_dtype(self) -> str:
        """The dtype the KV buffers hold: the model dtype, or uint8 for fp8."""
        return DTYPES[self.dtype][1]

    @property
    def kv_cache_dim(self) -> int:
        """MLA: the latent row width per token and layer; MHA: head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.mla else self.head_dim

    def torch_dtype(self, *, stored: bool = True):
        """The torch dtype (the stored one by default: uint8 for fp8). Imports torch."""
        import torch

        return getattr(torch, _TORCH_NAMES[self.stored_dtype if stored else self.dtype])

    def heads_per_rank(self, tp_size: int = 1) -> int:
        """KV heads one attention-TP rank holds: max(1, kv_heads // tp_size); MLA: 1.

        With fewer KV heads than ranks each rank holds one replicated head; SGLang's attention
        layers shard heads evenly, so kv_heads and tp_size must divide one another.
        """
        _positive("tp-size", tp_size)
        if self.mla:
            return 1
        if self.kv_heads >= tp_size:
            if self.kv_heads % tp_size:
                raise InputError(
                    f"{self.kv_heads} KV heads cannot be split evenly over tp-size {tp_size}.",
                    hint=f"Use a tp-size that divides {self.kv_heads} or is a multiple of it.",
                )
            return self.kv_heads // tp_size
        if tp_size % self.kv_heads:
            raise InputError(
                f"tp-size {tp_size} cannot replicate {self.kv_heads} KV heads evenly.",
                hint=f"Use a tp-size that divides {self.kv_heads} or is a multiple of it.",
            )
        return 1

    def bytes_per_token(self, tp_size: int = 1) -> int:
        """KV bytes of one token on one rank (SGLang's size_per_token).

        MHA 2 * L * H_rank * D * itemsize; MLA L * (kv_lora_rank + qk_rope_head_dim) * itemsize.
        """
        if self.mla:
            _positive("tp-size", tp_size)
            return self.layers * self.kv_cache_dim * self.itemsize
        return 2 * self.layers * self.heads_per_rank(tp_size) * self.head_dim * self.itemsize

    def with_dtype(self, dtype: str) -> ModelGeometry:
        return replace(self, dtype=dtype)

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "attention": "mla" if self.mla else "mha",
            "layers": self.layers,
            "dtype": self.dtype,
            "stored_dtype": self.stored_dtype,
            "itemsize": self.itemsize,
        }
        if self.mla:
            out.update(
                kv_lora_rank=self.kv_lora_rank,
                qk_rope_head_dim=self.qk_rope_head_dim,
                kv_cache_dim=self.kv_cache_dim,
            )
        else:
            out.update(kv_heads=self.kv_heads, head_dim=self.head_dim)
        return out


def _preset_mha(name: str, layers: int, kv_heads: int, head_dim: int) -> ModelGeometry:
    return ModelGeometry.mha(layers, kv_heads, head_dim, "bfloat16", name=name)


def _preset_mla(name: str, layers: int, kv_lora_rank: int, qk_rope_head_dim: int) -> ModelGeometry:
    return ModelGeometry.mla_model(layers, kv_lora_rank, qk_rope_head_dim, "bfloat16", name=name)


# Public config.json numbers (num_hidden_layers, num_key_value_heads, head_dim; MLA:
# kv_lora_rank, qk_rope_head_dim). The KV dtype is the model's bf16 (--kv-cache-dtype auto).
PRESETS: dict[str, ModelGeometry] = {
    # The embedded engine's default: small enough to check every byte of every page.
    "tiny": _preset_mha("tiny", 2, 2, 16),
    "tiny-mla": _preset_mla("tiny-mla", 2, 32, 16),
    "qwen3-0.6b": _preset_mha("qwen3-0.6b", 28, 8, 128),
    "qwen3-8b": _preset_mha("qwen3-8b", 36, 8, 128),
    "qwen3-32b": _preset_mha("qwen3-32b", 64, 8, 128),
    "llama-3.1-8b": _preset_mha("llama-3.1-8b", 32, 8, 128),
    "llama-3.1-70b": _preset_mha("llama-3.1-70b", 80, 8, 128),
    "deepseek-v2-lite": _preset_mla("deepseek-v2-lite", 27, 512, 64),
    "deepseek-v3": _preset_mla("deepseek-v3", 61, 512, 64),
}
DEFAULT_PRESET = "tiny"


def preset(name: str) -> ModelGeometry:
    """The named preset geometry, or an InputError naming the choices."""
    key = str(name).strip().lower()
    if key not in PRESETS:
        raise InputError(f"preset {name!r} is unknown.", hint=f"Use one of: {', '.join(PRESETS)}.")
    return PRESETS[key]


def resolve_geometry(
    *,
    preset_name: str | None = None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    mla: bool = False,
    kv_lora_rank: int | None = None,
    qk_rope_head_dim: int | None = None,
) -> ModelGeometry:
    """A geometry from a preset (its dtype may be overridden) or from explicit numbers."""
    shape_flags = {
        "--layers": layers,
        "--heads": kv_heads,
        "--head-dim": head_dim,
        "--kv-lora-rank": kv_lora_rank,
        "--qk-rope-head-dim": qk_rope_head_dim,
    }
    given = [flag for flag, value in shape_flags.items() if value is not None]
    if preset_name is not None:
        if given or mla:
            flags = ", ".join(given + (["--mla"] if mla else []))
            raise InputError(
                f"--preset {preset_name} cannot be combined with {flags}.",
                hint="Give --preset (optionally with --dtype) or the geometry flags, not both.",
            )
        geometry = preset(preset_name)
        return geometry.with_dtype(dtype) if dtype is not None else geometry
    dtype = dtype or "bfloat16"
    if mla:
        if kv_heads is not None or head_dim is not None:
            raise InputError(
                "--heads and --head-dim do not apply to MLA models.",
                hint="For --mla give --layers, --kv-lora-rank and --qk-rope-head-dim.",
            )
        missing = [f for f, v in (("--layers", layers), ("--kv-lora-rank", kv_lora_rank),
                                  ("--qk-rope-head-dim", qk_rope_head_dim)) if v is None]
        if missing:
            raise InputError(
                f"an MLA geometry needs {', '.join(missing)}.",
                hint="Give --layers, --kv-lora-rank and --qk-rope-head-dim, or a --preset.",
            )
        return ModelGeometry.mla_model(layers, kv_lora_rank, qk_rope_head_dim, dtype)
    if kv_lora_rank is not None or qk_rope_head_dim is not None:
        raise InputError(
            "--kv-lora-rank and --qk-rope-head-dim describe MLA models only.",
            hint="Add --mla, or give --heads and --head-dim for an MHA model.",
        )
    missing = [f for f, v in (("--layers", layers), ("--heads", kv_heads), ("--head-dim", head_dim)) if v is None]
    if missing == ["--layers", "--heads", "--head-dim"]:
        raise InputError(
            "no model geometry was given.",
            hint=f"Pass --preset (one of: {', '.join(PRESETS)}) or --layers, --heads and --head-dim.",
        )
    if missing:
        raise InputError(
            f"an MHA geometry needs {', '.join(missing)}.",
            hint="Give --layers, --heads and --head-dim, or a --preset.",
        )
    return ModelGeometry.mha(layers, kv_heads, head_dim, dtype)


# ---------------------------------------------------------------------------------------------
# Layout / IO backend rewrites at start-up
# ---------------------------------------------------------------------------------------------


class Resolution(NamedTuple):
    """What SGLang runs with after its start-up rewrites; unpacks as (layout, io_backend, notes)."""

    layout: str
    io_backend: str
    notes: list[str]


def resolve_layout(
    layout: str,
    io_backend: str,
    mooncake: bool,
    *,
    version: str = NEWEST,
    rocm: bool = False,
    dcp_size: int = 1,
) -> Resolution:
    """The (layout, io_backend) SGLang ends up with, and one note per rewrite, in its order.

    1. page_first_direct with the kernel backend switches the backend to direct.
    2. page_first with the direct backend switches the layout to page_first_direct.
    3. 0.5.14 on ROCm only: page_first with the kernel backend falls back to layer_first.
    4. A Mooncake L3 cannot use layer_first: it becomes page_first (kernel) or
       page_first_direct (direct). 0.5.23 skips this when dcp_size > 1 (MLA pages then go to
       Mooncake as multi-buffer objects).
    Nothing else is rewritten: page_head with direct IO starts and then fails at the first
    transfer (see `layout_warnings`).
    """
    validate_version(version)
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is unknown.", hint=f"Use one of: {', '.join(LAYOUTS)}.")
    check_io_backend(io_backend)
    _positive("dcp-size", dcp_size)
    notes: list[str] = []
    if layout == "page_first_direct" and io_backend == "kernel":
        io_backend = "direct"
        notes.append("io backend kernel -> direct: the kernel backend cannot move page_first_direct pages.")
    if layout == "page_first" and io_backend == "direct":
        layout = "page_first_direct"
        notes.append("layout page_first -> page_first_direct: the direct backend needs whole pages contiguous.")
    if version == V0_5_14 and rocm and layout == "page_first" and io_backend == "kernel":
        layout = "layer_first"
        notes.append(
            "layout page_first -> layer_first: SGLang 0.5.14 on ROCm has no page_first kernel write-back."
        )
    skip_for_dcp = version == V0_5_23 and dcp_size > 1
    if mooncake and layout == "layer_first" and not skip_for_dcp:
        layout = "page_first_direct" if io_backend == "direct" else "page_first"
        notes.append(
            f"layout layer_first -> {layout}: the Mooncake backend does not take layer_first "
            f"(kept io backend {io_backend})."
        )
    return Resolution(layout, io_backend, notes)


def layout_warnings(layout: str, io_backend: str, *, mla: bool) -> list[str]:
    """Combinations SGLang accepts at start-up but cannot run (after `resolve_layout`)."""
    out = []
    if mla and layout == "page_head":
        out.append("MLA models have no page_head host layout: SGLang fails building the host pool.")
    if layout == "page_head" and io_backend == "direct":
        out.append(
            "page_head with the direct io backend is not rewritten at start-up, but the direct "
            "backend cannot move page_head pages: the first host transfer fails; use --io-backend kernel."
        )
    return out


# ---------------------------------------------------------------------------------------------
# Host pool (L2)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BufferSpec:
    """One host tensor: its name, shape and stored dtype; `parts` are K/V sub-ranges."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    parts: tuple[tuple[str, int, int], ...] = ()  # (name, byte offset, nbytes)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "nbytes": self.nbytes,
        }
        if self.parts:
            out["parts"] = [{"name": n, "offset": o, "nbytes": b} for n, o, b in self.parts]
        return out


@dataclass(frozen=True)
class PageObject:
    """One contiguous byte range that SGLang hands to Mooncake for a page.

    `part` is k or v (MHA) or kv (MLA's latent row); `layer` is set for layer_first pieces;
    `heads` ([start, end) within this rank's heads) and `split` (the target-rank offset) for
    split heads.
    """

    buffer: str
    offset: int
    size: int
    part: str
    layer: int | None = None
    heads: tuple[int, int] | None = None
    split: int | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"buffer": self.buffer, "offset": self.offset, "size": self.size, "part": self.part}
        if self.layer is not None:
            out["layer"] = self.layer
        if self.heads is not None:
            out["heads"] = list(self.heads)
            out["split"] = self.split
        return out


@dataclass(frozen=True)
class PageMeta:
    index: int
    objects: tuple[PageObject, ...]

    def to_json(self) -> dict:
        return {"index": self.index, "objects": [o.to_json() for o in self.objects]}


@dataclass(frozen=True)
class HostPoolLayout:
    """The host KV pool one rank allocates, for a layout SGLang actually runs with.

    Size (FACTS §3): hicache_size_gb * 1e9 // bytes_per_token tokens when hicache_size_gb > 0,
    else int(device_tokens * hicache_ratio); then page_num = size // page_size + 1 and
    size = page_num * page_size (one page more than asked for).

    `tp_lcm_size` (extra-config, heterogeneous TP) splits heads for MHA page_head pools when it
    exceeds tp_size: each page then goes out as tp_lcm_size // tp_size K/V pairs.
    `mooncake` says whether the L3 tier is Mooncake (for `mooncake_zero_copy` and warnings).
    """

    geometry: ModelGeometry
    layout: str
    page_size: int
    device_tokens: int
    hicache_ratio: float = DEFAULT_HICACHE_RATIO
    hicache_size_gb: float = 0
    tp_size: int = 1
    tp_lcm_size: int | None = None
    sglang_version: str = NEWEST
    mooncake: bool = True
    size: int = field(init=False)
    page_num: int = field(init=False)

    def __post_init__(self) -> None:
        validate_version(self.sglang_version)
        check_layout_for(self.layout, mla=self.geometry.mla)
        _positive("page-size", self.page_size)
        _positive("device-tokens", self.device_tokens)
        _positive("tp-size", self.tp_size)
        if isinstance(self.hicache_size_gb, bool) or not isinstance(self.hicache_size_gb, (int, float)) or (
            self.hicache_size_gb < 0 or not math.isfinite(self.hicache_size_gb)
        ):
            raise InputError(
                f"hicache-size {self.hicache_size_gb!r} must be a number of GB >= 0.",
                hint="Pass --hicache-size 0 to size the pool by --hicache-ratio.",
            )
        if self.hicache_size_gb == 0 and (
            isinstance(self.hicache_ratio, bool)
            or not isinstance(self.hicache_ratio, (int, float))
            or not math.isfinite(self.hicache_ratio)
            or self.hicache_ratio <= 0
        ):
            raise InputError(
                f"hicache-ratio {self.hicache_ratio!r} must be a number above 0.",
                hint="Pass --hicache-ratio 2.0 (SGLang's default) or a --hicache-size in GB.",
            )
        if self.tp_lcm_size is not None and (
            isinstance(self.tp_lcm_size, bool)
            or not isinstance(self.tp_lcm_size, int)
            or self.tp_lcm_size < 1
            or self.tp_lcm_size % self.tp_size
        ):
            raise InputError(
                f"tp-lcm-size {self.tp_lcm_size!r} is not a positive multiple of tp-size {self.tp_size}.",
                hint="SGLang requires tp_lcm_size % tp_size == 0.",
            )
        bpt = self.geometry.bytes_per_token(self.tp_size)  # validates heads against tp_size
        if self.split_factor > 1 and self.heads_per_rank % self.split_factor:
            raise InputError(
                f"tp-lcm-size {self.tp_lcm_size} splits each rank's {self.heads_per_rank} KV heads "
                f"into {self.split_factor} parts, which does not divide evenly.",
                hint="Choose a tp-lcm-size whose factor over tp-size divides the heads per rank.",
            )
        if self.hicache_size_gb > 0:
            size = int(self.hicache_size_gb * 1e9 // bpt)
        else:
            size = int(self.device_tokens * self.hicache_ratio)
        page_num = size // self.page_size + 1
        if self.sglang_version == V0_5_14 and page_num * self.page_size <= self.device_tokens:
            raise InputError(
                f"a host pool of {page_num * self.page_size} tokens is not larger than the device pool "
                f"({self.device_tokens} tokens), which SGLang 0.5.14 refuses at start-up.",
                hint="Raise --hicache-ratio above 1 or --hicache-size.",
            )
        object.__setattr__(self, "page_num", page_num)
        object.__setattr__(self, "size", page_num * self.page_size)

    # --- sizes -----------------------------------------------------------------------------

    @property
    def mla(self) -> bool:
        return self.geometry.mla

    @property
    def itemsize(self) -> int:
        return self.geometry.itemsize

    @property
    def heads_per_rank(self) -> int:
        return self.geometry.heads_per_rank(self.tp_size)

    @property
    def bytes_per_token(self) -> int:
        return self.geometry.bytes_per_token(self.tp_size)

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    @property
    def host_bytes(self) -> int:
        return self.bytes_per_token * self.size

    @property
    def split_factor(self) -> int:
        """Parts each page's heads are cut into for heterogeneous TP (1: no split)."""
        if (
            not self.mla
            and self.layout == "page_head"
            and self.tp_lcm_size is not None
            and self.tp_lcm_size > self.tp_size
        ):
            return self.tp_lcm_size // self.tp_size
        return 1

    # --- buffers ---------------------------------------------------------------------------

    @property
    def buffer_shape(self) -> tuple[int, ...]:
        L, S, P, ps = self.geometry.layers, self.size, self.page_num, self.page_size
        if self.mla:
            C = self.geometry.kv_cache_dim
            return {
                "layer_first": (L, S, 1, C),
                "page_first": (S, L, 1, C),
                "page_first_direct": (P, L, ps, 1, C),
            }[self.layout]
        H, D = self.heads_per_rank, self.geometry.head_dim
        return {
            "layer_first": (2, L, S, H, D),
            "page_first": (2, S, L, H, D),
            "page_first_direct": (2, P, L, ps, H, D),
            "page_head": (2, P, H, ps, L, D),
        }[self.layout]

    @property
    def v_offset(self) -> int:
        """Byte offset of V from the buffer start (MHA: K and V share one buffer); MLA: 0."""
        if self.mla:
            return 0
        return self.geometry.layers * self.size * self.heads_per_rank * self.geometry.head_dim * self.itemsize

    @property
    def buffers(self) -> list[BufferSpec]:
        spec = BufferSpec(KV_BUFFER, self.buffer_shape, self.geometry.stored_dtype, self.itemsize)
        if not self.mla:
            spec = replace(spec, parts=(("k", 0, self.v_offset), ("v", self.v_offset, self.v_offset)))
        return [spec]

    # --- zero-copy page metadata -----------------------------------------------------------

    def _check_pages(self, page_indices: Iterable[int]) -> list[int]:
        pages = []
        for p in page_indices:
            if isinstance(p, bool) or not isinstance(p, int):
                raise InputError(f"page index {p!r} is not an integer.", hint="Pass pages like 0,2,5.")
            if not 0 <= p < self.page_num:
                raise InputError(
                    f"page {p} is outside this host pool's pages 0..{self.page_num - 1}.",
                    hint=f"Pick pages below {self.page_num}.",
                )
            pages.append(p)
        return pages

    def page_objects(self, page: int) -> tuple[PageObject, ...]:
        """The byte ranges of one host page, in SGLang's order (get_page_buffer_meta, or
        get_split_heads_page_buffer_meta with split heads)."""
        (page,) = self._check_pages([page])
        isz, L, ps = self.itemsize, self.geometry.layers, self.page_size
        first = page * ps  # the page's first token slot
        if self.mla:
            C = self.geometry.kv_cache_dim
            if self.layout == "layer_first":
                return tuple(
                    PageObject(KV_BUFFER, (first + layer * self.size) * C * isz, ps * C * isz, "kv", layer=layer)
                    for layer in range(L)
                )
            return (PageObject(KV_BUFFER, first * L * C * isz, L * ps * C * isz, "kv"),)
        H, D, v_off = self.heads_per_rank, self.geometry.head_dim, self.v_offset
        out: list[PageObject] = []
        if self.layout == "layer_first":
            for layer in range(L):
                k = (first + layer * self.size) * H * D * isz
                out.append(PageObject(KV_BUFFER, k, ps * H * D * isz, "k", layer=layer))
                out.append(PageObject(KV_BUFFER, k + v_off, ps * H * D * isz, "v", layer=layer))
            return tuple(out)
        page_start = first * L * H * D * isz
        f = self.split_factor
        if f == 1:
            size = L * ps * H * D * isz
            return (
                PageObject(KV_BUFFER, page_start, size, "k"),
                PageObject(KV_BUFFER, page_start + v_off, size, "v"),
            )
        # page_head split heads: a page is (H, ps, L, D); each head group is contiguous.
        group = H // f
        size = L * ps * H * D * isz // f
        for i in range(f):
            head = i * group
            k = page_start + head * ps * L * D * isz
            heads = (head, head + group)
            out.append(PageObject(KV_BUFFER, k, size, "k", heads=heads, split=i))
            out.append(PageObject(KV_BUFFER, k + v_off, size, "v", heads=heads, split=i))
        return tuple(out)

    def page_buffer_meta(self, page_indices: Iterable[int]) -> list[PageMeta]:
        """Per page, the objects (buffer, byte offset from the buffer start, size) in SGLang's
        order: MHA [k, v] (layer_first: k, v per layer; split heads: k, v per head group),
        MLA one latent block (layer_first: one piece per layer)."""
        return [PageMeta(p, self.page_objects(p)) for p in self._check_pages(page_indices)]

    def flat_meta(self, page_indices: Iterable[int]) -> tuple[list[int], list[int]]:
        """(offsets, sizes) flattened over pages: SGLang's (pointers - data_ptr, sizes)."""
        offsets, sizes = [], []
        for meta in self.page_buffer_meta(page_indices):
            for obj in meta.objects:
                offsets.append(obj.offset)
                sizes.append(obj.size)
        return offsets, sizes

    @property
    def objects_per_page(self) -> int:
        return len(self.page_objects(0))

    @property
    def mooncake_objects_per_page(self) -> int:
        """Mooncake objects per page: MHA 2 (2 per head group when split), MLA 1."""
        return 1 if self.mla else 2 * self.split_factor

    @property
    def mooncake_zero_copy(self) -> bool:
        """Whether the Mooncake store can put/get pages straight from this pool.

        MHA layer_first is refused (a K/V object would be L scattered pieces); MLA layer_first
        goes as one multi-buffer object of L pieces.
        """
        return self.mla or self.layout != "layer_first"

    def warnings(self) -> list[str]:
        out = []
        if self.mooncake and not self.mla and self.layout == "layer_first":
            out.append(
                "Mooncake refuses MHA layer_first pools (a page's K and V are L scattered pieces "
                "each); SGLang normally rewrites layer_first to page_first for Mooncake."
            )
        if self.size <= self.device_tokens:
            out.append(
                f"the host pool ({self.size} tokens) is not larger than the device pool "
                f"({self.device_tokens} tokens): L2 can hold little that L1 does not."
            )
        return out

    def notes(self) -> list[str]:
        out = []
        if self.mooncake and self.mla and self.layout == "layer_first":
            out.append(
                f"MLA layer_first: Mooncake stores each page as one object gathered from "
                f"{self.geometry.layers} per-layer pieces (multi-buffer)."
            )
        if self.mooncake and self.mla and self.tp_size > 1:
            out.append("MLA: every rank holds the same latent rows; only tp rank 0 writes them to L3.")
        if not self.mla and self.geometry.kv_heads < self.tp_size:
            out.append(
                f"{self.geometry.kv_heads} KV heads over tp-size {self.tp_size}: each rank holds one replicated head."
            )
        if self.split_factor > 1:
            out.append(
                f"split heads: tp-lcm-size {self.tp_lcm_size} / tp-size {self.tp_size} = {self.split_factor}; "
                f"each page goes to L3 as {self.split_factor} K/V pairs of {self.heads_per_rank // self.split_factor} "
                f"heads, named for target ranks tp*{self.split_factor}+i."
            )
        elif self.tp_lcm_size is not None and self.tp_lcm_size > self.tp_size:
            out.append(
                "tp-lcm-size only splits heads for MHA with the page_head layout; it changes nothing here."
            )
        return out

    def to_json(self) -> dict:
        return {
            "sglang_version": self.sglang_version,
            "geometry": self.geometry.to_json(),
            "layout": self.layout,
            "page_size": self.page_size,
            "tp_size": self.tp_size,
            "tp_lcm_size": self.tp_lcm_size,
            "heads_per_rank": self.heads_per_rank,
            "device_tokens": self.device_tokens,
            "hicache_ratio": self.hicache_ratio,
            "hicache_size_gb": self.hicache_size_gb,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_page": self.bytes_per_page,
            "size_tokens": self.size,
            "page_num": self.page_num,
            "host_bytes": self.host_bytes,
            "buffers": [b.to_json() for b in self.buffers],
            "split_factor": self.split_factor,
            "objects_per_page": self.objects_per_page,
            "mooncake_objects_per_page": self.mooncake_objects_per_page,
            "mooncake_zero_copy": self.mooncake_zero_copy,
        }


# ---------------------------------------------------------------------------------------------
# Device pool (L1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePoolLayout:
    """The L1 pool one rank keeps: layer-first, per layer one (slots, H, D) tensor for K and one
    for V (MLA: one (slots, 1, kv_lora_rank + qk_rope_head_dim) tensor).

    SGLang allocates device_tokens + page_size slots: the extra page (slot 0's page) absorbs
    writes of padded tokens. `padded=False` gives exactly device_tokens slots.
    """

    geometry: ModelGeometry
    device_tokens: int
    page_size: int = 1
    tp_size: int = 1
    padded: bool = True

    def __post_init__(self) -> None:
        _positive("device-tokens", self.device_tokens)
        _positive("page-size", self.page_size)
        self.geometry.heads_per_rank(self.tp_size)

    @property
    def slots(self) -> int:
        return self.device_tokens + (self.page_size if self.padded else 0)

    @property
    def heads(self) -> int:
        return self.geometry.heads_per_rank(self.tp_size)

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        """(L, slots, H, D) for K (MLA: the latent (L, slots, 1, C))."""
        g = self.geometry
        if g.mla:
            return (g.layers, self.slots, 1, g.kv_cache_dim)
        return (g.layers, self.slots, self.heads, g.head_dim)

    @property
    def v_shape(self) -> tuple[int, int, int, int] | None:
        """(L, slots, H, D) for V; None for MLA (one latent buffer)."""
        return None if self.geometry.mla else self.k_shape

    @property
    def nbytes(self) -> int:
        return self.slots * self.geometry.bytes_per_token(self.tp_size)

    def to_json(self) -> dict:
        return {
            "slots": self.slots,
            "k_shape": list(self.k_shape),
            "v_shape": list(self.v_shape) if self.v_shape else None,
            "dtype": self.geometry.stored_dtype,
            "nbytes": self.nbytes,
        }


def device_pool_layout(
    geometry: ModelGeometry, device_tokens: int, page_size: int = 1, tp_size: int = 1, *, padded: bool = True
) -> DevicePoolLayout:
    return DevicePoolLayout(geometry, device_tokens, page_size, tp_size, padded)


# ---------------------------------------------------------------------------------------------
# The `hicache inspect layout` report
# ---------------------------------------------------------------------------------------------


def parse_pages(text: str | None) -> list[int] | None:
    """`0,2,5` -> [0, 2, 5]; None or blank -> None (the default pages)."""
    if text is None or not text.strip():
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise InputError(f"page {part!r} in --pages is not an integer.", hint="Pass pages like 0,2,5.") from None
        out.append(value)
    return out


@dataclass
class LayoutReport:
    requested_layout: str
    requested_io_backend: str
    resolution: Resolution
    pool: HostPoolLayout
    pages: list[PageMeta]
    device: DevicePoolLayout
    notes: list[str]
    warnings: list[str]

    def to_json(self) -> dict:
        body = self.pool.to_json()
        body.pop("layout")
        return {
            "sglang_version": self.pool.sglang_version,
            "layout": self.requested_layout,
            "effective_layout": self.resolution.layout,
            "requested_io_backend": self.requested_io_backend,
            "io_backend": self.resolution.io_backend,
            "mooncake": self.pool.mooncake,
            **{k: v for k, v in body.items() if k != "sglang_version"},
            "device_pool": self.device.to_json(),
            "pages": [p.to_json() for p in self.pages],
            "rewrites": list(self.resolution.notes),
            "notes": self.notes,
            "warnings": self.warnings,
        }


def default_pages(page_num: int) -> list[int]:
    """The first two pages and the last one (the extra page SGLang adds)."""
    return sorted({p for p in (0, 1, page_num - 1) if 0 <= p < page_num})


def inspect_layout(
    geometry: ModelGeometry,
    *,
    layout: str = "page_first",
    io_backend: str = "kernel",
    page_size: int = 64,
    device_tokens: int = 65536,
    hicache_ratio: float | None = None,
    hicache_size_gb: float = 0,
    tp_size: int = 1,
    tp_lcm_size: int | None = None,
    pages: Sequence[int] | None = None,
    mooncake: bool = True,
    sglang_version: str = NEWEST,
) -> LayoutReport:
    """What SGLang builds for this model and these flags: the rewrites it applies, the host
    pool of one rank, and the zero-copy metadata of the chosen pages.

    `hicache_ratio` None means SGLang's default (2.0). `pages` None: pages 0, 1 and the last.
    """
    validate_version(sglang_version)
    check_layout_for(layout, mla=geometry.mla)
    resolution = resolve_layout(layout, io_backend, mooncake, version=sglang_version)
    ratio = DEFAULT_HICACHE_RATIO if hicache_ratio is None else hicache_ratio
    pool = HostPoolLayout(
        geometry,
        resolution.layout,
        page_size,
        device_tokens,
        hicache_ratio=ratio,
        hicache_size_gb=hicache_size_gb,
        tp_size=tp_size,
        tp_lcm_size=tp_lcm_size,
        sglang_version=sglang_version,
        mooncake=mooncake,
    )
    chosen = default_pages(pool.page_num) if pages is None else list(pages)
    metas = pool.page_buffer_meta(chosen)
    notes = list(resolution.notes) + pool.notes()
    if hicache_size_gb > 0:
        notes.append(
            f"--hicache-size {hicache_size_gb} GB sets the pool: {hicache_size_gb} * 1e9 // "
            f"{pool.bytes_per_token} bytes per token, plus one page"
            + (" (--hicache-ratio is ignored)." if hicache_ratio is not None else ".")
        )
    elif hicache_ratio is None and sglang_version == V0_5_23:
        notes.append(
            "SGLang 0.5.23 without --hicache-ratio or --hicache-size may lower the 2.0 ratio at "
            "start-up so all host pools fit 0.8 of the free host memory (after a 10 GiB reserve)."
        )
    warnings = layout_warnings(resolution.layout, resolution.io_backend, mla=geometry.mla) + pool.warnings()
    device = DevicePoolLayout(geometry, device_tokens, page_size, tp_size)
    return LayoutReport(layout, io_backend, resolution, pool, metas, device, notes, warnings)
