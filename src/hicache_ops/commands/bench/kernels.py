"""Transfer and checksum speed, as ratios against plain copies of the same bytes measured in one run.

CPU (the default without CUDA): one thread (torch.set_num_threads(1) for the run). For each
attention kind (MHA, MLA), layout and direction the library's CPU path moves `tokens` tokens in
whole pages scattered over both pools; the baseline is one contiguous ``copy_`` of the same number
of bytes. Every repeat runs every case once, each right after a run of the baseline (interleaved),
and the best time of each counts, so a noisy neighbour on a shared machine hurts both sides alike;
the baseline, run before every case, gets at least every quiet moment a case gets, so a ratio errs
low rather than high.

CUDA: device pool on the GPU, host pool pinned. The Triton path against (a) one cudaMemcpyAsync
of the same bytes in the same direction, (b) a loop of one cudaMemcpyAsync per page (each page's
bytes between scattered slots of page-major buffers: the cheapest per-page loop), (c) a loop of
one cudaMemcpyAsync per contiguous (page, layer, component) chunk -- what a page-by-page copy
between a layer-first device pool and a page_first_direct host pool must issue; and, when
``sgl_kernel`` imports, SGLang's own transfer ops for the layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
from pydantic import Field

from hicache_ops.kernels.checksum import device_page_checksums, host_page_checksums
from hicache_ops.kernels.indexing import pages_to_tokens
from hicache_ops.kernels.transfer import backup, load
from hicache_ops.results import Result
from hicache_ops.sglang.host_pool import (
    HEAD_DIM,
    HEADS_PER_RANK,
    KV,
    LAYERS,
    MHA_HOST_BUFFERS,
    MLA_HOST_BUFFERS,
    PAGE_NUM,
    PAGE_SIZE,
    SIZE,
)

DIRECTIONS = ("backup", "load")
# Floors asked of the CPU path (single thread, ratio to a contiguous copy of the same bytes), applied
# to MHA; MLA is reported without one (see README: its per-layer pieces are much shorter).
CPU_TARGETS = {
    ("page_first_direct", "backup"): 0.9,
    ("page_first_direct", "load"): 0.9,
    ("page_first", "backup"): 0.6,
    ("page_first", "load"): 0.6,
    ("page_head", "backup"): 0.6,
    ("page_head", "load"): 0.6,
}
# Floors asked of the Triton path on a GPU: vs one big memcpy, and vs the per-chunk memcpy loop.
GPU_TARGET_MEMCPY = 0.85
GPU_TARGET_LOOP = 3.0

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


class CaseResult(Result):
    attention: str = Field(description="`mha` or `mla`")
    layout: str = Field(description="the host layout")
    direction: str = Field(description="`backup` (device to host) or `load` (host to device)")
    seconds: float = Field(description="the best run's seconds")
    gb_per_s: float = Field(description="bytes moved / seconds, in GB/s")
    ratio: float = Field(description="baseline time / case time: CPU a contiguous copy, GPU one big memcpy")
    target: float | None = Field(None, description="the floor asked of this case, `null` when none")
    meets_target: bool | None = Field(None, description="ratio >= target, `null` without a target")
    ratio_vs_page_loop: float | None = Field(None, description="GPU only: vs one cudaMemcpyAsync per page")
    meets_page_loop_target: bool | None = Field(None, description="GPU only: that ratio reaches its floor")
    ratio_vs_chunk_loop: float | None = Field(
        None, description="GPU only: vs one cudaMemcpyAsync per (page, layer, component)"
    )
    sglang_seconds: float | None = Field(None, description="GPU only, when sgl_kernel imports: SGLang's op")
    ratio_vs_sglang: float | None = Field(None, description="SGLang's time / ours")
    sglang_error: str | None = Field(None, description="why SGLang's op was not measured")


class ChecksumResult(Result):
    attention: str = Field(description="`mha` or `mla`")
    where: str = Field(description='`"device"` or a host layout')
    seconds: float = Field(description="the best run's seconds")
    gb_per_s: float = Field(description="bytes checksummed / seconds, in GB/s")
    ratio: float = Field(description="contiguous copy time / checksum time for the same bytes")


class KernelBenchResult(Result):
    """`hicache bench kernels --json`."""

    platform: str = Field(description="`cpu` or `cuda`")
    device_name: str = Field(description="the GPU's name, `cpu` on the CPU")
    threads: int | None = Field(description="CPU threads used (1), `null` on a GPU")
    geometry: dict = Field(description="layers, heads, head_dim, kv_cache_dim, dtype of one rank's slice")
    tokens: int = Field(description="tokens per transfer (whole pages)")
    page_size: int = Field(description="tokens per page")
    repeats: int = Field(description="timed runs per case; the best counts")
    bytes_moved: dict[str, int] = Field(description="attention kind -> bytes per transfer")
    baselines: dict[str, dict] = Field(
        description="attention kind -> the baselines' seconds and GB/s: CPU `contiguous_*`; GPU `memcpy_*`, "
        "`page_loop_*`, `chunk_loop_*`"
    )
    cases: list[CaseResult] = Field(default_factory=list, description="one entry per attention, layout, direction")
    checksums: list[ChecksumResult] = Field(default_factory=list, description="checksum speed per attention and place")
    verified: bool = Field(False, description="every copy was verified by checksum")
    notes: list[str] = Field(default_factory=list, description="comparisons skipped, and why")


def _best(times: dict, name: str, seconds: float) -> None:
    times[name] = min(times.get(name, float("inf")), seconds)


def _scatter_pages(n_pages: int, pool_pages: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(pool_pages, generator=gen)[:n_pages]


def _make_pools(
    attention, layers, heads, head_dim, kv_dim, dtype, dev_tokens, host_pages, page_size, layouts, target, pin
):
    gen = torch.Generator().manual_seed(1)

    def fill(shape):
        return torch.randint(0, 100, shape, generator=gen, dtype=torch.int16).to(dtype).to(target)

    if attention == "mha":
        device = tuple(fill((layers, dev_tokens, heads, head_dim)) for _ in range(2))
    else:
        device = fill((layers, dev_tokens, 1, kv_dim))
    h, d = (heads, head_dim) if attention == "mha" else (1, kv_dim)
    sizes = {KV: 2, LAYERS: layers, SIZE: host_pages * page_size, PAGE_NUM: host_pages, PAGE_SIZE: page_size,
             HEADS_PER_RANK: h, HEAD_DIM: d}  # fmt: skip
    buffers = MHA_HOST_BUFFERS if attention == "mha" else MLA_HOST_BUFFERS
    hosts = {lay: torch.zeros(buffers[lay].shape(sizes), dtype=dtype, pin_memory=pin) for lay in layouts}
    return device, hosts


def bench_kernels(
    *,
    tokens: int = 1024,
    layers: int = 32,
    heads: int = 8,
    head_dim: int = 128,
    kv_cache_dim: int = 576,
    page_size: int = 16,
    dtype: str = "bfloat16",
    repeats: int = 5,
    attention: str = "both",
    device: str = "auto",
    layouts: tuple[str, ...] | None = None,
    seed: int = 0,
) -> KernelBenchResult:
    """Run the benchmark; `device` "auto" uses CUDA when available, else the CPU."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}.")
    if attention not in ("mha", "mla", "both"):
        raise ValueError(f"attention must be mha, mla or both, got {attention!r}.")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine; run with device 'cpu' (or 'auto').")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}.")
    if tokens < page_size or page_size <= 0 or repeats <= 0:
        raise ValueError("tokens must hold at least one page; page_size and repeats must be > 0.")
    kinds = ("mha", "mla") if attention == "both" else (attention,)
    n_pages = tokens // page_size
    tokens = n_pages * page_size
    tdtype = DTYPES[dtype]
    itemsize = torch.empty((), dtype=tdtype).element_size()
    device_page_count, host_page_count = 2 * n_pages, n_pages + n_pages // 4 + 1
    geometry = {
        "layers": layers,
        "heads": heads,
        "head_dim": head_dim,
        "kv_cache_dim": kv_cache_dim,
        "dtype": dtype,
        "device_pages": device_page_count,
        "host_pages": host_page_count,
    }
    gen = torch.Generator().manual_seed(seed)
    dev_pages = _scatter_pages(n_pages, device_page_count, gen)
    host_pages = _scatter_pages(n_pages, host_page_count, gen)
    if device == "cpu":
        return _bench_cpu(kinds, layouts, geometry, tokens, page_size, tdtype, itemsize, repeats, dev_pages, host_pages)
    return _bench_cuda(kinds, layouts, geometry, tokens, page_size, tdtype, itemsize, repeats, dev_pages, host_pages)


