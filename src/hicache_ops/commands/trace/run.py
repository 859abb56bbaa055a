"""Run a trace against the embedded engine, optionally with a known fault injected on purpose.

A read trace is a cross-instance story: a writer instance writes the prompt to L3 through a
Mooncake master, and a fresh reader instance (its own pools and store client, the same master)
traces the read. Each fault changes the writer, the reader, or the objects between them, and
shows at which step the path breaks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from hicache_ops.commands.trace.steps import trace_read, trace_write
from hicache_ops.commands.trace.tracer import INFO, Step
from hicache_ops.engine.builder import EngineSpec, build_bytes
from hicache_ops.errors import InputError
from hicache_ops.results import Result

# fault -> (the trace kinds it applies to, what it does)
FAULTS: dict[str, tuple[tuple[str, ...], str]] = {
    "missing-v": (("read",), "remove the `_v` object of the prompt's second page after the write"),
    "tp-rank-mismatch": (("read",), "the writer runs tp-size 1, the reader tp-size 2 (rank 1 finds no `_1_` objects)"),
    "salt-mismatch": (("read",), "the writer sends cache_salt 'tenant-a', the reader sends none"),
    "version-mismatch": (("read",), "the writer uses SGLang 0.5.14's keys, the reader 0.5.23's"),
    "below-threshold": (("read",), "the reader's prompt is shorter than the prefetch threshold"),
    "write-back-no-eviction": (("write", "read"), "the writer uses write_back and never evicts"),
    "prefetch-timeout": (("read",), "L3 reads take 0.5 s per page and the reader's stop policy is timeout"),
    "corrupted-object": (("read",), "the `_k` object of the prompt's second page is overwritten with other bytes"),
    "missing-dcp-shard": (
        ("read",),
        "remove the last DCP rank's object of the prompt's second page after the write (needs --dcp-size > 1)",
    ),
    "dcp-mismatch": (
        ("read",),
        "the writer runs decode context parallel (--dcp-size, or 2), the reader looks the "
        "keys up without DCP (needs an MLA --preset, SGLang 0.5.23)",
    ),
    "missing-side-object": (
        ("read",),
        "with side pools: the writer stores the prompt's first half, then all of it (two "
        "nodes); then the first side pool's objects of the last page are removed",
    ),
}


@dataclass
class TraceRun:
    kind: str
    inject: str | None
    scenario: dict = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)

    @property
    def failed_step(self) -> Step | None:
        return next((s for s in self.steps if s.status == "FAIL"), None)

    def result(self) -> TraceRunResult:
        failed = self.failed_step
        return TraceRunResult(
            kind=self.kind,
            inject=self.inject,
            scenario=self.scenario,
            ok=failed is None,
            failed_step=failed,
            steps=self.steps,
        )


class TraceRunResult(Result):
    """A whole trace: the serve's `POST /v1/trace/{kind}` answer (`hicache trace --json` prints its
    steps, one JSON object a line, as they are made)."""

    kind: Literal["write", "read"] = Field(description="the path traced")
    inject: str | None = Field(description="the fault injected on purpose, `null` when none")
    scenario: dict[str, Any] = Field(description="the instances involved (writer, reader, serve) and their settings")
    ok: bool = Field(description="every step's check holds")
    failed_step: Step | None = Field(description="the step the path stops at, `null` when none")
    steps: list[Step] = Field(description="every step made, in order")


def check_traceable(tokens: list[int], page_size: int) -> None:
    """A prompt shorter than one page produces no page: there is no path to trace."""
    if len(tokens) < page_size:
        raise InputError(
            f"the prompt has {len(tokens)} token(s), fewer than one page of {page_size}: it produces no page to "
            "write or read.",
            hint=f"Give at least {page_size} tokens (whole pages only are stored).",
        )


def check_fault(kind: str, inject: str | None) -> None:
    if inject is None:
        return
    if inject not in FAULTS:
        raise InputError(f"fault {inject!r} is unknown.", hint=f"Use one of: {', '.join(FAULTS)}.")
    kinds, _ = FAULTS[inject]
    if kind not in kinds:
        raise InputError(f"fault {inject!r} applies to `trace {'/'.join(kinds)}`, not `trace {kind}`.")


def _writer_note(spec: EngineSpec, stored_pages: int, pages: int) -> str:
    """What the writer put in L3, naming its write policy when that policy is why nothing went."""
    if stored_pages:
        return f"the writer stored {stored_pages} of {pages} page(s) in L3 through the embedded master"
    if spec.write_policy == "write_back":
        return (
            "the writer (--hicache-write-policy write_back) stored no page in L3: write_back copies a page to "
            "host and L3 only when it is evicted from the GPU, and nothing was evicted"
        )
    return f"the writer (--hicache-write-policy {spec.write_policy}) stored no page in L3"


def diagnosis_causes(
    tokens, spec: EngineSpec, metrics_address: str, extra_key, cache_salt, try_cache_salts: Sequence[str] = ()
) -> list[str]:
    """Likely causes of an L3 miss, from the live key diff against the master."""
    from hicache_ops.commands.inspect.key_listing import expected_keys
    from hicache_ops.commands.inspect.live_diff import live_diff
    from hicache_ops.mooncake.admin import AdminClient

    admin = AdminClient(metrics_address)
    try:
        report = None
        if spec.side_pools:
            report = expected_keys(
                tokens,
                spec.page_size,
                spec.deployment(),
                extra_key=extra_key,
                cache_salt=cache_salt,
                pools=spec.side_pools,
            )
        diff = live_diff(
            tokens,
            spec.page_size,
            spec.deployment(),
            admin,
            extra_key=extra_key,
            cache_salt=cache_salt,
            try_cache_salts=list(try_cache_salts),
            report=report,
        )
    finally:
        admin.close()
    causes = [d["message"] for d in diff.diagnosis]
    if diff.first_missing:
        causes.insert(0, f"first missing object: {diff.first_missing}")
    return causes


def run_embedded(
    kind: str,
    tokens: list[int],
    spec: EngineSpec,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    inject: str | None = None,
    on_step: Callable[[Step], None] | None = None,
    segment_bytes: int = 64 * 2**20,
) -> TraceRun:
    """Start an embedded master, set the scene for `inject`, and trace `kind` ("write" or "read")."""
    from hicache_ops.mooncake.master import EmbeddedMaster
    from hicache_ops.mooncake.store_client import StoreClient

    if kind not in ("write", "read"):
        raise InputError(f"trace kind {kind!r} is neither write nor read.")
    check_fault(kind, inject)
    check_traceable(tokens, spec.page_size)
    run = TraceRun(kind, inject)
    writer_spec, reader_spec = spec, spec
    w_salt, r_tokens = cache_salt, tokens
    if inject == "write-back-no-eviction":
        writer_spec = replace(spec, write_policy="write_back")
    elif inject == "tp-rank-mismatch":
        writer_spec, reader_spec = replace(spec, tp_size=1), replace(spec, tp_size=2)
    elif inject == "salt-mismatch":
        w_salt = "tenant-a"
    elif inject == "version-mismatch":
        writer_spec = replace(spec, sglang_version="0.5.14")
    elif inject == "below-threshold":
        ps = spec.page_size
        threshold = max(spec.prefetch_threshold, ps)
        r_tokens = tokens[: max(ps, ((threshold - 1) // ps) * ps)]
    elif inject == "prefetch-timeout":
        reader_spec = replace(spec, stop_policy="timeout")
    elif inject == "missing-side-object" and not spec.side_pools:
        raise InputError("fault 'missing-side-object' needs side pools (--pool or --pool-preset).")
    elif inject == "dcp-mismatch":
        writer_spec, reader_spec = _dcp_mismatch(spec)
    elif inject == "missing-v" and spec.geometry.mla:
        raise InputError(
            "fault 'missing-v' removes a `_v` object, and an MLA model writes only `_k` objects.",
            hint="Use corrupted-object, or missing-dcp-shard with --dcp-size.",
        )
    elif inject == "missing-dcp-shard" and spec.dcp_size == 1:
        raise InputError("fault 'missing-dcp-shard' removes one DCP shard's object: it needs --dcp-size > 1.")
    if (
        kind == "read"
        and len(tokens) // spec.page_size < 2
        and inject in ("missing-v", "corrupted-object", "missing-dcp-shard", "missing-side-object")
    ):
        raise InputError(f"fault {inject!r} needs a prompt of at least two pages ({2 * spec.page_size} tokens).")

    # The master's log lives as long as the run: an embedded trace leaves nothing behind.
    with (
        tempfile.TemporaryDirectory(prefix="hicache-trace-") as logs,
        EmbeddedMaster(log_path=f"{logs}/master.log") as master,
    ):
        run.scenario = {
            "master": master.info(),
            "fault": FAULTS[inject][1] if inject else None,
        }
        clients: list = []
        try:
            w_store = StoreClient.connect(master.rpc_address, segment_size=segment_bytes)
            clients.append(w_store)
            writer = build_bytes(writer_spec, w_store)
            if kind == "write":
                run.scenario["writer"] = _describe(writer_spec, extra_key, cache_salt)
                run.steps = trace_write(writer, tokens, extra_key=extra_key, cache_salt=cache_salt, on_step=on_step)
                return run
            if inject == "missing-side-object":  # a first node ends half way: a Mamba state there too
                writer.prefill(tokens[: (len(tokens) // spec.page_size // 2) * spec.page_size], extra_key, w_salt)
            written = writer.prefill(tokens, extra_key, w_salt)
            run.scenario["writer"] = {**_describe(writer_spec, extra_key, w_salt), "stored_pages": written.stored_pages}
            _damage(inject, writer, w_store, tokens, extra_key, w_salt)
            r_store = StoreClient.connect(master.rpc_address, segment_size=segment_bytes)
            clients.append(r_store)
            reader = build_bytes(reader_spec, r_store)
            if inject == "prefetch-timeout":
                from hicache_ops.engine.bytes_plane import MooncakeL3

                assert isinstance(reader.l3, MooncakeL3)  # build_bytes with a store gives the Mooncake tier
                reader.l3.extra_latency_s = 0.5
            run.scenario["reader"] = _describe(reader_spec, extra_key, cache_salt)
            writer_note = _writer_note(writer_spec, written.stored_pages, len(tokens) // spec.page_size)
            intro = Step(
                step=0,
                name="scenario",
                status=INFO,
                summary=f"{writer_note}; a fresh reader traces the read",
                detail=run.scenario,
            )
            if on_step is not None:
                on_step(intro)
            run.steps = trace_read(
                reader,
                r_tokens,
                extra_key=extra_key,
                cache_salt=cache_salt,
                on_step=on_step,
                diagnose=lambda: (
                    ([writer_note] if written.stored_pages == 0 else [])
                    + diagnosis_causes(
                        r_tokens,
                        reader_spec,
                        master.metrics_address,
                        extra_key,
                        cache_salt,
                        try_cache_salts=[w_salt] if w_salt not in (None, cache_salt) else [],
                    )
                ),
            )
            return run
        finally:
            for client in clients:
                client.close()


def _dcp_mismatch(spec: EngineSpec) -> tuple[EngineSpec, EngineSpec]:
    """A DCP writer (the given --dcp-size, else 2) and the same deployment reading without DCP."""
    if not spec.geometry.mla:
        raise InputError(
            "fault 'dcp-mismatch' needs an MLA model: SGLang runs DCP with MLA only.",
            hint="Pass an MLA --preset such as tiny-mla.",
        )
    dcp = spec.dcp_size if spec.dcp_size > 1 else 2
    tp = spec.tp_size if spec.tp_size % dcp == 0 else dcp
    writer = replace(spec, dcp_size=dcp, tp_size=tp)
    reader = replace(writer, dcp_size=1)
    for side in (writer, reader):
        side.cache_config(side.host_layout(mooncake=True))  # refuse before any master starts
    return writer, reader


def _describe(spec: EngineSpec, extra_key, cache_salt) -> dict:
    return {
        "sglang_version": spec.sglang_version,
        "tp_size": spec.tp_size,
        "dcp_size": spec.dcp_size,
        "write_policy": spec.write_policy,
        "stop_policy": spec.stop_policy,
        "layout": spec.layout,
        "model_name": spec.model_name,
        "extra_key": extra_key,
        "cache_salt": cache_salt,
        "prefetch_threshold": spec.prefetch_threshold,
        "side_pools": [p.name for p in spec.side_pools],
    }


def _damage(inject, writer, store, tokens, extra_key, cache_salt) -> None:
    """Change the objects between write and read, for the faults that do."""
    if inject not in ("missing-v", "corrupted-object", "missing-dcp-shard", "missing-side-object"):
        return
    _, storage_keys = writer.keys_for(np.asarray(tokens), extra_key, cache_salt)
    if inject == "missing-dcp-shard":
        last = max((s for s in writer.l3.schemes if s.writes), key=lambda s: s.dcp_rank)
        (key,) = last.object_keys(storage_keys[1])
        store.remove_keys([key], prefix=last.prefix or key, force=True)
    elif inject == "missing-side-object":
        l3 = writer.l3
        pool = l3.pools[0]
        keys = [o["key"] for rank in l3.side_presence(storage_keys, len(storage_keys)) for o in rank[pool.name][-1]]
        store.remove_keys(keys, prefix=l3.schemes[0].prefix or storage_keys[-1], force=True)
        return
    scheme = writer.l3.schemes[0]
    k_key, *rest = scheme.object_keys(storage_keys[1])
    v_key = rest[0] if rest else None  # MLA writes no `_v` (refused for missing-v in run_embedded)
    if inject == "missing-v":
        store.remove_keys([v_key], prefix=scheme.prefix or v_key, force=True)
    else:
        data = bytearray(store.get(k_key))
        data[0] ^= 0xFF
        store.put(k_key, bytes(data), upsert=True)
