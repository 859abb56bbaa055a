"""Model geometry as SGLang sizes KV: layers, KV heads, head size, dtype (MLA: latent row).

What decides the KV bytes of one token on one rank, the named presets the toolkit ships, and
the resolution of `--preset` / geometry flags into one `ModelGeometry`. Rules: docs/host-pool.md.
Pure Python: torch is imported only by `ModelGeometry.torch_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hicache_ops.errors import InputError, SettingError

if TYPE_CHECKING:
    import torch

    from hicache_ops.sglang.views import GeometryView

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


def normalise_dtype(name: str) -> str:
    """The canonical dtype name for `name` (aliases like bf16 or float8_e4m3fn accepted)."""
    key = str(name).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise InputError(
            f"dtype {name!r} is unknown.", hint=f"Use one of: {', '.join(DTYPES)} (fp8 is stored as uint8)."
        )
    return key


def positive_int(name: str, value: Any) -> int:
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
        positive_int("layers", self.layers)
        if self.mla:
            positive_int("kv-lora-rank", self.kv_lora_rank)
            positive_int("qk-rope-head-dim", self.qk_rope_head_dim)
            object.__setattr__(self, "kv_heads", 1)
            object.__setattr__(self, "head_dim", self.kv_lora_rank + self.qk_rope_head_dim)
        else:
            positive_int("heads", self.kv_heads)
            positive_int("head-dim", self.head_dim)
            if self.kv_lora_rank or self.qk_rope_head_dim:
                raise InputError(
                    "kv-lora-rank and qk-rope-head-dim describe MLA models only.",
                    hint="Add --mla, or drop --kv-lora-rank/--qk-rope-head-dim.",
                )

    @classmethod
    def mha(
        cls, layers: int, kv_heads: int, head_dim: int, dtype: str = "bfloat16", name: str | None = None
    ) -> ModelGeometry:
        return cls(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, name=name)

    @classmethod
    def mla_model(
        cls, layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: str = "bfloat16", name: str | None = None
    ) -> ModelGeometry:
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

    def torch_dtype(self, *, stored: bool = True) -> torch.dtype:
        """The torch dtype (the stored one by default: uint8 for fp8). Imports torch."""
        import torch

        dtype: torch.dtype = getattr(torch, _TORCH_NAMES[self.stored_dtype if stored else self.dtype])
        return dtype

    def heads_per_rank(self, tp_size: int = 1) -> int:
        """KV heads one attention-TP rank holds: max(1, kv_heads // tp_size); MLA: 1.

        With fewer KV heads than ranks each rank holds one replicated head; SGLang's attention
        layers shard heads evenly, so kv_heads and tp_size must divide one another.
        """
        positive_int("tp-size", tp_size)
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
            positive_int("tp-size", tp_size)
            return self.layers * self.kv_cache_dim * self.itemsize
        return 2 * self.layers * self.heads_per_rank(tp_size) * self.head_dim * self.itemsize

    def with_dtype(self, dtype: str) -> ModelGeometry:
        return replace(self, dtype=dtype)

    def view(self) -> GeometryView:
        from hicache_ops.sglang.views import GeometryView

        mla = self.mla
        return GeometryView(
            name=self.name,
            attention="mla" if mla else "mha",
            layers=self.layers,
            dtype=self.dtype,
            stored_dtype=self.stored_dtype,
            itemsize=self.itemsize,
            kv_lora_rank=self.kv_lora_rank if mla else None,
            qk_rope_head_dim=self.qk_rope_head_dim if mla else None,
            kv_cache_dim=self.kv_cache_dim if mla else None,
            kv_heads=None if mla else self.kv_heads,
            head_dim=None if mla else self.head_dim,
        )


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
    # Hybrid models: the KV pool holds the full-attention layers only; the others are side pools
    # (sglang/pools.py PRESETS: gpt-oss, qwen3-next).
    "gpt-oss-120b": _preset_mha("gpt-oss-120b", 18, 8, 64),  # 36 layers alternate sliding/full
    "qwen3-next-80b-a3b": _preset_mha("qwen3-next-80b-a3b", 12, 2, 256),  # every 4th of 48 layers
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
            raise SettingError(
                "preset",
                f"{preset_name} cannot be combined with {flags}.",
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
        missing = [
            f
            for f, v in (
                ("--layers", layers),
                ("--kv-lora-rank", kv_lora_rank),
                ("--qk-rope-head-dim", qk_rope_head_dim),
            )
            if v is None
        ]
        if missing:
            raise InputError(
                f"an MLA geometry needs {', '.join(missing)}.",
                hint="Give --layers, --kv-lora-rank and --qk-rope-head-dim, or a --preset.",
            )
        assert layers is not None and kv_lora_rank is not None and qk_rope_head_dim is not None  # `missing` is empty
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
    assert layers is not None and kv_heads is not None and head_dim is not None  # `missing` is empty
    return ModelGeometry.mha(layers, kv_heads, head_dim, dtype)


# ---------------------------------------------------------------------------------------------
# Layout / IO backend rewrites at start-up
# ---------------------------------------------------------------------------------------------
