"""`bench replay` beside SGLang's own L1/L2 policy simulator, on the same trace, in one run.

SGLang's `benchmark/hicache/hicache_policy_simulator.py` is not in the wheel: pass the file with
`--simulator PATH` (it is imported from there, never copied here). Two inputs are built from the
trace (docs/benchmarks.md#bench-replay-beside-sglangs-policy-simulator):

- `pages`: the page-reference stream, every request one 512-token block (each request of the trace
  split into its blocks, in order, same timestamp);
- `trace`: the trace as it is.

Each side gets the same capacities: L1 of `--l1-blocks` 512-token blocks, L2 of the host pool
`bench replay` sizes from it (SGLang's ratio 2, plus one page), no L3; write_through on our side,
`main_write_through` on the simulator's. Only the replay itself is timed (the trace is loaded and
the inputs built before); the two sides alternate, `--repeats` times each, and the medians count.
The ratio is simulator seconds / ours: above 1, `bench replay` is faster.

    PYTHONPATH=src .venv/bin/python scripts/bench_vs_simulator.py --simulator /path/to/hicache_policy_simulator.py \
        --trace ../shared/traces/mooncake_fast25_synthetic_trace.jsonl

Hit rates differ by design (SGLang's match stops one token short, pages are --page-size tokens);
they are printed for context only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from hicache_ops.commands.bench.replay import ReplaySpec, replay
from hicache_ops.commands.bench.replay_trace import (
    MOONCAKE_BLOCK_TOKENS,
    TokenSource,
    Trace,
    TraceRequest,
    load_trace,
)
from hicache_ops.errors import InputError


def refuse(message: str) -> NoReturn:
    """Bad input: one sentence on stderr, exit 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_simulator(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        refuse(f"--simulator {path} is not a file (SGLang's benchmark/hicache/hicache_policy_simulator.py).")
    spec = importlib.util.spec_from_file_location("hicache_policy_simulator", file)
    if spec is None or spec.loader is None:
        refuse(f"--simulator {path} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def page_stream(trace: Trace) -> Trace:
    """Every request of `trace` split into its blocks: one 512-token request per block."""
    requests: list[TraceRequest] = []
    for request in trace.requests:
        for block in request.hash_ids or []:
            requests.append(
                TraceRequest(len(requests) + 1, request.timestamp, MOONCAKE_BLOCK_TOKENS, 0, hash_ids=[block])
            )
    return Trace(f"{trace.path} (one block per request)", trace.format, requests)


def timed(run: Any) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def compare(sim: ModuleType, trace: Trace, spec: ReplaySpec, l1_blocks: int, repeats: int) -> dict[str, Any]:
    tokens = TokenSource(trace)
    records = [sim.TraceRecord(timestamp=r.timestamp, hash_ids=tuple(r.hash_ids or ())) for r in trace.requests]
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    our_hit = their_hit = 0.0
    l2_blocks = None
    for i in range(repeats):
        for side in ("ours", "sim") if i % 2 == 0 else ("sim", "ours"):
            if side == "ours":
                wall, cpu, run = timed(lambda: replay(spec, trace, tokens))
                ours.append((wall, cpu))
                our_hit = run.hit_rate
                l2_blocks = run.pools["l2"] // MOONCAKE_BLOCK_TOKENS
            else:
                assert l2_blocks is not None  # ours runs first: it sizes the host pool the simulator gets
                simulator = sim.HiCachePolicySimulator("main_write_through", l1_blocks, l2_blocks)
                wall, cpu, metrics = timed(lambda s=simulator: s.simulate_records(records))
                theirs.append((wall, cpu))
                their_hit = metrics.l1_l2_hit_rate
    med = statistics.median
    ours_wall, ours_cpu = med(w for w, _ in ours), med(c for _, c in ours)
    sim_wall, sim_cpu = med(w for w, _ in theirs), med(c for _, c in theirs)
    return {
        "requests": len(trace.requests),
        "l1_blocks": l1_blocks,
        "l2_blocks": l2_blocks,
        "page_size": spec.page_size,
        "ours_wall_s": ours_wall,
        "ours_cpu_s": ours_cpu,
        "simulator_wall_s": sim_wall,
        "simulator_cpu_s": sim_cpu,
        "ratio_wall": sim_wall / ours_wall,
        "ratio_cpu": sim_cpu / ours_cpu,
        "ours_hit_rate": our_hit,
        "simulator_hit_rate": their_hit,
        "ours_runs": ours,
        "simulator_runs": theirs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulator", required=True, help="path of SGLang's hicache_policy_simulator.py")
    parser.add_argument("--trace", required=True, help="mooncake JSONL trace (hash_ids), e.g. the shared FAST'25 one")
    parser.add_argument("--l1-blocks", type=int, default=1000, help="L1 capacity in 512-token blocks (1000)")
    parser.add_argument("--page-size", type=int, default=64, help="our page size in tokens (64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side and input (3)")
    parser.add_argument("--input", choices=("pages", "trace", "both"), default="both")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests of the trace")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.l1_blocks < 1 or args.repeats < 1 or args.page_size < 1:
        parser.error("--l1-blocks, --repeats and --page-size must be 1 or more")
    if MOONCAKE_BLOCK_TOKENS % args.page_size:
        parser.error(f"--page-size must divide {MOONCAKE_BLOCK_TOKENS}: a block is then whole pages on both sides")
    sim = load_simulator(args.simulator)
    try:
        trace = load_trace(args.trace, "mooncake", args.limit)
    except InputError as err:
        refuse(err.message)
    spec = ReplaySpec(page_size=args.page_size, l1_tokens=args.l1_blocks * MOONCAKE_BLOCK_TOKENS, l3="none")
    spec.validate()
    inputs = {"pages": page_stream(trace), "trace": trace}
    chosen = ("pages", "trace") if args.input == "both" else (args.input,)
    out = {name: compare(sim, inputs[name], spec, args.l1_blocks, args.repeats) for name in chosen}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, r in out.items():
        print(
            f"{name}: {r['requests']:,} requests, L1 {r['l1_blocks']:,} blocks, L2 {r['l2_blocks']:,} blocks, "
            f"our page {r['page_size']} tokens; median of {args.repeats} interleaved runs per side"
        )
        print(
            f"  bench replay  {r['ours_wall_s']:6.2f} s wall {r['ours_cpu_s']:6.2f} s CPU  "
            f"(hit rate {100 * r['ours_hit_rate']:.1f}%)"
        )
        print(
            f"  simulator     {r['simulator_wall_s']:6.2f} s wall {r['simulator_cpu_s']:6.2f} s CPU  "
            f"(L1+L2 hit rate {100 * r['simulator_hit_rate']:.1f}%)"
        )
        print(f"  simulator / ours: {r['ratio_wall']:.2f}x wall, {r['ratio_cpu']:.2f}x CPU (above 1: ours is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
