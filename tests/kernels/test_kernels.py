"""KV transfer and checksum kernels (hicache_ops.kernels) against per-token references.

Every layout x direction x MHA/MLA, on the CPU paths (run copies through torch and numpy, the
gather/scatter fallback, the torch backend) and on the Triton kernels, which run in a subprocess
with TRITON_INTERPRET=1 set before Triton is imported. Checksums are checked against a
pure-Python reading of their definition, across layouts and L3 object bytes, and host-pool
placement against SGLang's own host pool classes (their CPU-side page pointer arithmetic).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runner import hicache
from hicache_ops.errors import InputError
from hicache_ops.kernels import (
    PageGeometry,
    backup,
    canonical_page_checksums,
    checksum_hex,
    device_page_checksums,
    host_page_checksums,
    load,
    storage_page_checksum,
)
from hicache_ops.kernels import transfer as transfer_mod
from hicache_ops.kernels.checksum import C1, C2, GOLDEN, KEY_SEED, MASK64

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
CASES = [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS]


# ---------------------------------------------------------------------------------------------
# Pools and the obviously-correct references, written from docs/host-pool.md shape by shape.


def host_shape(kind, layout, L, size, H, D, ps):
    pages = size // ps
    if kind == "mha":
        return {
            "layer_first": (2, L, size, H, D),
            "page_first": (2, size, L, H, D),
            "page_first_direct": (2, pages, L, ps, H, D),
            "page_head": (2, pages, H, ps, L, D),
        }[layout]
    return {
        "layer_first": (L, size, 1, D),
        "page_first": (size, L, 1, D),
        "page_first_direct": (pages, L, ps, 1, D),
    }[layout]


def random_fill(shape, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 256, shape, generator=gen, dtype=torch.int64).to(dtype)


def make_pools(kind, layout, *, L=3, H=2, D=8, ps=4, dev_tokens=48, host_pages=11, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if kind == "mha":
        device = (random_fill((L, dev_tokens, H, D), dtype, gen), random_fill((L, dev_tokens, H, D), dtype, gen))
    else:
        device = random_fill((L, dev_tokens, 1, D), dtype, gen)
    host = random_fill(host_shape(kind, layout, L, host_pages * ps, H, D, ps), dtype, gen)
    return device, host


def host_token(host, kind, layout, t, ps):
    """Token t of the host pool as (components, L, H, D), by plain indexing of the raw buffer."""
    p, s = divmod(t, ps)
    if kind == "mha":
        if layout == "layer_first":
            return host[:, :, t]
        if layout == "page_first":
            return host[:, t]
        if layout == "page_first_direct":
            return host[:, p, :, s]
        return host[:, p, :, s].permute(0, 2, 1, 3)  # page_head: (2, H, L, D) -> (2, L, H, D)
    if layout == "layer_first":
        return host[:, t].unsqueeze(0)
    if layout == "page_first":
        return host[t].unsqueeze(0)
    return host[p, :, s].unsqueeze(0)


def device_token(device, kind, d):
    if kind == "mha":
        return torch.stack([device[0][:, d], device[1][:, d]])
    return device[:, d].unsqueeze(0)


def set_host_token(host, kind, layout, t, ps, value):
    host_token(host, kind, layout, t, ps).copy_(value)


def set_device_token(device, kind, d, value):
    if kind == "mha":
        device[0][:, d] = value[0]
        device[1][:, d] = value[1]
    else:
        device[:, d] = value[0]


def clone_device(device):
    return tuple(x.clone() for x in device) if isinstance(device, tuple) else device.clone()


def same_device(a, b):
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    return torch.equal(a, b)


def expected_backup(device, host, kind, layout, d_idx, h_idx, ps):
    want = host.clone()
    for d, t in zip(d_idx, h_idx, strict=True):
        set_host_token(want, kind, layout, t, ps, device_token(device, kind, d))
    return want


def expected_load(device, host, kind, layout, d_idx, h_idx, ps):
    want = clone_device(device)
    for d, t in zip(d_idx, h_idx, strict=True):
        set_device_token(want, kind, d, host_token(host, kind, layout, t, ps))
    return want


def index_sets(ps, dev_tokens, host_tokens, seed=0):
    """Named (device, host) token index pairs: scattered single tokens, whole pages, runs that cross
    host pages unaligned, and one long run."""
    g = torch.Generator().manual_seed(seed)
    n = min(dev_tokens, host_tokens) // 2
    scattered = (
        torch.randperm(dev_tokens, generator=g)[:n].tolist(),
        torch.randperm(host_tokens, generator=g)[:n].tolist(),
    )
    dp = torch.randperm(dev_tokens // ps, generator=g)[:3].tolist()
    hp = torch.randperm(host_tokens // ps, generator=g)[:3].tolist()
    pages = ([q * ps + s for q in dp for s in range(ps)], [p * ps + s for p in hp for s in range(ps)])
    unaligned = (list(range(5, 5 + 2 * ps + 3)), list(range(ps + 2, ps + 2 + 2 * ps + 3)))
    long_run = (list(range(ps, ps + 4 * ps)), list(range(2 * ps, 6 * ps)))
    return {"scattered": scattered, "pages": pages, "unaligned": unaligned, "long_run": long_run}


def run_path(path, device, host, kind, layout, d_idx, h_idx, ps, *, to_host):
    """Run one transfer through one named path."""
    if path in ("cpu", "torch"):
        kw = dict(layout=layout, page_size=ps, backend=path)
        if to_host:
            backup(device, host, device_indices=d_idx, host_indices=h_idx, **kw)
        else:
            load(host, device, host_indices=h_idx, device_indices=d_idx, **kw)
        return
    plan = transfer_mod.plan_transfer(device, host, d_idx, h_idx, layout=layout, page_size=ps)
    if path == "gather":
        transfer_mod.copy_gather(plan, to_host=to_host)
    else:  # runs through one copier, forcing the run path even for many short runs
        runs = transfer_mod.find_runs(plan.device_tokens, plan.host_tokens)
        _force_runs(plan, to_host, path.split("-")[1], runs)


def _force_runs(plan, to_host, copier, runs):
    # copy_runs falls back to gather for many short runs; call the run loop on chunks of <= 16 runs
    for i in range(0, len(runs), 16):
        transfer_mod.copy_runs(plan, to_host=to_host, copier=copier, runs=runs[i : i + 16])


CPU_PATHS = ("cpu", "torch", "gather", "runs-torch", "runs-numpy", "runs-staged")


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("kind,layout", CASES)
def test_backup_and_load_match_reference(kind, layout, path):
    ps = 4
    for name, (d_idx, h_idx) in index_sets(ps, 48, 44).items():
        device, host = make_pools(kind, layout, ps=ps)
        want = expected_backup(device, host, kind, layout, d_idx, h_idx, ps)
        run_path(path, device, host, kind, layout, d_idx, h_idx, ps, to_host=True)
        assert torch.equal(host, want), f"backup {name}"

        device2, host2 = make_pools(kind, layout, ps=ps, seed=1)
        want_dev = expected_load(device2, host2, kind, layout, d_idx, h_idx, ps)
        run_path(path, device2, host2, kind, layout, d_idx, h_idx, ps, to_host=False)
        assert same_device(device2, want_dev), f"load {name}"


@pytest.mark.parametrize("layout", ["page_first_direct", "page_head", "page_first"])
def test_staged_copies_split_long_runs(monkeypatch, layout):
    monkeypatch.setattr(transfer_mod, "STAGE_BYTES", 1)  # one page per staging round
    ps = 4
    d_idx, h_idx = index_sets(ps, 48, 44)["long_run"]
    device, host = make_pools("mha", layout, ps=ps)
    want = expected_backup(device, host, "mha", layout, d_idx, h_idx, ps)
    run_path("runs-staged", device, host, "mha", layout, d_idx, h_idx, ps, to_host=True)
    assert torch.equal(host, want)
    device2, host2 = make_pools("mha", layout, ps=ps, seed=2)
    want_dev = expected_load(device2, host2, "mha", layout, d_idx, h_idx, ps)
    run_path("runs-staged", device2, host2, "mha", layout, d_idx, h_idx, ps, to_host=False)
    assert same_device(device2, want_dev)


@pytest.mark.parametrize("dtype,D", [(torch.uint8, 5), (torch.float16, 3), (torch.float32, 6)])
@pytest.mark.parametrize("kind,layout", CASES)
def test_round_trip_odd_rows_and_page_units(kind, layout, dtype, D):
    ps = 4
    device, host = make_pools(kind, layout, D=D, dtype=dtype, ps=ps)
    orig = clone_device(device)
    dev_pages, host_pages = [7, 2, 9, 3], [0, 10, 4, 5]
    backup(device, host, device_indices=dev_pages, host_indices=host_pages, layout=layout, page_size=ps, unit="page")
    empty = tuple(torch.zeros_like(x) for x in device) if kind == "mha" else torch.zeros_like(device)
    load(host, empty, host_indices=host_pages, device_indices=dev_pages, layout=layout, page_size=ps, unit="page")
    toks = [q * ps + s for q in dev_pages for s in range(ps)]
    for d in toks:
        assert torch.equal(device_token(empty, kind, d), device_token(orig, kind, d))
    a = device_page_checksums(orig, dev_pages, page_size=ps, unit="page")
    b = host_page_checksums(host, host_pages, layout=layout, page_size=ps, unit="page")
    assert torch.equal(a, b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    ps=st.sampled_from([1, 2, 4, 8]),
    L=st.integers(1, 3),
    H=st.integers(1, 3),
    D=st.sampled_from([1, 2, 4, 8]),
    data=st.data(),
)
def test_random_transfers_property(case, ps, L, H, D, data):
    kind, layout = case
    H = 1 if kind == "mla" else H
    host_pages = 6
    device, host = make_pools(kind, layout, L=L, H=H, D=D, ps=ps, dev_tokens=8 * ps, host_pages=host_pages)
    n = data.draw(st.integers(0, host_pages * ps))
    d_idx = data.draw(st.permutations(range(8 * ps)))[:n]
    h_idx = data.draw(st.permutations(range(host_pages * ps)))[:n]
    want = expected_backup(device, host, kind, layout, d_idx, h_idx, ps)
    backup(device, host, device_indices=d_idx, host_indices=h_idx, layout=layout, page_size=ps)
    assert torch.equal(host, want)
    want_dev = expected_load(device, host, kind, layout, d_idx, h_idx, ps)
    load(host, device, host_indices=h_idx, device_indices=d_idx, layout=layout, page_size=ps)
    assert same_device(device, want_dev)


def test_bad_inputs_are_refused():
    device, host = make_pools("mha", "page_first")
    with pytest.raises(InputError):
        backup(device, host, device_indices=[0], host_indices=[0], layout="nope", page_size=4)
    mla_dev, mla_host = make_pools("mla", "page_first_direct")
    with pytest.raises(InputError):
        backup(mla_dev, mla_host, device_indices=[0], host_indices=[0], layout="page_head", page_size=4)
    with pytest.raises(ValueError):
        backup(device, host, device_indices=[0, 1], host_indices=[0], layout="page_first", page_size=4)
    with pytest.raises(IndexError):
        backup(device, host, device_indices=[0], host_indices=[10_000], layout="page_first", page_size=4)
    with pytest.raises(ValueError):  # the host buffer is not a page_head buffer
        backup(device, host, device_indices=[0], host_indices=[0], layout="page_head", page_size=4)
    with pytest.raises(ValueError):  # backend triton without CUDA or the interpreter
        if not os.environ.get("TRITON_INTERPRET"):
            backup(
                device, host, device_indices=[0], host_indices=[0], layout="page_first", page_size=4, backend="triton"
            )
        else:
            raise ValueError
    with pytest.raises(IndexError):
        device_page_checksums(device, [12], page_size=4, unit="page")
    with pytest.raises(IndexError):
        host_page_checksums(host, [-1, 0, 1, 2], layout="page_first", page_size=4)
    with pytest.raises(ValueError):  # not whole pages
        host_page_checksums(host, [0, 1, 2], layout="page_first", page_size=4)
    # nothing to move is fine
    backup(device, host, device_indices=[], host_indices=[], layout="page_first", page_size=4)
    assert device_page_checksums(device, [], page_size=4).numel() == 0


# ---------------------------------------------------------------------------------------------
# Checksums


def spec_checksum(canonical_bytes: bytes, row_bytes: int) -> int:
    """The checksum's definition (kernels/checksum.py) in plain Python integers."""
    w = 4 if row_bytes % 4 == 0 else 2 if row_bytes % 2 == 0 else 1

    def fmix(x):
        x ^= x >> 33
        x = (x * C1) & MASK64
        x ^= x >> 33
        x = (x * C2) & MASK64
        return x ^ (x >> 33)

    n = len(canonical_bytes) // w
    acc = 0
    for i in range(n):
        word = int.from_bytes(canonical_bytes[i * w : (i + 1) * w], "little", signed=True)
        acc = (acc + (fmix((i + KEY_SEED) & MASK64) | 1) * word) & MASK64
    return fmix(acc ^ ((n * GOLDEN) & MASK64))


