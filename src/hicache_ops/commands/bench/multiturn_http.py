"""The multi-turn workload replayed over HTTP against a server speaking SGLang's `/generate`: a
`hicache serve` or a real SGLang (docs/workloads.md#multi-turn-workload, docs/serve-api.md).

Each client's round r sends its history (earlier questions and the server's answers) plus the
round's new question, as SGLang's bench_multiturn.py does; the server's `output_ids` join the
history. Rounds are barriers; within a round `concurrency` requests are in flight at once. The hit
rate per round is read from each reply's `meta_info` (`cached_tokens`, `cached_tokens_details`) and
set beside the model's ceiling for the server's page size.

Pure library: no typer, no rich.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pydantic import Field

from hicache_ops import interrupt
from hicache_ops.commands.bench.multiturn_workload import MultiturnSpec, workload_tokens
from hicache_ops.errors import InputError, SettingError, UnreachableError
from hicache_ops.results import Result


class MultiturnHttpReport(Result):
    """`hicache bench multiturn --serve URL --json`: the workload replayed over /generate."""

    url: str = Field(description="the server replayed against")
    workload: dict[str, Any] = Field(
        description="clients, rounds, new_tokens, output_tokens, seed, concurrency and the server's page_size"
    )
    rounds: list[dict[str, Any]] = Field(
        description="per round: prompt and cached tokens, hits per tier, the hit rate and the (paged) ceiling"
    )
    total: dict[str, Any] = Field(description="prompt tokens, cached tokens and the hit rate over every round")
    interrupted: bool = Field(description="whether a stop request ended the replay before its last round")


def _post(client, url: str, body: dict, timeout: float) -> dict:
    import httpx

    try:
        response = client.post("/generate", json=body)
    except httpx.TimeoutException:
        raise UnreachableError(f"{url}/generate did not answer within {timeout:g} s.") from None
    except httpx.TransportError as exc:
        raise UnreachableError(f"no server answers at {url} ({type(exc).__name__}).") from None
    if response.status_code != 200:
        try:
            detail = response.json().get("error", {}).get("message") or response.text
        except ValueError:
            detail = response.text
        raise InputError(f"{url}/generate answered HTTP {response.status_code}: {str(detail)[:300]}")
    try:
        data = response.json()
        meta = data["meta_info"]
        return {"output_ids": list(data["output_ids"]), "cached": int(meta.get("cached_tokens", 0)),
                "details": meta.get("cached_tokens_details") or {}}  # fmt: skip
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{url}/generate did not answer in SGLang's shape (output_ids, meta_info).") from None


def run_over_http(
    spec: MultiturnSpec, url: str, *, page_size: int, timeout: float, progress=None
) -> MultiturnHttpReport:
    """Replay `spec`'s conversations against `url`; per round: prompt tokens, cached tokens by tier,
    the hit rate and the ceiling for `page_size` (the server's)."""
    import httpx

    if not url.startswith(("http://", "https://")):
        raise SettingError("serve", f"{url!r} must start with http:// or https://.")
    url = url.rstrip("/")
    questions = workload_tokens(spec)
    n, o = spec.new_tokens, spec.output_tokens
    histories: list[list[int]] = [[] for _ in range(spec.clients)]
    paged = replace(spec, page_size=page_size)
    rounds: list[dict] = []
    interrupted = False
    with (
        httpx.Client(base_url=url, timeout=httpx.Timeout(timeout)) as client,
        ThreadPoolExecutor(max_workers=spec.concurrency or 1) as pool,
    ):
        for r in range(spec.rounds):
            if interrupt.requested():
                interrupted = True
                break
            start = r * spec.turn_tokens
            prompts = [histories[c] + questions[c, start : start + n].tolist() for c in range(spec.clients)]
            bodies = [{"input_ids": p, "sampling_params": {"max_new_tokens": o, "ignore_eos": True}} for p in prompts]
            replies = list(pool.map(lambda b: _post(client, url, b, timeout), bodies))
            for c, reply in enumerate(replies):
                histories[c] = prompts[c] + reply["output_ids"]
            prompt_tokens = sum(len(p) for p in prompts)
            cached = sum(x["cached"] for x in replies)
            tiers = {t: sum(int(x["details"].get(t) or 0) for x in replies) for t in ("device", "host", "storage")}
            entry = {"round": r, "prompt_tokens": prompt_tokens, "cached_tokens": cached}
            entry.update({f"{t}_hit": v for t, v in tiers.items()})
            entry.update(hit_rate=cached / prompt_tokens, ceiling=spec.ceiling(r), ceiling_paged=paged.ceiling_paged(r))
            rounds.append(entry)
            if progress is not None:
                progress(r, spec.rounds)
    total_prompt = sum(x["prompt_tokens"] for x in rounds)
    total_cached = sum(x["cached_tokens"] for x in rounds)
    return MultiturnHttpReport(
        url=url,
        workload={
            "clients": spec.clients,
            "rounds": spec.rounds,
            "new_tokens": n,
            "output_tokens": o,
            "seed": spec.seed,
            "concurrency": spec.concurrency or 1,
            "page_size": page_size,
        },  # fmt: skip
        rounds=rounds,
        total={
            "prompt_tokens": total_prompt,
            "cached_tokens": total_cached,
            "hit_rate": total_cached / total_prompt if total_prompt else 0.0,
        },  # fmt: skip
        interrupted=interrupted,
    )
