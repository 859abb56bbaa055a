"""`hicache prefetch`: ask a serve instance to pull prompts from L3 into its host pool, and say
per prompt what came back, how long it took, and what each stop policy would have made of it.

A stop request (Ctrl-C, SIGTERM; hicache_ops/interrupt.py) abandons the prompt in flight (not
reported) and returns the rows done so far, marked interrupted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.results import Result
from hicache_ops.server.side_pools import check_side_pools
from hicache_ops.sglang import policy as pol
from hicache_ops.tokens import Prompt


class PolicyCut(Result):
    deadline_s: float | None = Field(description="when that stop policy would end the prefetch; `null`: never")
    cut: bool = Field(description="the prefetch took longer than that deadline")


class PrefetchRow(Result):
    index: int = Field(description="the prompt's position in the input, from 0")
    source: str = Field(description="where the prompt came from (file and line)")
    tokens: int = Field(description="tokens in the prompt")
    local_tokens: int = Field(description="tokens already on device or host: not fetched")
    considered_tokens: int = Field(description="tokens the prefetch looked up in L3")
    hit_pages: int = Field(description="pages L3 holds of those")
    fetched_pages: int = Field(description="pages fetched into the host pool")
    bytes: int = Field(description="bytes fetched")
    seconds: float = Field(description="the prefetch's time")
    budget_s: float = Field(description="SGLang's prefetch timeout budget for this prompt")
    verified: bool = Field(description="pages were inserted and their bytes matched; false when none were")
    reason: str = Field(description="why the prefetch stopped, or what went wrong")
    size_mismatched_objects: int = Field(0, description="objects of another deployment's byte count under these keys")
    policies: dict[str, PolicyCut] = Field(
        default_factory=dict, description="each stop policy's verdict, when L3 had pages"
    )


class PrefetchResult(Result):
    """`hicache prefetch --json`."""

    omit_if_none = ("server_disagreements",)

    serve: str = Field(description="the serve instance asked")
    stop_policy: str = Field(description="the serve's prefetch stop policy")
    interrupted: str | None = Field(description="the signal that stopped the run, `null` when it finished")
    prompts: list[PrefetchRow] = Field(description="one row per prompt done")
    server_disagreements: list | None = Field(
        None, description="with --sglang-url: where the serve's settings differ from the SGLang server's"
    )


@dataclass
class PrefetchReport:
    config: dict  # the serve's
    rows: list[PrefetchRow]
    interrupted: str | None = None  # the signal that stopped it, if one did

    def result(self, serve: str, server_disagreements: list | None = None) -> PrefetchResult:
        return PrefetchResult(
            serve=serve,
            stop_policy=self.config["stop_policy"],
            interrupted=self.interrupted,
            prompts=self.rows,
            server_disagreements=server_disagreements,
        )


def prefetch_prompts(
    prompts: Sequence[Prompt],
    client,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    on_progress: Callable[[PrefetchRow], None] | None = None,
    pool_texts: Sequence[str] = (),
    pool_preset: str | None = None,
) -> PrefetchReport:
    """Prefetch each prompt on the serve instance, one row per prompt done. `pool_texts` /
    `pool_preset` must name the serve's side pools (it reads them with the KV)."""
    config = client.stats()["config"]
    check_side_pools(config, pool_texts, pool_preset)
    admission = config["admission_s"]
    report = PrefetchReport(config, [])
    rows = report.rows
    for i, prompt in enumerate(prompts):
        if interrupt.requested():
            break
        ek = extra_key if extra_key is not None else prompt.extra_key
        cs = cache_salt if cache_salt is not None else prompt.cache_salt
        try:
            r = interrupt.call(client.prefetch, prompt.input_ids, ek, cs)
        except interrupt.Interrupted:
            break  # the client is abandoned with the call in flight: the caller closes it
        info = r["prefetch"]
        elapsed = info["elapsed_s"]
        budget = pol.TimeoutBudget(**config["timeout_budget"]).seconds(
            config["sglang_version"],
            requested_tokens=info["considered_tokens"],
            hit_tokens=info["hit_pages"] * config["page_size"],
        )
        row = PrefetchRow(
            index=i,
            source=prompt.source or f"prompt {i + 1}",
            tokens=r["prompt_tokens"],
            local_tokens=r["device_hit"] + r["host_hit"],
            considered_tokens=info["considered_tokens"],
            hit_pages=info["hit_pages"],
            fetched_pages=info["completed_pages"],
            bytes=info["bytes"],
            seconds=r["timings_ms"].get("prefetch", 0.0) / 1e3,
            budget_s=budget,
            verified=r["mismatched_pages"] == 0 and not info["size_mismatched_objects"],
            reason=info["reason"],
            size_mismatched_objects=info["size_mismatched_objects"],
        )
        if row.size_mismatched_objects:
            row.reason = (
                f"{row.size_mismatched_objects} object(s) read with another deployment's byte count (dtype, heads "
                f"or page size differ under the same keys)" + (f"; {row.reason}" if row.reason else "")
            )
        if info["hit_pages"] and not info["completed_pages"]:
            # The stop policy cut it to nothing: no page was inserted, so nothing was verified.
            row.bytes, row.verified = 0, False
            row.reason = (
                f"cut to zero pages: {row.reason or config['stop_policy']}; "
                f"{info['hit_pages']} page(s) in L3, none inserted"
            )
        if info["hit_pages"]:
            for policy in pol.STOP_POLICIES:
                deadline = pol.stop_deadline(policy, budget, admission, config["sglang_version"])
                # wait_complete has no deadline: None rather than an infinity JSON cannot carry.
                row.policies[policy] = PolicyCut(
                    deadline_s=None if deadline == float("inf") else deadline, cut=elapsed > deadline
                )
        rows.append(row)
        if on_progress:
            on_progress(row)
    if interrupt.requested():
        report.interrupted = interrupt.reason()
    return report