def canonical_bytes_of_device_page(device, kind, tokens) -> bytes:
    comps = list(device) if kind == "mha" else [device]
    return b"".join(c[:, tokens].contiguous().view(torch.uint8).numpy().tobytes() for c in comps)


@pytest.mark.parametrize("dtype,D", [(torch.bfloat16, 8), (torch.float16, 3), (torch.uint8, 5)])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_checksum_matches_definition_and_is_layout_independent(kind, dtype, D):
    ps = 4
    layouts = MHA_LAYOUTS if kind == "mha" else MLA_LAYOUTS
    dev_pages, host_pages = [5, 1, 8], [2, 9, 0]
    device, _ = make_pools(kind, layouts[0], D=D, dtype=dtype, ps=ps)
    row_bytes = D * torch.empty((), dtype=dtype).element_size()
    spec = [
        spec_checksum(canonical_bytes_of_device_page(device, kind, list(range(q * ps, q * ps + ps))), row_bytes)
        for q in dev_pages
    ]
    got = device_page_checksums(device, dev_pages, page_size=ps, unit="page")
    assert [int(v) & MASK64 for v in got] == spec
    assert checksum_hex(got) == [f"{v:016x}" for v in spec]
    H = 2 if kind == "mha" else 1
    geom = PageGeometry(3, ps, H, D, dtype, mla=kind == "mla")
    for layout in layouts:
        _, host = make_pools(kind, layout, D=D, dtype=dtype, ps=ps, seed=7)
        backup(
            device, host, device_indices=dev_pages, host_indices=host_pages, layout=layout, page_size=ps, unit="page"
        )
        by_page = host_page_checksums(host, host_pages, layout=layout, page_size=ps, unit="page")
        by_token = host_page_checksums(
            host, [p * ps + s for p in host_pages for s in range(ps)], layout=layout, page_size=ps
        )
        assert [int(v) & MASK64 for v in by_page] == spec, layout
        assert torch.equal(by_page, by_token)
        if layout != "layer_first":
            for p, want in zip(host_pages, spec, strict=True):
                assert (
                    storage_page_checksum(l3_objects(host, kind, layout, p, ps), layout=layout, geometry=geom) == want
                )
    comps = [device[0], device[1]] if kind == "mha" else [device]
    canon = torch.stack([torch.stack([c[:, q * ps : q * ps + ps] for c in comps]) for q in dev_pages])
    assert [int(v) & MASK64 for v in canonical_page_checksums(canon)] == spec


