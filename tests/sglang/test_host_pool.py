"""Host/device pool layouts against SGLang 0.5.23's own pool classes built on the CPU, the
layout/IO rewrites against its own start-up hooks, and `hicache inspect layout` end to end."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# SGLang's real classes (a test dependency); no GPU needed for any of them.
from sglang.srt.arg_groups.hicache_hook import handle_hicache  # noqa: E402
from sglang.srt.arg_groups.overrides import resolving_view  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLAHostAllocation, MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from cli_runner import hicache
from hicache_ops.cli.common.output import json_data
from hicache_ops.commands.inspect.layout import inspect_layout, parse_pages
from hicache_ops.errors import InputError
from hicache_ops.sglang.geometry import PRESETS, ModelGeometry, resolve_geometry
from hicache_ops.sglang.host_pool import (
    HEAD_DIM,
    HEADS_PER_RANK,
    KV,
    LAYERS,
    LAYOUTS,
    MHA_HOST_BUFFERS,
    MLA_HOST_BUFFERS,
    PAGE_NUM,
    PAGE_SIZE,
    SIZE,
    DevicePoolLayout,
    HostPoolLayout,
)
from hicache_ops.sglang.rewrites import resolve_layout

# SGLang checks requested host bytes against this machine's free memory minus 10 GiB; book the
# tiny pools below against a fixed budget (SGLang's own scope) so a busy machine cannot fail them.
BUDGET = 1 << 40


# --- building SGLang's pools --------------------------------------------------------------------


def sglang_device_pool(geo: ModelGeometry, device_tokens: int, page_size: int, tp_size: int = 1):
    if geo.mla:
        return MLATokenToKVPool(
            size=device_tokens,
            page_size=page_size,
            dtype=geo.torch_dtype(stored=False),
            kv_lora_rank=geo.kv_lora_rank,
            qk_rope_head_dim=geo.qk_rope_head_dim,
            layer_num=geo.layers,
            device="cpu",
            enable_memory_saver=False,
        )
    return MHATokenToKVPool(
        size=device_tokens,
        page_size=page_size,
        dtype=geo.torch_dtype(stored=False),
        head_num=geo.heads_per_rank(tp_size),
        head_dim=geo.head_dim,
        layer_num=geo.layers,
        device="cpu",
        enable_memory_saver=False,
    )


def sglang_host_pool(geo, layout, page_size, device_tokens, ratio=2.0, size_gb=0, tp_size=1):
    """SGLang 0.5.23's host pool, built from its real device pool the way its assembler does."""
    dev = sglang_device_pool(geo, device_tokens, page_size, tp_size)
    info = dev.get_device_pool_infos()[0].buffer_info
    common = dict(
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=dev.size,
        start_layer=dev.start_layer,
        end_layer=dev.end_layer,
    )
    with host_memory_budget_scope(BUDGET):
        if geo.mla:
            host = MLATokenToKVPoolHost(
                info,
                ratio,
                size_gb,
                page_size,
                layout,
                target_layer_num=dev.layer_num,
                override_kv_cache_dim=dev.kv_cache_dim,
                **common,
            )
        else:
            host = MHATokenToKVPoolHost(info, ratio, size_gb, page_size, layout, **common)
    return dev, host


def token_indices(pages, page_size):
    """Host token slots of whole pages, as SGLang's controller passes them."""
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size, dtype=torch.int64) for p in pages])