def _layouts_for(kind: str, layouts) -> list[str]:
    allowed = list(MHA_HOST_BUFFERS if kind == "mha" else MLA_HOST_BUFFERS)
    return [lay for lay in allowed if layouts is None or lay in layouts]


def _transfer_fns(kind, layout, device, host, dev_pages, host_pages, page_size, backend):
    kw = dict(layout=layout, page_size=page_size, unit="page", backend=backend, check_bounds=False)

    def do_backup():
        backup(device, host, device_indices=dev_pages, host_indices=host_pages, **kw)

    def do_load():
        load(host, device, host_indices=host_pages, device_indices=dev_pages, **kw)

    return {"backup": do_backup, "load": do_load}


def _same_pages(layout, device, host, dev_pages, host_pages, page_size) -> bool:
    a = device_page_checksums(device, dev_pages, page_size=page_size, unit="page", backend="torch")
    b = host_page_checksums(host, host_pages, layout=layout, page_size=page_size, unit="page", backend="torch")
    return bool(torch.equal(a.cpu(), b.cpu()))


def _verify(kind, layout, device, host, dev_pages, host_pages, page_size, backend) -> bool:
    """Backup, compare by checksum; wipe the device pages, load, compare again."""
    fns = _transfer_fns(kind, layout, device, host, dev_pages, host_pages, page_size, backend)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fns["backup"]()
    sync()
    ok = _same_pages(layout, device, host, dev_pages.cpu(), host_pages.cpu(), page_size)
    comps = list(device) if isinstance(device, tuple) else [device]
    tokens = pages_to_tokens(dev_pages.cpu(), page_size).to(comps[0].device)
    for c in comps:
        c[:, tokens] = 0
    fns["load"]()
    sync()
    return ok and _same_pages(layout, device, host, dev_pages.cpu(), host_pages.cpu(), page_size)