def l3_objects(host, kind, layout, page, ps):
    """The bytes SGLang's zero-copy path stores for one page of a page layout (docs/host-pool.md#page-buffer-meta)."""
    if kind == "mha":
        if layout == "page_first":
            return [
                host[c, page * ps : page * ps + ps].contiguous().view(torch.uint8).numpy().tobytes() for c in (0, 1)
            ]
        return [host[c, page].contiguous().view(torch.uint8).numpy().tobytes() for c in (0, 1)]
    if layout == "page_first":
        return [host[page * ps : page * ps + ps].contiguous().view(torch.uint8).numpy().tobytes()]
    return [host[page].contiguous().view(torch.uint8).numpy().tobytes()]


@pytest.mark.parametrize("kind,layout", CASES)
def test_checksum_changes_with_any_byte(kind, layout):
    ps = 4
    device, host = make_pools(kind, layout, ps=ps)
    host_pages = [3, 6]
    before = host_page_checksums(host, host_pages, layout=layout, page_size=ps, unit="page")
    raw = host.view(-1).view(torch.uint8)
    g = torch.Generator().manual_seed(3)
    # which bytes of the raw buffer belong to host page 3, found through the reference indexing
    mask = torch.zeros(host.shape, dtype=torch.bool)
    for t in range(3 * ps, 4 * ps):
        host_token(mask, kind, layout, t, ps).fill_(True)
    positions = mask.reshape(-1).repeat_interleave(host.element_size()).nonzero().flatten()
    for pos in positions[torch.randperm(positions.numel(), generator=g)[:8]].tolist():
        old = int(raw[pos])
        raw[pos] = old ^ (1 << int(torch.randint(0, 8, (1,), generator=g)))
        after = host_page_checksums(host, host_pages, layout=layout, page_size=ps, unit="page")
        assert after[0] != before[0] and after[1] == before[1]
        raw[pos] = old
    assert torch.equal(host_page_checksums(host, host_pages, layout=layout, page_size=ps, unit="page"), before)