def pages_to_check(page_num):
    return sorted({0, 1, page_num // 2, page_num - 1} & set(range(page_num)))


MHA_CASES = [
    # geometry, page_size, device_tokens, ratio, tp_size
    (ModelGeometry.mha(2, 2, 16, "bfloat16"), 4, 64, 2.0, 1),
    (ModelGeometry.mha(3, 4, 8, "fp8_e4m3"), 8, 40, 1.5, 1),
    (ModelGeometry.mha(2, 4, 8, "float32"), 2, 30, 3.3, 2),
    (ModelGeometry.mha(1, 2, 4, "float16"), 1, 7, 2.0, 4),  # replicated head, page size 1
]
MLA_CASES = [
    (ModelGeometry.mla_model(3, 16, 8, "bfloat16"), 4, 64, 2.0),
    (ModelGeometry.mla_model(2, 32, 16, "fp8_e5m2"), 8, 40, 1.5),
    (ModelGeometry.mla_model(2, 8, 4, "float32"), 1, 9, 2.5),
]


# --- host pool geometry against SGLang ----------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", range(len(MHA_CASES)))
def test_mha_host_pool_matches_sglang(case, layout):
    geo, ps, dev_tokens, ratio, tp = MHA_CASES[case]
    _, host = sglang_host_pool(geo, layout, ps, dev_tokens, ratio, tp_size=tp)
    ours = HostPoolLayout(geo, layout, ps, dev_tokens, hicache_ratio=ratio, tp_size=tp)
    assert (ours.size, ours.page_num) == (host.size, host.page_num)
    assert ours.bytes_per_token == host.size_per_token
    assert ours.buffer_shape == tuple(host.kv_buffer.shape)
    assert geo.torch_dtype() == host.kv_buffer.dtype
    (buf,) = ours.buffers
    assert buf.nbytes == host.kv_buffer.nbytes == ours.host_bytes
    assert buf.dtype == str(host.kv_buffer.dtype).removeprefix("torch.")
    # K and V share the buffer; V starts where SGLang's v_buffer view starts.
    assert ours.v_offset == host.v_buffer.data_ptr() - host.kv_buffer.data_ptr()

    pages = pages_to_check(ours.page_num)
    ptrs, sizes = host.get_page_buffer_meta(token_indices(pages, ps))
    base = host.kv_buffer.data_ptr()
    offsets, our_sizes = ours.flat_meta(pages)
    assert offsets == [p - base for p in ptrs]
    assert our_sizes == list(sizes)


@pytest.mark.parametrize("factor", [2, 4])
def test_split_heads_meta_matches_sglang(factor):
    geo, ps, dev_tokens = ModelGeometry.mha(2, 8, 4, "bfloat16"), 4, 32
    tp = 2  # 4 heads per rank
    _, host = sglang_host_pool(geo, "page_head", ps, dev_tokens, tp_size=tp)
    ours = HostPoolLayout(geo, "page_head", ps, dev_tokens, tp_size=tp, tp_lcm_size=tp * factor)
    assert ours.split_factor == factor
    pages = pages_to_check(ours.page_num)
    ptrs, sizes = host.get_split_heads_page_buffer_meta(token_indices(pages, ps), factor)
    offsets, our_sizes = ours.flat_meta(pages)
    assert offsets == [p - host.kv_buffer.data_ptr() for p in ptrs]
    assert our_sizes == list(sizes)
    assert ours.mooncake_objects_per_page == 2 * factor


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("case", range(len(MLA_CASES)))
def test_mla_host_pool_matches_sglang(case, layout):
    geo, ps, dev_tokens, ratio = MLA_CASES[case]
    _, host = sglang_host_pool(geo, layout, ps, dev_tokens, ratio)
    ours = HostPoolLayout(geo, layout, ps, dev_tokens, hicache_ratio=ratio)
    assert (ours.size, ours.page_num) == (host.size, host.page_num)
    assert ours.bytes_per_token == host.size_per_token
    assert ours.buffer_shape == tuple(host.kv_buffer.shape)
    assert geo.torch_dtype() == host.kv_buffer.dtype
    assert ours.buffers[0].nbytes == host.kv_buffer.nbytes
    pages = pages_to_check(ours.page_num)
    ptrs, sizes = host.get_page_buffer_meta(token_indices(pages, ps))
    offsets, our_sizes = ours.flat_meta(pages)
    assert offsets == [p - host.kv_buffer.data_ptr() for p in ptrs]
    assert our_sizes == list(sizes)
    assert ours.objects_per_page == (geo.layers if layout == "layer_first" else 1)


def test_mla_page_head_is_refused_like_sglang():
    geo = ModelGeometry.mla_model(2, 16, 8)
    with pytest.raises(ValueError, match="page_head"):
        sglang_host_pool(geo, "page_head", 4, 32)
    with pytest.raises(InputError, match="page_head"):
        HostPoolLayout(geo, "page_head", 4, 32)


@pytest.mark.parametrize("size_gb", [1, 3])
@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2-lite"])
def test_hicache_size_gb_matches_sglang(name, size_gb):
    """--hicache-size sizing through SGLang's allocator-only MLA pool (no buffer is allocated)."""
    geo, ps, dev_tokens = PRESETS[name], 64, 4096
    alloc = MLAHostAllocation(
        dtype=geo.torch_dtype(),
        kv_lora_rank=geo.kv_lora_rank,
        qk_rope_head_dim=geo.qk_rope_head_dim,
        kv_cache_dim=geo.kv_cache_dim,
        size_per_token=geo.bytes_per_token(),
    )
    host = MLATokenToKVPoolHost(
        alloc,
        2.0,
        size_gb,
        ps,
        "page_first",
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=dev_tokens,
        start_layer=0,
        end_layer=geo.layers - 1,
        target_layer_num=geo.layers,
    )
    ours = HostPoolLayout(geo, "page_first", ps, dev_tokens, hicache_size_gb=size_gb)
    assert (ours.size, ours.page_num) == (host.size, host.page_num)
    assert ours.size == (int(size_gb * 1e9 // ours.bytes_per_token) // ps + 1) * ps


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_bytes_per_token_match_sglang(name):
    geo = PRESETS[name]
    _, host = sglang_host_pool(geo, "page_first", 4, 4)  # 12 host tokens: a few MB at most
    assert geo.bytes_per_token() == host.size_per_token


@pytest.mark.parametrize(
    "name, expected",
    [
        ("tiny", 2 * 2 * 2 * 16 * 2),
        ("qwen3-0.6b", 2 * 28 * 8 * 128 * 2),  # 114688
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),  # 131072
        ("llama-3.1-70b", 2 * 80 * 8 * 128 * 2),
        ("deepseek-v3", 61 * (512 + 64) * 2),  # 70272
        ("deepseek-v2-lite", 27 * (512 + 64) * 2),
    ],
)
def test_preset_bytes_per_token_public_numbers(name, expected):
    assert PRESETS[name].bytes_per_token() == expected


def test_tp_divides_heads_per_rank():
    geo = PRESETS["llama-3.1-8b"]
    assert [geo.bytes_per_token(tp) for tp in (1, 2, 8, 16)] == [131072, 65536, 16384, 16384]
    assert PRESETS["deepseek-v3"].bytes_per_token(8) == 70272  # MLA rows are replicated
    with pytest.raises(InputError, match="tp-size 3"):
        geo.bytes_per_token(3)


def test_fp8_is_stored_as_uint8():
    geo = ModelGeometry.mha(2, 2, 16, "fp8_e4m3")
    assert (geo.itemsize, geo.stored_dtype) == (1, "uint8")
    dev, host = sglang_host_pool(geo, "page_first", 4, 16)
    assert dev.k_buffer[0].dtype == host.kv_buffer.dtype == torch.uint8 == geo.torch_dtype()
    assert geo.torch_dtype(stored=False) == torch.float8_e4m3fn


@pytest.mark.parametrize("geo", [MHA_CASES[0][0], MHA_CASES[2][0], MLA_CASES[0][0]])
def test_device_pool_shape_matches_sglang(geo):
    tp = 2 if not geo.mla and geo.kv_heads == 4 else 1
    dev = sglang_device_pool(geo, 40, 4, tp)
    ours = DevicePoolLayout(geo, 40, 4, tp)
    if geo.mla:
        assert ours.k_shape == (len(dev.kv_buffer), *dev.kv_buffer[0].shape)
        assert ours.v_shape is None
        assert ours.nbytes == sum(b.nbytes for b in dev.kv_buffer)
    else:
        assert ours.k_shape == (len(dev.k_buffer), *dev.k_buffer[0].shape)
        assert ours.v_shape == (len(dev.v_buffer), *dev.v_buffer[0].shape)
        assert ours.nbytes == sum(b.nbytes for b in dev.k_buffer + dev.v_buffer)
    assert DevicePoolLayout(geo, 40, 4, tp, padded=False).slots == 40


# --- layout / IO rewrites -----------------------------------------------------------------------


def sglang_rewrite(layout, io_backend, storage_backend):
    sa = ServerArgs(
        model_path="unused",
        enable_hierarchical_cache=True,
        hicache_ratio=2.0,
        hicache_mem_layout=layout,
        hicache_io_backend=io_backend,
        hicache_storage_backend=storage_backend,
    )
    handle_hicache(sa)
    view = resolving_view(sa)
    return view.hicache_mem_layout, view.hicache_io_backend


@pytest.mark.parametrize("mooncake", [True, False])
@pytest.mark.parametrize("io_backend", ["kernel", "direct"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rewrites_match_sglang_0_5_23(layout, io_backend, mooncake):
    expected = sglang_rewrite(layout, io_backend, "mooncake" if mooncake else None)
    got_layout, got_io, notes = resolve_layout(layout, io_backend, mooncake, version="0.5.23")
    assert (got_layout, got_io) == expected
    assert bool(notes) == ((got_layout, got_io) != (layout, io_backend))


# 0.5.14's rewrites against its own ServerArgs._handle_hicache: test_sglang_0_5_14.py.


def test_rewrite_dcp_and_rocm_are_version_specific():
    # 0.5.23 keeps layer_first for Mooncake when DCP > 1; 0.5.14 has no such exception.
    assert resolve_layout("layer_first", "kernel", True, version="0.5.23", dcp_size=2)[:2] == ("layer_first", "kernel")
    assert resolve_layout("layer_first", "kernel", True, version="0.5.14", dcp_size=2)[:2] == ("page_first", "kernel")
    # 0.5.23 dropped the ROCm fallback.
    assert resolve_layout("page_first", "kernel", False, version="0.5.23", rocm=True)[:2] == ("page_first", "kernel")


def test_unknown_layout_and_io_backend():
    with pytest.raises(InputError, match="layout 'foo' is unknown"):
        resolve_layout("foo", "kernel", True)
    with pytest.raises(InputError, match="io backend 'kernel_x' is unknown"):
        resolve_layout("page_first", "kernel_x", True)


# --- library edges ------------------------------------------------------------------------------


def test_size_rules_and_warnings():
    geo = PRESETS["tiny"]
    pool = HostPoolLayout(geo, "page_first", 64, 1000, hicache_ratio=2.0)
    assert (pool.size, pool.page_num) == ((2000 // 64 + 1) * 64, 2000 // 64 + 1)
    small = HostPoolLayout(geo, "page_first", 64, 1000, hicache_ratio=0.5, sglang_version="0.5.23")
    assert any("not larger than the device pool" in w for w in small.warnings())
    with pytest.raises(InputError, match="0.5.14 refuses"):
        HostPoolLayout(geo, "page_first", 64, 1000, hicache_ratio=0.5, sglang_version="0.5.14")
    for kwargs, fragment in [
        (dict(page_size=0), "page-size 0"),
        (dict(device_tokens=-1), "device-tokens -1"),
        (dict(hicache_ratio=0), "hicache-ratio 0"),
        (dict(hicache_size_gb=-1), "hicache-size -1"),
        (dict(tp_lcm_size=3, tp_size=2), "tp-lcm-size 3"),
    ]:
        args = dict(geometry=geo, layout="page_first", page_size=64, device_tokens=1000) | kwargs
        with pytest.raises(InputError, match=fragment):
            HostPoolLayout(**args)
    with pytest.raises(InputError, match="outside this host pool"):
        pool.page_buffer_meta([pool.page_num])


def test_mha_layer_first_with_mooncake_is_not_zero_copy():
    pool = HostPoolLayout(PRESETS["tiny"], "layer_first", 4, 16)
    assert not pool.mooncake_zero_copy and any("Mooncake refuses" in w for w in pool.warnings())
    mla = HostPoolLayout(PRESETS["tiny-mla"], "layer_first", 4, 16)
    assert mla.mooncake_zero_copy and any("multi-buffer" in n for n in mla.notes())


def test_report_applies_rewrite_and_flags_page_head_direct():
    report = inspect_layout(PRESETS["tiny"], layout="layer_first", io_backend="direct", page_size=4, device_tokens=16)
    data = json_data(report.result())
    assert (data["layout"], data["effective_layout"], data["io_backend"]) == (
        "layer_first",
        "page_first_direct",
        "direct",
    )
    assert data["rewrites"] and data["rewrites"][0] in data["notes"]
    bad = inspect_layout(PRESETS["tiny"], layout="page_head", io_backend="direct", page_size=4, device_tokens=16)
    assert any("page_head with the direct io backend" in w for w in bad.warnings)


def test_geometry_resolution():
    assert resolve_geometry(preset_name="qwen3-0.6b", dtype="fp8").dtype == "fp8_e4m3"
    assert resolve_geometry(layers=2, kv_heads=2, head_dim=16, dtype="bf16") == PRESETS["tiny"]
    with pytest.raises(InputError, match="cannot be combined"):
        resolve_geometry(preset_name="tiny", layers=3)
    with pytest.raises(InputError, match="needs --kv-lora-rank"):
        resolve_geometry(mla=True, layers=3, qk_rope_head_dim=8)
    with pytest.raises(InputError, match="dtype 'int4' is unknown"):
        ModelGeometry.mha(2, 2, 16, "int4")
    assert parse_pages(" 0, 2,5 ") == [0, 2, 5] and parse_pages(None) is None


# --- CLI ----------------------------------------------------------------------------------------


def invoke(*args):
    return hicache(["inspect", "layout", *args])


def test_cli_json_shape():
    result = invoke("--preset", "tiny", "--page-size", "4", "--device-tokens", "32", "--pages", "0,2,5", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in (
        "layout",
        "effective_layout",
        "io_backend",
        "bytes_per_token",
        "size_tokens",
        "page_num",
        "buffers",
        "pages",
        "notes",
        "bytes_per_page",
        "host_bytes",
        "geometry",
        "warnings",
    ):
        assert key in data
    assert (data["size_tokens"], data["page_num"], data["bytes_per_token"]) == (68, 17, 256)
    assert [p["index"] for p in data["pages"]] == [0, 2, 5]
    (buf,) = data["buffers"]
    assert {"name", "shape", "dtype", "nbytes"} <= set(buf) and buf["shape"] == [2, 68, 2, 2, 16]
    obj = data["pages"][1]["objects"][0]
    assert {"buffer", "offset", "size"} <= set(obj)
    pool = HostPoolLayout(PRESETS["tiny"], "page_first", 4, 32)
    assert [o["offset"] for p in data["pages"] for o in p["objects"]] == pool.flat_meta([0, 2, 5])[0]


def test_cli_explicit_geometry_and_rewrite():
    result = invoke(
        "--mla",
        "--layers",
        "3",
        "--kv-lora-rank",
        "16",
        "--qk-rope-head-dim",
        "8",
        "--layout",
        "layer_first",
        "--io-backend",
        "direct",
        "--page-size",
        "4",
        "--device-tokens",
        "64",
        "--sglang-version",
        "0.5.14",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["effective_layout"], data["io_backend"], data["sglang_version"]) == (
        "page_first_direct",
        "direct",
        "0.5.14",
    )
    assert data["buffers"][0]["shape"] == [33, 3, 4, 1, 24]


def test_cli_human_rendering():
    result = invoke("--preset", "llama-3.1-8b", "--layout", "page_head", "--tp-size", "2", "--tp-lcm-size", "4")
    assert result.exit_code == 0, result.output
    assert "kv_buffer" in result.stdout and "split" in result.stdout and "GB" in result.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--preset", "tiny-mla", "--layout", "page_head"], "not supported for MLA"),
        (
            ["--mla", "--layers", "2", "--kv-lora-rank", "8", "--qk-rope-head-dim", "4", "--layout", "page_head"],
            "not supported for MLA",
        ),
        (["--preset", "tiny", "--page-size", "0"], "page-size 0"),
        (["--preset", "tiny", "--page-size", "-4"], "page-size -4"),
        (["--preset", "gpt-5"], "preset 'gpt-5' is unknown"),
        (["--layers", "2", "--heads", "2"], "needs --head-dim"),
        ([], "no model geometry"),
        (["--preset", "tiny", "--pages", "1,x"], "'x' in --pages"),
        (["--preset", "tiny", "--pages", "99999"], "outside this host pool"),
    ],
)
def test_cli_bad_input_exits_2(args, fragment):
    result = invoke(*args, "--json")
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert fragment in error["message"]
    assert "\n" not in error["message"]
    human = invoke(*args)
    assert human.exit_code == 2
    assert human.stdout == ""
    lines = human.stderr.strip().splitlines()
    assert lines[0].startswith("error:") and fragment in lines[0]
    assert "Traceback" not in human.output


def test_cli_layout_imports_no_torch():
    code = (
        "import sys, runpy; sys.argv = ['hicache', 'inspect', 'layout', '--preset', 'qwen3-0.6b', '--json'];\n"
        "try:\n    runpy.run_module('hicache_ops.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'mooncake', 'sglang') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["bytes_per_token"] == 114688
    assert "HEAVY []" in out.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--preset", "tiny", "--layout", "page_last"], "'page_last' is not one of"),
        (["--preset", "tiny", "--io-backend", "dma"], "'dma' is not one of"),
    ],
)
def test_cli_unknown_choice_is_a_usage_error(args, fragment):
    # Choices are Enum options: Typer rejects them before the command runs.
    result = invoke(*args, "--json")
    assert result.exit_code == 2, result.output
    assert fragment in json.loads(result.stdout)["error"]["message"]
    human = invoke(*args)
    assert human.exit_code == 2 and human.stdout == ""
    assert human.stderr.startswith("Usage:") and "Traceback" not in human.output


def _documented_shapes(section: str) -> dict[str, str]:
    """layout -> shape from a `| `layout` | `(shape)` | versions |` table under `## section`."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "host-pool.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\([^`]*\))` \|", body, flags=re.M)
    return dict(rows)


@pytest.mark.parametrize(
    "section,table", [("MHA buffer shapes", MHA_HOST_BUFFERS), ("MLA buffer shapes", MLA_HOST_BUFFERS)]
)
def test_host_buffer_table_is_what_docs_say(section, table):
    documented = _documented_shapes(section)
    assert {layout: buf.describe() for layout, buf in table.items()} == {layout: documented[layout] for layout in table}


def test_canonical_order_puts_each_token_where_the_layout_does():
    """Token t of layer l, head h sits at [l, t // ps, t % ps, h] of the canonical view built from the
    table, whatever the layout and attention kind (checked on a buffer of distinct values)."""
    L, H, D, ps, pages = 2, 3, 1, 4, 5
    sizes = {KV: 2, LAYERS: L, SIZE: pages * ps, PAGE_NUM: pages, PAGE_SIZE: ps, HEADS_PER_RANK: H, HEAD_DIM: D}
    for layout, buf in [*MHA_HOST_BUFFERS.items(), *MLA_HOST_BUFFERS.items()]:
        shape = buf.shape(sizes)
        host = torch.arange(math.prod(shape)).reshape(shape)
        comp = host[1] if buf.dims[0] == KV else host  # MHA: V
        canon = comp
        if SIZE in buf.component_dims:
            canon = canon.unflatten(buf.component_dims.index(SIZE), (pages, ps))
        canon = canon.permute(buf.canonical_order)
        for t in (0, 5, pages * ps - 1):
            for layer in range(L):
                for head in range(H):
                    where = {
                        LAYERS: layer, SIZE: t, PAGE_NUM: t // ps, PAGE_SIZE: t % ps, HEADS_PER_RANK: head, HEAD_DIM: 0
                    }  # fmt: skip
                    index = tuple(where[d] for d in buf.component_dims)
                    assert canon[layer, t // ps, t % ps, head, 0] == comp[index], (layout, t, layer, head)
