"""The hybrid-model presets carry the real models' numbers: checked against the model configs as
the installed libraries define them (their defaults are the published checkpoints' configs) and,
for the Mamba state shapes, against SGLang 0.5.23's own shape and dtype functions."""

from __future__ import annotations

from collections import Counter

from hicache_ops.sglang import geometry
from hicache_ops.sglang.side_pool_specs import PRESETS, V0_5_23


def test_gpt_oss_preset_is_gpt_oss_120b():
    from transformers import GptOssConfig

    config = GptOssConfig()  # its defaults are gpt-oss-120b's
    kinds = Counter(config.layer_types)
    kv = geometry.preset("gpt-oss-120b")
    assert (kv.layers, kv.kv_heads, kv.head_dim) == (
        kinds["full_attention"],
        config.num_key_value_heads,
        config.head_dim,
    )
    chosen = PRESETS["gpt-oss"]
    (swa,) = chosen.pools
    assert (swa.name, swa.layers, swa.heads, swa.head_dim) == (
        "swa",
        kinds["sliding_attention"],
        config.num_key_value_heads,
        config.head_dim,
    )
    assert chosen.sliding_window_tokens == config.sliding_window
    assert chosen.geometry == "gpt-oss-120b" and not chosen.mla


def test_qwen3_next_preset_matches_sglang_state_shapes():
    from sglang.srt.configs.mamba_utils import Mamba2StateShape, mamba2_state_dtype
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    # Its defaults are Qwen3-Next-80B-A3B's, except the layer pattern, which only the checkpoint's
    # config.json gives (every 4th layer full attention).
    config = Qwen3NextConfig(full_attention_interval=4)
    key_dim = config.linear_key_head_dim * config.linear_num_key_heads
    value_dim = config.linear_value_head_dim * config.linear_num_value_heads
    # The arguments Qwen3NextConfig.mamba2_cache_params passes, at tensor parallel 1 (the preset
    # states tp-size-1 shapes; that property reads a parallel state a test process does not have).
    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=value_dim,
        n_groups=config.linear_num_key_heads,
        num_heads=config.linear_num_value_heads,
        head_dim=config.linear_value_head_dim,
        state_size=config.linear_key_head_dim,
        conv_kernel=config.linear_conv_kernel_dim,
        conv_shard_groups=[key_dim, key_dim, value_dim],
    )
    dtypes = mamba2_state_dtype(config)
    chosen = PRESETS["qwen3-next"]
    (mamba,) = chosen.pools
    assert mamba.layers == len(config.linear_layer_ids)
    assert [tuple(s) for s in shape.conv] == [tuple(s) for s in mamba.conv_shapes] and mamba.conv == len(shape.conv)
    assert tuple(shape.temporal) == mamba.temporal_shape
    assert (str(dtypes.conv).removeprefix("torch."), str(dtypes.temporal).removeprefix("torch.")) == (
        mamba.conv_dtype,
        mamba.temporal_dtype,
    )
    kv = geometry.preset(chosen.geometry)
    assert (kv.layers, kv.kv_heads, kv.head_dim) == (
        len(config.full_attention_layer_ids),
        config.num_key_value_heads,
        config.head_dim,
    )
    assert V0_5_23 in chosen.versions