def _bench_cpu(kinds, layouts, geometry, tokens, page_size, tdtype, itemsize, repeats, dev_pages, host_pages):
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = KernelBenchResult(
            platform="cpu",
            device_name="cpu",
            threads=1,
            geometry=geometry,
            tokens=tokens,
            page_size=page_size,
            repeats=repeats,
            bytes_moved={},
            baselines={},
        )
        L, H, D, C = geometry["layers"], geometry["heads"], geometry["head_dim"], geometry["kv_cache_dim"]
        runs: dict[str, Callable[[], object]] = {}
        meta = {}
        pools = {}
        for kind in kinds:
            nbytes = tokens * L * (2 * H * D if kind == "mha" else C) * itemsize
            result.bytes_moved[kind] = nbytes
            src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
            dst = torch.empty_like(src)
            runs[f"{kind}/contiguous"] = partial(dst.copy_, src)
            lays = _layouts_for(kind, layouts)
            dev, hosts = _make_pools(
                kind, L, H, D, C, tdtype, geometry["device_pages"] * page_size, geometry["host_pages"], page_size,
                lays, "cpu", False,
            )  # fmt: skip
            pools[kind] = (dev, hosts)
            for lay in lays:
                fns = _transfer_fns(kind, lay, dev, hosts[lay], dev_pages, host_pages, page_size, "cpu")
                for direction in DIRECTIONS:
                    runs[f"{kind}/{lay}/{direction}"] = fns[direction]
                    meta[f"{kind}/{lay}/{direction}"] = (kind, lay, direction, nbytes)
            # checksum throughput: the same pages on the device pool and in every host layout
            runs[f"{kind}/checksum/device"] = partial(
                device_page_checksums, dev, dev_pages, page_size=page_size, unit="page"
            )
            for lay in lays:
                runs[f"{kind}/checksum/{lay}"] = partial(
                    host_page_checksums, hosts[lay], host_pages, layout=lay, page_size=page_size, unit="page"
                )
        times: dict[str, float] = {}

        def timed(name: str) -> None:
            start = time.perf_counter()
            runs[name]()
            _best(times, name, time.perf_counter() - start)

        for _ in range(repeats):
            for name in runs:
                if name.endswith("/contiguous"):
                    continue
                # the baseline runs right before every case: it gets every quiet moment a case gets
                timed(name.split("/")[0] + "/contiguous")
                timed(name)
        verified = True
        for name, (kind, lay, direction, nbytes) in meta.items():
            base = times[f"{kind}/contiguous"]
            t = times[name]
            target = CPU_TARGETS.get((lay, direction)) if kind == "mha" else None
            ratio = base / t
            result.cases.append(
                CaseResult(
                    attention=kind,
                    layout=lay,
                    direction=direction,
                    seconds=t,
                    gb_per_s=nbytes / t / 1e9,
                    ratio=ratio,
                    target=target,
                    meets_target=None if target is None else ratio >= target,
                )
            )
        for kind in kinds:
            base = times[f"{kind}/contiguous"]
            nbytes = result.bytes_moved[kind]
            result.baselines[kind] = {"contiguous_s": base, "contiguous_gb_per_s": nbytes / base / 1e9}
            dev, hosts = pools[kind]
            for where in ("device", *hosts):
                t = times[f"{kind}/checksum/{where}"]
                result.checksums.append(
                    ChecksumResult(attention=kind, where=where, seconds=t, gb_per_s=nbytes / t / 1e9, ratio=base / t)
                )
            for lay, host in hosts.items():
                verified &= _verify(kind, lay, dev, host, dev_pages, host_pages, page_size, "cpu")
        result.verified = verified
        if not torch.cuda.is_available():
            result.notes.append("GPU comparisons skipped: CUDA is not available on this machine.")
        return result
    finally:
        torch.set_num_threads(prev_threads)