def test_checksum_sees_swapped_slots_and_pages():
    ps = 4
    device, host = make_pools("mha", "page_first_direct", ps=ps)
    a = device_page_checksums(device, [0, 1, 2, 3, 4, 5, 6, 7], page_size=ps)
    swapped = device_page_checksums(device, [1, 0, 2, 3, 4, 5, 6, 7], page_size=ps)
    assert a[0] != swapped[0] and a[1] == swapped[1]
    # the same page content counts wherever it lives
    same = device_page_checksums(device, [4, 5, 6, 7, 0, 1, 2, 3], page_size=ps)
    assert same[0] == a[1] and same[1] == a[0]
    # K and V are not interchangeable
    flipped = device_page_checksums((device[1], device[0]), [0, 1, 2, 3], page_size=ps)
    assert flipped[0] != a[0]


def test_storage_checksum_refuses_bad_objects():
    geom = PageGeometry(2, 4, 2, 8, torch.bfloat16)
    with pytest.raises(InputError):
        storage_page_checksum([b"\0" * 10, b"\0" * 10], layout="page_first", geometry=geom)
    with pytest.raises(InputError):
        storage_page_checksum([b"\0" * geom.component_bytes] * 2, layout="layer_first", geometry=geom)
    with pytest.raises(InputError):
        storage_page_checksum([b"\0" * geom.component_bytes], layout="page_first", geometry=geom)


