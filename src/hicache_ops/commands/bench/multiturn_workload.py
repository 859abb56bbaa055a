"""The multi-turn workload of `bench multiturn` (docs/workloads.md#multi-turn-workload): its sizes,
the pools it runs against, and its token ids.

Workload (SGLang's `benchmark/hicache/bench_multiturn.py`): `clients` conversations, each with a
growing history of random token ids (one fixed seed, a different history per client). In round r
a client's prompt is its history plus a new question of `new_tokens`; the answer of
`output_tokens` then joins the history. A round barrier: every client is served once per round,
in the same order every round. Hit rate = cached prompt tokens / prompt tokens.

The ceiling: round r's prompt has r*(new+output) tokens of history and `new` fresh ones, so no
cache can hit more than h_max(r) = r*(n+o) / (r*(n+o) + n); with n=4096, o=16 that is
4112r / (4096(r+1) + 16r). A page-granular cache reaches floor(r*(n+o)/page)*page of it
(`ceiling_paged`).

Pure library: no typer, no rich; the engine builder is imported only where a configuration's pools are sized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from hicache_ops.errors import InputError, SettingError
from hicache_ops.results import Result
from hicache_ops.sglang.versions import NEWEST, validate_version

CONFIGS: tuple[str, ...] = ("l1", "l1_l2", "l1_l2_l3")
LABELS: dict[str, str] = {"l1": "L1", "l1_l2": "L1+L2", "l1_l2_l3": "L1+L2+L3"}
# The published run's random seed (`bench_multiturn.py` draws token ids with 20260626).
PUBLISHED_SEED = 20260626
# The published run's GPU pool holds 18 rounds of every client's history: the L1 cliff lands where
# its figure shows it (docs/workloads.md#multi-turn-workload).
DEFAULT_L1_ROUNDS = 18.0
# Random token ids are drawn below this (a typical vocabulary size).
VOCAB_SIZE = 32000
# Refuse workloads whose token ids alone would take more than this many bytes (uint32).
MAX_WORKLOAD_BYTES = 2 * 2**30
# Real-bytes mode moves and verifies every page's KV: it refuses conversations longer than this
# (clients x rounds x (new + output) tokens); the published scale is an accounting-only run.
MAX_REAL_BYTES_TOKENS = 2**20


@dataclass(frozen=True)
class MultiturnSpec:
    """The workload and the pools. Exactly one of `l1_tokens` / `l1_rounds` sizes the device pool
    (neither: DEFAULT_L1_ROUNDS rounds); the host pool is `hicache_ratio` x device, plus one page."""

    clients: int = 48
    rounds: int = 60
    new_tokens: int = 4096
    output_tokens: int = 16
    page_size: int = 64
    l1_tokens: int | None = None
    l1_rounds: float | None = None
    hicache_ratio: float = 2.0
    write_policy: str = "write_through"
    seed: int = PUBLISHED_SEED
    accounting_only: bool = True
    sglang_version: str = NEWEST
    # None: one request at a time (the published simulation). N: waves of N clients arrive
    # together and the scheduler model admits them (engine/scheduler.py).
    concurrency: int | None = None
    preset: str = "tiny"  # the KV geometry behind the byte counts (and the real-bytes pools)
    # Modelled L3 transfer rate in bytes/s (docs/controller.md#transfer-time); None: unlimited.
    l3_bandwidth_bytes_s: float | None = None

    # -- derived sizes ------------------------------------------------------------------------

    @property
    def turn_tokens(self) -> int:
        return self.new_tokens + self.output_tokens

    def prompt_tokens(self, r: int) -> int:
        """Round r's prompt of one client: its history plus the new question."""
        return r * self.turn_tokens + self.new_tokens

    def history_pages(self, rounds_done: int) -> int:
        """Whole pages of one client's history a cache keeps after `rounds_done` rounds: prompts and
        answers but the last answer token, whose KV is never computed (docs/controller.md#finished-requests)."""
        return max(rounds_done * self.turn_tokens - 1, 0) // self.page_size

    def ceiling(self, r: int) -> float:
        """h_max(r): the share of round r's prompt that any cache could hit."""
        history = r * self.turn_tokens
        return history / (history + self.new_tokens)

    def ceiling_paged(self, r: int) -> float:
        """What a cache of whole pages can hit at most: the history floored to pages."""
        return self.history_pages(r) * self.page_size / self.prompt_tokens(r)

    @property
    def device_pages(self) -> int:
        if self.l1_tokens is not None:
            return self.l1_tokens // self.page_size
        rounds = DEFAULT_L1_ROUNDS if self.l1_rounds is None else self.l1_rounds
        return int(rounds * self.clients * self.turn_tokens) // self.page_size

    @property
    def device_tokens(self) -> int:
        return self.device_pages * self.page_size

    @property
    def l1_rounds_effective(self) -> float:
        """The device pool as rounds of every client's history."""
        return self.device_tokens / (self.clients * self.turn_tokens)

    def validate(self) -> MultiturnSpec:
        def positive_int(name: str, value, minimum: int = 1) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise SettingError(name.replace("-", "_"), f"{value!r} must be an integer >= {minimum}.")

        positive_int("clients", self.clients)
        positive_int("rounds", self.rounds)
        positive_int("new-tokens", self.new_tokens)
        positive_int("output-tokens", self.output_tokens, 0)
        positive_int("page-size", self.page_size)
        positive_int("seed", self.seed, 0)
        if self.concurrency is not None:
            positive_int("concurrency", self.concurrency)
        validate_version(self.sglang_version)
        from hicache_ops.sglang.policy import check_write_policy

        check_write_policy(self.write_policy)
        if self.l1_tokens is not None and self.l1_rounds is not None:
            raise InputError("give --l1-tokens or --l1-rounds, not both.")
        if self.l1_tokens is not None:
            positive_int("l1-tokens", self.l1_tokens, self.page_size)
        if self.l1_rounds is not None and not (math.isfinite(self.l1_rounds) and self.l1_rounds > 0):
            raise SettingError("l1_rounds", f"{self.l1_rounds!r} must be a number above 0.")
        ratio = self.hicache_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 1:
            raise SettingError(
                "hicache_ratio", f"{ratio!r} must be above 1: SGLang needs the host pool larger than the device pool."
            )
        if self.device_pages < 1:
            raise InputError(
                f"the device pool of {self.device_tokens} tokens holds no whole {self.page_size}-token page.",
                hint="Give a larger --l1-tokens or --l1-rounds.",
            )
        largest = self.rounds * self.turn_tokens  # the last round's prompt plus its answer
        if largest // self.page_size > self.device_pages:
            raise InputError(
                f"the device pool of {self.device_tokens} tokens cannot hold round {self.rounds - 1}'s "
                f"prompt and answer of {largest} tokens.",
                hint=f"Give --l1-tokens {largest} or more, or fewer --rounds.",
            )
        if self.clients * self.rounds * self.turn_tokens * 4 > MAX_WORKLOAD_BYTES:
            raise InputError(
                f"{self.clients} clients x {self.rounds} rounds x {self.turn_tokens} tokens is more than "
                f"{MAX_WORKLOAD_BYTES // 2**30} GiB of token ids.",
                hint="Use fewer clients, rounds or tokens per turn.",
            )
        from hicache_ops.sglang.geometry import preset

        preset(self.preset)
        conversation = self.clients * self.rounds * self.turn_tokens
        if not self.accounting_only and conversation > MAX_REAL_BYTES_TOKENS:
            raise InputError(
                f"real-bytes mode moves every page's KV, and {conversation:,} tokens of conversation is more than "
                f"its {MAX_REAL_BYTES_TOKENS:,}-token limit.",
                hint="Pass --accounting-only for this scale, or use fewer --clients, --rounds or tokens per turn.",
            )
        return self

    def engine_spec(self, config: str):
        """The engine builder's description of one configuration (pools by SGLang's rules)."""
        from hicache_ops.engine.builder import EngineSpec
        from hicache_ops.sglang.geometry import preset

        return EngineSpec(
            geometry=preset(self.preset),
            page_size=self.page_size,
            device_tokens=self.device_tokens,
            hicache_ratio=float(self.hicache_ratio),
            write_policy=self.write_policy,
            sglang_version=self.sglang_version,
            enable_l2=config != "l1",
            l3_bandwidth_bytes_s=self.l3_bandwidth_bytes_s,
        )

    @property
    def host_pages(self) -> int:
        """SGLang's host pool: int(device tokens x ratio) // page + 1 pages (docs/host-pool.md#size)."""
        return self.engine_spec("l1_l2").host_layout(mooncake=True).page_num

    def predicted_cliffs(self) -> dict[str, int | None]:
        """The first round whose clients' histories (prompt + answer, whole pages) outgrow a pool.

        L1: the device pool. L1+L2 with write_through: the host pool, which then holds everything
        the device does. L1+L2+L3: L3 is unbounded, no cliff. None: not within the run (or, for
        the other write policies, not predicted).
        """

        def first_over(pages: int) -> int | None:
            for r in range(self.rounds):
                if self.clients * self.history_pages(r + 1) > pages:
                    return r
            return None

        return {
            "l1": first_over(self.device_pages),
            "l1_l2": first_over(self.host_pages) if self.write_policy == "write_through" else None,
            "l1_l2_l3": None,
        }

    def workload(self) -> MultiturnWorkload:
        """The workload as `bench multiturn --json` states it."""
        return MultiturnWorkload(
            clients=self.clients,
            rounds=self.rounds,
            new_tokens=self.new_tokens,
            output_tokens=self.output_tokens,
            page_size=self.page_size,
            seed=self.seed,
            vocab_size=VOCAB_SIZE,
            sglang_version=self.sglang_version,
            preset=self.preset,
            concurrency=self.concurrency,
        )


class MultiturnWorkload(Result):
    """The workload of a `bench multiturn` run."""

    clients: int = Field(description="conversations, each with its own history")
    rounds: int = Field(description="turns per conversation")
    new_tokens: int = Field(description="new question tokens per turn")
    output_tokens: int = Field(description="answer tokens per turn")
    page_size: int = Field(description="tokens per page")
    seed: int = Field(description="seed of the random token ids")
    vocab_size: int = Field(description="token ids are drawn below this")
    sglang_version: str = Field(description="the SGLang release whose rules apply")
    preset: str = Field(description="the model geometry behind the byte counts")
    concurrency: int | None = Field(description="clients whose requests arrive together; `null`: one at a time")


def workload_tokens(spec: MultiturnSpec) -> np.ndarray:
    """(clients, rounds * (new + output)) token ids: client c's whole conversation, turn by turn
    (question, answer, question, ...). Round r sends row[: r*(n+o) + n] and leaves row[: (r+1)*(n+o)]."""
    rng = np.random.default_rng(spec.seed)
    return rng.integers(0, VOCAB_SIZE, size=(spec.clients, spec.rounds * spec.turn_tokens), dtype=np.uint32)