# ---------------------------------------------------------------------------------------------
# CUDA


def _cuda_time(fn: Callable[[], object]) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _device_checksums_call(
    device: torch.Tensor | tuple[torch.Tensor, ...], pages: torch.Tensor, cuda: torch.device, page_size: int
) -> Callable[[], torch.Tensor]:
    """The device pool's page checksums as one timed call (moving the page list to the GPU included)."""
    return lambda: device_page_checksums(device, pages.to(cuda), page_size=page_size, unit="page")


def _sglang_ops():
    try:
        from sgl_kernel import kvcacheio  # noqa: F401

        return kvcacheio, None
    except Exception as exc:  # not installed, or its native library does not load here
        return None, f"sgl_kernel.kvcacheio is not importable: {type(exc).__name__}: {exc}"


def _sglang_fns(ops, kind, layout, device, host, d_tok, h_tok, page_size, itemsize):
    """SGLang's own transfer ops for this layout, called as its host pool calls them (best effort)."""
    if kind != "mha":
        return None
    k, v = device
    L, _, H, D = k.shape
    cuda = k.device
    row = H * D * itemsize

    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64, device=cuda)

    dk, dv = ptrs(list(k)), ptrs(list(v))
    if layout == "layer_first":
        hk, hv = ptrs(list(host[0])), ptrs(list(host[1]))

        def b():
            ops.transfer_kv_all_layer(dk, hk, dv, hv, d_tok, h_tok, row, L)

        def ld():
            for i in range(L):
                ops.transfer_kv_per_layer(host[0, i], k[i], host[1, i], v[i], h_tok, d_tok, row)

    elif layout in ("page_first", "page_head"):
        if layout == "page_first":

            def b():
                ops.transfer_kv_all_layer_lf_pf(dk, host[0], dv, host[1], d_tok, h_tok, row, row * L, L)

            def ld():
                for i in range(L):
                    ops.transfer_kv_per_layer_pf_lf(host[0], k[i], host[1], v[i], h_tok, d_tok, i, row, row * L)
        else:

            def b():
                ops.transfer_kv_all_layer_lf_ph(dk, host[0], dv, host[1], d_tok, h_tok, row, row * L, L, page_size, H)

            def ld():
                for i in range(L):
                    ops.transfer_kv_per_layer_ph_lf(
                        host[0], k[i], host[1], v[i], h_tok, d_tok, i, row, row * L, page_size, H
                    )
    else:  # page_first_direct, SGLang's direct IO backend
        layers = list(k) + list(v)
        d_cpu, h_cpu = d_tok.cpu(), h_tok.cpu()

        def b():
            ops.transfer_kv_all_layer_direct_lf_pf(layers, [host[0], host[1]], d_cpu, h_cpu, page_size)

        def ld():
            for i in range(L):
                ops.transfer_kv_per_layer_direct_pf_lf([host[0], host[1]], [k[i], v[i]], h_cpu, d_cpu, i, page_size)

    return {"backup": b, "load": ld}