# ---------------------------------------------------------------------------------------------
# The benchmark command (tiny geometry: this checks the plumbing, never a speed)


def _bench_json(*args):
    result = hicache(["bench", "kernels", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_bench_kernels_command_json():
    prev = torch.get_num_threads()
    code, data = _bench_json(
        "--tokens", "32", "--layers", "2", "--heads", "2", "--head-dim", "16", "--kv-cache-dim", "24",
        "--page-size", "4", "--repeats", "1", "--device", "cpu",
    )  # fmt: skip
    assert code == 0, data
    assert torch.get_num_threads() == prev  # the single-thread setting is restored
    assert data["platform"] == "cpu" and data["threads"] == 1 and data["verified"] is True
    cases = {(c["attention"], c["layout"], c["direction"]) for c in data["cases"]}
    assert cases == {(k, lay, d) for k, lay in CASES for d in ("backup", "load")}
    assert all(c["ratio"] > 0 and c["gb_per_s"] > 0 for c in data["cases"])
    assert data["bytes_moved"] == {"mha": 32 * 2 * 2 * 2 * 16 * 2, "mla": 32 * 2 * 24 * 2}
    assert {s["where"] for s in data["checksums"]} == {"device", *MHA_LAYOUTS}
    if not torch.cuda.is_available():
        assert any("CUDA is not available" in n for n in data["notes"])


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--page-size", "0"], "--page-size"),
        (["--dtype", "fp4"], "fp4"),
        (["--layout", "page_sideways"], "page_sideways"),
        (["--attention", "gqa"], "gqa"),
    ],
)
def test_bench_kernels_command_refuses_bad_input(args, fragment):
    code, data = _bench_json(*args)
    assert code == 2 and fragment in data["error"]["message"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_bench_kernels_cuda_refused_without_gpu():
    code, data = _bench_json("--device", "cuda", "--tokens", "16", "--page-size", "4")
    assert code == 2 and "CUDA is not available" in data["error"]["message"]


# ---------------------------------------------------------------------------------------------
# Triton kernels, interpreted on the CPU in a subprocess (TRITON_INTERPRET=1 before triton imports)


TRITON_CONFIGS = ((4, torch.bfloat16, 8), (16, torch.uint8, 5), (64, torch.float32, 3))


def _triton_checks() -> dict:
    """Runs inside the interpreter subprocess: every layout x direction x MHA/MLA with tile sizes,
    dtypes (odd rows too) and index sets varied across cases; checksums against the torch path."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    done = {"copies": 0, "checksums": 0}
    ps = 4
    for i, (kind, layout) in enumerate(CASES):
        tile, dtype, D = TRITON_CONFIGS[i % len(TRITON_CONFIGS)]
        sets = index_sets(ps, 48, 44)
        names = ("scattered", "pages" if i % 2 else "unaligned")  # Triton addresses token by token: no runs
        for name in names:
            d_idx, h_idx = sets[name]
            device, host = make_pools(kind, layout, L=2, D=D, dtype=dtype, ps=ps)
            want = expected_backup(device, host, kind, layout, d_idx, h_idx, ps)
            backup(device, host, device_indices=d_idx, host_indices=h_idx, layout=layout, page_size=ps,
                   backend="triton", tile=tile)  # fmt: skip
            assert torch.equal(host, want), (kind, layout, tile, name, "backup")
            device2, host2 = make_pools(kind, layout, L=2, D=D, dtype=dtype, ps=ps, seed=1)
            want_dev = expected_load(device2, host2, kind, layout, d_idx, h_idx, ps)
            load(host2, device2, host_indices=h_idx, device_indices=d_idx, layout=layout, page_size=ps,
                 backend="triton", tile=tile)  # fmt: skip
            assert same_device(device2, want_dev), (kind, layout, tile, name, "load")
            done["copies"] += 2
        pages = [2, 9, 0, 5]
        ref = host_page_checksums(host, pages, layout=layout, page_size=ps, unit="page", backend="torch")
        got = host_page_checksums(host, pages, layout=layout, page_size=ps, unit="page", backend="triton", tile=tile)
        assert torch.equal(ref, got), (kind, layout, tile, "host checksum")
        scattered = [5, 40, 3, 17, 11, 12, 13, 14]
        ref = device_page_checksums(device, scattered, page_size=ps, backend="torch")
        got = device_page_checksums(device, scattered, page_size=ps, backend="triton", tile=tile)
        assert torch.equal(ref, got), (kind, layout, tile, "device checksum")
        done["checksums"] += 2
    return done


TRITON_TEST = "test_triton_kernels_interpreted_on_cpu"


@pytest.fixture(scope="module", autouse=True)
def triton_subprocess(request, tmp_path_factory):
    """Start the interpreted Triton checks at the top of this module, so they run beside the other
    tests (SGLang's import, mostly) instead of after them; the Triton test collects the result."""
    if not any(item.name == TRITON_TEST for item in request.session.items):
        yield None
        return
    here = Path(__file__).resolve()
    code = (
        "import importlib.util, json, sys\n"
        f"sys.path.append({str(here.parents[1])!r})\n"  # tests/, for the shared helpers (pytest's pythonpath)
        f"spec = importlib.util.spec_from_file_location('kernel_tests', {str(here)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(json.dumps(m._triton_checks()))\n"
    )
    out = tmp_path_factory.mktemp("triton") / "out.txt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    with open(out, "w") as sink:
        # cwd "/": the checkout's top-level kernels/ folder must not shadow the PyPI package `kernels`
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=sink, stderr=subprocess.STDOUT, cwd="/")
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------------
# SGLang's own host pool classes (CPU-side code only: construction and get_page_buffer_meta)


def _sglang_host_pool(kind, layout, device, ps):
    if kind == "mha":
        from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        k, v = device
        L, N, H, D = k.shape
        ks, vs = tuple(k.unbind(0)), tuple(v.unbind(0))

        def ptrs(ts):
            return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

        info = MHABufferInfo(
            buffers=KVBuffers(k=ks, v=vs, k_data_ptrs=ptrs(ks), v_data_ptrs=ptrs(vs), layout=KVBufferLayout.NHD),
            page_size=ps, head_num=H, head_dim=D, v_head_dim=D, dtype=k.dtype, device=torch.device("cpu"),
        )  # fmt: skip
        return MHATokenToKVPoolHost(
            info, 2.0, 0, ps, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=N, start_layer=0, end_layer=L,
        )  # fmt: skip
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    L, N, _, C = device.shape
    layers = tuple(device.unbind(0))
    info = MLABufferInfo(
        buffers=layers, data_ptrs=torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64),
        layer_indices=tuple(range(L)), device_layer_num=L, page_size=ps, kv_lora_rank=C - 4,
        qk_rope_head_dim=4, kv_cache_dim=C, dtype=device.dtype, device=torch.device("cpu"),
    )  # fmt: skip
    return MLATokenToKVPoolHost(
        info, 2.0, 0, ps, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=N, start_layer=0, end_layer=L, target_layer_num=L,
    )  # fmt: skip