def _page_loop(dev_buf, host_buf, page_bytes, dev_pages, host_pages, to_host: bool):
    """One cudaMemcpyAsync per page: the page's bytes between the same scattered page slots of a
    page-major device buffer and a page-major pinned host buffer (the cheapest per-page loop)."""
    pairs = [(d * page_bytes, h * page_bytes) for d, h in zip(dev_pages.tolist(), host_pages.tolist(), strict=True)]

    def run():
        for d, h in pairs:
            if to_host:
                host_buf[h : h + page_bytes].copy_(dev_buf[d : d + page_bytes], non_blocking=True)
            else:
                dev_buf[d : d + page_bytes].copy_(host_buf[h : h + page_bytes], non_blocking=True)

    return run


def _chunk_loop(kind, device, host_pfd, dev_pages, host_pages, page_size, to_host: bool):
    """One cudaMemcpyAsync per contiguous (page, layer, component) chunk: layer-first device rows of a
    page against a page_first_direct host page."""
    comps = list(device) if kind == "mha" else [device]
    hosts = [host_pfd[0], host_pfd[1]] if kind == "mha" else [host_pfd]
    pairs = list(zip(dev_pages.tolist(), host_pages.tolist(), strict=True))
    L = comps[0].shape[0]

    def run():
        for dp, hp in pairs:
            for c, dev in enumerate(comps):
                for layer in range(L):
                    dsl = dev[layer, dp * page_size : (dp + 1) * page_size]
                    hsl = hosts[c][hp, layer]
                    if to_host:
                        hsl.copy_(dsl, non_blocking=True)
                    else:
                        dsl.copy_(hsl, non_blocking=True)

    return run


def _bench_cuda(kinds, layouts, geometry, tokens, page_size, tdtype, itemsize, repeats, dev_pages, host_pages):
    cuda = torch.device("cuda")
    result = KernelBenchResult(
        platform="cuda",
        device_name=torch.cuda.get_device_name(cuda),
        threads=None,
        geometry=geometry,
        tokens=tokens,
        page_size=page_size,
        repeats=repeats,
        bytes_moved={},
        baselines={},
    )
    ops, ops_error = _sglang_ops()
    if ops_error:
        result.notes.append(f"SGLang comparison skipped: {ops_error}")
    L, H, D, C = geometry["layers"], geometry["heads"], geometry["head_dim"], geometry["kv_cache_dim"]
    d_tok = pages_to_tokens(dev_pages, page_size).to(cuda)
    h_tok = pages_to_tokens(host_pages, page_size).to(cuda)
    runs: dict[str, Callable[[], object]] = {}
    meta = {}
    pools = {}
    for kind in kinds:
        nbytes = tokens * L * (2 * H * D if kind == "mha" else C) * itemsize
        result.bytes_moved[kind] = nbytes
        dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=cuda)
        host_buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        runs[f"{kind}/memcpy/backup"] = partial(host_buf.copy_, dev_buf, non_blocking=True)
        runs[f"{kind}/memcpy/load"] = partial(dev_buf.copy_, host_buf, non_blocking=True)
        page_bytes = nbytes // (tokens // page_size)
        dev_pool = torch.empty(geometry["device_pages"] * page_bytes, dtype=torch.uint8, device=cuda)
        host_pool = torch.empty(geometry["host_pages"] * page_bytes, dtype=torch.uint8, pin_memory=True)
        runs[f"{kind}/pages/backup"] = _page_loop(dev_pool, host_pool, page_bytes, dev_pages, host_pages, True)
        runs[f"{kind}/pages/load"] = _page_loop(dev_pool, host_pool, page_bytes, dev_pages, host_pages, False)
        lays = _layouts_for(kind, layouts)
        need = sorted(set(lays) | {"page_first_direct"})
        dev, hosts = _make_pools(
            kind, L, H, D, C, tdtype, geometry["device_pages"] * page_size, geometry["host_pages"], page_size,
            need, cuda, True,
        )  # fmt: skip
        pools[kind] = (dev, hosts)
        runs[f"{kind}/loop/backup"] = _chunk_loop(
            kind, dev, hosts["page_first_direct"], dev_pages, host_pages, page_size, True
        )
        runs[f"{kind}/loop/load"] = _chunk_loop(
            kind, dev, hosts["page_first_direct"], dev_pages, host_pages, page_size, False
        )
        for lay in lays:
            fns = _transfer_fns(
                kind, lay, dev, hosts[lay], dev_pages.to(cuda), host_pages.to(cuda), page_size, "triton"
            )
            sg = None
            sg_err = ops_error
            if ops is not None:
                try:
                    sg = _sglang_fns(ops, kind, lay, dev, hosts[lay], d_tok, h_tok, page_size, itemsize)
                    if sg is None:
                        sg_err = "no SGLang op compared for MLA here"
                except Exception as exc:
                    sg_err = f"{type(exc).__name__}: {exc}"
            for direction in DIRECTIONS:
                name = f"{kind}/{lay}/{direction}"
                runs[name] = fns[direction]
                meta[name] = [kind, lay, direction, nbytes, sg_err]
                if sg is not None:
                    runs[f"{name}/sglang"] = sg[direction]
    # warm up (Triton compiles; SGLang ops that fail are dropped with their error)
    for name in list(runs):
        try:
            runs[name]()
        except Exception as exc:
            if not name.endswith("/sglang"):
                raise
            meta[name.rsplit("/", 1)[0]][4] = f"{type(exc).__name__}: {exc}"
            del runs[name]
    torch.cuda.synchronize()
    times: dict[str, float] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            _best(times, name, _cuda_time(fn))
    for name, (kind, lay, direction, nbytes, sg_err) in meta.items():
        t = times[name]
        memcpy = times[f"{kind}/memcpy/{direction}"]
        loop = times[f"{kind}/loop/{direction}"]
        ratio = memcpy / t
        case = CaseResult(
            attention=kind,
            layout=lay,
            direction=direction,
            seconds=t,
            gb_per_s=nbytes / t / 1e9,
            ratio=ratio,
            target=GPU_TARGET_MEMCPY,
            meets_target=ratio >= GPU_TARGET_MEMCPY,
        )
        case.ratio_vs_page_loop = times[f"{kind}/pages/{direction}"] / t
        case.meets_page_loop_target = case.ratio_vs_page_loop >= GPU_TARGET_LOOP if page_size <= 16 else None
        case.ratio_vs_chunk_loop = loop / t
        if f"{name}/sglang" in times:
            case.sglang_seconds = times[f"{name}/sglang"]
            case.ratio_vs_sglang = case.sglang_seconds / t
        else:
            case.sglang_error = sg_err
        result.cases.append(case)
    verified = True
    for kind in kinds:
        nbytes = result.bytes_moved[kind]
        result.baselines[kind] = {
            "memcpy_backup_s": times[f"{kind}/memcpy/backup"],
            "memcpy_load_s": times[f"{kind}/memcpy/load"],
            "memcpy_backup_gb_per_s": nbytes / times[f"{kind}/memcpy/backup"] / 1e9,
            "memcpy_load_gb_per_s": nbytes / times[f"{kind}/memcpy/load"] / 1e9,
            "page_loop_backup_s": times[f"{kind}/pages/backup"],
            "page_loop_load_s": times[f"{kind}/pages/load"],
            "chunk_loop_backup_s": times[f"{kind}/loop/backup"],
            "chunk_loop_load_s": times[f"{kind}/loop/load"],
        }
        dev, hosts = pools[kind]
        device_sums = _device_checksums_call(dev, dev_pages, cuda, page_size)
        t = min(_cuda_time(device_sums), _cuda_time(device_sums))
        base = min(times[f"{kind}/memcpy/backup"], times[f"{kind}/memcpy/load"])
        result.checksums.append(
            ChecksumResult(attention=kind, where="device", seconds=t, gb_per_s=nbytes / t / 1e9, ratio=base / t)
        )
        for lay in _layouts_for(kind, layouts):
            verified &= _verify(
                kind, lay, dev, hosts[lay], dev_pages.to(cuda), host_pages.to(cuda), page_size, "triton"
            )
    result.verified = verified
    return result