@pytest.mark.parametrize("kind,layout", CASES)
def test_placement_matches_sglang_host_pool(kind, layout):
    """Our backup into SGLang's own host buffer puts each page where SGLang's get_page_buffer_meta
    (the pointers its Mooncake zero-copy path reads) says the page lives."""
    pytest.importorskip("sglang")
    ps, D = 4, 8
    device, _ = make_pools(kind, layout, D=D, ps=ps, dev_tokens=48)
    pool = _sglang_host_pool(kind, layout, device, ps)
    assert pool.size == (48 * 2 // ps + 1) * ps  # docs/host-pool.md#size: one extra page
    host = pool.kv_buffer
    H = 2 if kind == "mha" else 1
    dev_pages, host_pages = [3, 0, 10, 7], [pool.page_num - 1, 5, 0, 12]
    backup(device, host, device_indices=dev_pages, host_indices=host_pages, layout=layout, page_size=ps, unit="page")
    want = device_page_checksums(device, dev_pages, page_size=ps, unit="page")
    geom = PageGeometry(3, ps, H, D, host.dtype, mla=kind == "mla")
    host_tokens = torch.tensor([p * ps + s for p in host_pages for s in range(ps)])
    ptrs, sizes = pool.get_page_buffer_meta(host_tokens)
    per_page = len(ptrs) // len(host_pages)
    for i, p in enumerate(host_pages):
        chunks = [ctypes.string_at(a, n) for a, n in zip(ptrs[i * per_page : (i + 1) * per_page], sizes, strict=False)]
        if layout == "layer_first":  # one chunk per layer (and component): reassemble canonical order
            n_kv = geom.n_kv
            objects = [b"".join(chunks[c::n_kv]) for c in range(n_kv)]
            got = storage_page_checksum(objects, layout="page_first_direct", geometry=geom)
        else:
            assert sizes[0] == geom.component_bytes
            got = storage_page_checksum(chunks, layout=layout, geometry=geom)
        assert got == int(want[i]) & MASK64, (layout, p)


# Last in the file: by now the subprocess started with the module has had the longest time to run.
def test_triton_kernels_interpreted_on_cpu(triton_subprocess):
    proc, out = triton_subprocess
    rc = proc.wait(timeout=300)
    text = out.read_text()
    assert rc == 0, text[-4000:]
    counts = json.loads(text.strip().splitlines()[-1])
    assert counts["copies"] == 2 * 2 * len(CASES) and counts["checksums"] == 2 * len(CASES)
