"""Request traces for `hicache bench replay`: two line formats, one request list in arrival order.

`mooncake` (the FAST'25 trace release, docs/workloads.md#mooncake-fast25-trace): `timestamp` (ms),
`input_length`, `output_length` and `hash_ids`, one id per 512-token block of the prompt; an id
names its whole prefix, so equal ids at equal positions are a reusable prefix. Each id becomes 512
deterministic token ids derived from the id alone (a partial last block takes the first
`input_length mod 512` of them): equal ids give equal tokens, so SGLang's chained page keys of two
prompts agree exactly as far as their ids do.

`tokens`: `input_ids` (and optional `timestamp`, `output_length`, `extra_key`, `cache_salt`).

Requests are replayed in timestamp order (a stable sort: file order breaks ties); requests with one
timestamp form one arrival group. Pure library: numpy only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hicache_ops.errors import InputError, SettingError

FORMATS: tuple[str, ...] = ("mooncake", "tokens")
# Tokens per hash id in the FAST'25 trace release.
MOONCAKE_BLOCK_TOKENS = 512
# Derived token ids stay below this (a typical vocabulary size), as real prompts do.
VOCAB_SIZE = 32000
# Refuse prompts longer than this: far past any served context length, most likely a broken line.
MAX_PROMPT_TOKENS = 2**24


@dataclass(slots=True)
class TraceRequest:
    line: int  # 1-based line in the file
    timestamp: float  # ms
    input_length: int
    output_length: int
    hash_ids: list[int] | None = None  # mooncake format
    input_ids: np.ndarray | None = None  # tokens format
    extra_key: str | None = None
    cache_salt: str | None = None

    def block_ids(self) -> list[int]:
        """The block ids of a mooncake-format request (its parser sets them on every line)."""
        if self.hash_ids is None:
            raise ValueError(f"trace line {self.line} is in the tokens format: it has no hash_ids")
        return self.hash_ids

    def token_ids(self) -> np.ndarray:
        """The prompt tokens of a tokens-format request (its parser sets them on every line)."""
        if self.input_ids is None:
            raise ValueError(f"trace line {self.line} is in the mooncake format: it has no input_ids")
        return self.input_ids


@dataclass
class Trace:
    path: str
    format: str
    requests: list[TraceRequest]  # in arrival order

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    def groups(self) -> Iterator[list[TraceRequest]]:
        """Requests that arrive together (one timestamp), in arrival order."""
        group: list[TraceRequest] = []
        for request in self.requests:
            if group and request.timestamp != group[0].timestamp:
                yield group
                group = []
            group.append(request)
        if group:
            yield group

    def head(self, n: int) -> Trace:
        return Trace(self.path, self.format, self.requests[:n])


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_trace(path: str, fmt: str | None = None, limit: int | None = None) -> Trace:
    """Read a JSONL trace; `fmt` None picks `mooncake` when the first request carries `hash_ids`.

    `limit` keeps the first `limit` requests of the file (before sorting). Every malformed line is
    an InputError naming the file and line.
    """
    if fmt is not None and fmt not in FORMATS:
        raise SettingError("format", f"{fmt!r} is unknown.", hint=f"Use one of: {', '.join(FORMATS)}.")
    if not os.path.isfile(path):
        raise InputError(f"the trace {path} does not exist or is not a file.")
    requests: list[TraceRequest] = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if limit is not None and len(requests) >= limit:
                    break
                if not text.strip():
                    continue
                where = f"{path} line {number}"
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where} is not valid JSON ({exc.msg}).") from None
                if not isinstance(obj, dict):
                    raise InputError(f"{where} is not a JSON object.")
                if fmt is None:
                    fmt = "mooncake" if "hash_ids" in obj else "tokens"
                parse = _parse_mooncake if fmt == "mooncake" else _parse_tokens
                requests.append(parse(obj, number, where))
    except UnicodeDecodeError:
        raise InputError(f"the trace {path} is not UTF-8 text.") from None
    except OSError as exc:
        raise InputError(f"the trace {path} cannot be read: {exc.strerror}.") from None
    if not requests:
        raise InputError(f"the trace {path} holds no requests.")
    requests.sort(key=lambda r: r.timestamp)
    return Trace(path, fmt or "mooncake", requests)


def _field_int(obj: dict, name: str, where: str, minimum: int, default: int | None = None) -> int:
    value = obj.get(name, default)
    if value is None:
        raise InputError(f"{where} has no {name!r}.")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}: {name!r} is {value!r}, not an integer >= {minimum}.")
    return value


def _timestamp(obj: dict, where: str) -> float:
    value = obj.get("timestamp", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: 'timestamp' is {value!r}, not a number of milliseconds >= 0.")
    return float(value)


def _namespace(obj: dict, name: str, where: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{where}: {name!r} is {value!r}, not a string.")
    return value


def _parse_mooncake(obj: dict, number: int, where: str) -> TraceRequest:
    if "hash_ids" not in obj:
        raise InputError(
            f"{where} has no 'hash_ids' (the mooncake format needs them).",
            hint="Pass --format tokens for lines with input_ids.",
        )
    length = _field_int(obj, "input_length", where, 1)
    if length > MAX_PROMPT_TOKENS:
        raise InputError(f"{where}: 'input_length' {length} is more than {MAX_PROMPT_TOKENS} tokens.")
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
        raise InputError(f"{where}: 'hash_ids' must be a list of integers >= 0.")
    blocks = -(-length // MOONCAKE_BLOCK_TOKENS)
    if len(ids) != blocks:
        raise InputError(
            f"{where}: {len(ids)} hash_ids for input_length {length}, which needs {blocks} "
            f"blocks of {MOONCAKE_BLOCK_TOKENS} tokens."
        )
    return TraceRequest(
        number, _timestamp(obj, where), length, _field_int(obj, "output_length", where, 0, 0), hash_ids=ids
    )


def _parse_tokens(obj: dict, number: int, where: str) -> TraceRequest:
    ids = obj.get("input_ids")
    if ids is None:
        raise InputError(
            f"{where} has no 'input_ids' (the tokens format needs them).",
            hint="Pass --format mooncake for lines with hash_ids.",
        )
    if not isinstance(ids, list) or not ids or not all(type(t) is int and 0 <= t < 2**32 for t in ids):
        raise InputError(f"{where}: 'input_ids' must be a non-empty list of token ids in 0..2**32-1.")
    if len(ids) > MAX_PROMPT_TOKENS:
        raise InputError(f"{where}: {len(ids)} input_ids is more than {MAX_PROMPT_TOKENS} tokens.")
    return TraceRequest(
        number,
        _timestamp(obj, where),
        len(ids),
        _field_int(obj, "output_length", where, 0, 0),
        input_ids=np.asarray(ids, dtype=np.uint32),
        extra_key=_namespace(obj, "extra_key", where),
        cache_salt=_namespace(obj, "cache_salt", where),
    )


# ---------------------------------------------------------------------------------------------
# Block ids -> tokens
# ---------------------------------------------------------------------------------------------


def _mix32(x: np.ndarray) -> np.ndarray:
    """A 32-bit finaliser (in place on a uint32 array): nearby inputs give unrelated outputs."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def block_tokens(block_ids: np.ndarray) -> np.ndarray:
    """(len(block_ids), 512) uint32 token ids: row i depends only on block_ids[i].

    Token j of id b is mix(seed(b) x A + j x B) mod VOCAB_SIZE, in 32-bit arithmetic (8x faster
    than 64-bit at 22M tokens). seed(b) is b's low 32 bits, xor-ed with the mixed high bits for
    ids past 2**32; A is odd, so ids below 2**32 get distinct seeds and so distinct rows.
    """
    ids = np.asarray(block_ids, dtype=np.uint64).reshape(-1, 1)
    high = _mix32((ids >> np.uint64(32)).astype(np.uint32))
    seeds = (ids & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ high
    positions = np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint32).reshape(1, -1)
    with np.errstate(over="ignore"):
        mixed = _mix32(seeds * np.uint32(0x9E3779B1) + positions * np.uint32(0x85EBCA77))
    return mixed % np.uint32(VOCAB_SIZE)


class TokenSource:
    """The prompt tokens of a trace's requests, each block's row derived once.

    Mooncake format: every distinct id's 512 tokens live in one table (about 2 KiB per id); a
    prompt is its ids' rows laid end to end, cut to `input_length`.
    """

    def __init__(self, trace: Trace):
        self.format = trace.format
        if trace.format != "mooncake":
            return
        ids = np.fromiter((i for r in trace.requests for i in r.block_ids()), dtype=np.int64)
        distinct, rows = np.unique(ids, return_inverse=True)
        self._table = block_tokens(distinct)
        # Read-only: a one-block prompt is a view of its row, never a copy (prompts are only read).
        self._table.flags.writeable = False
        self._rows: dict[int, np.ndarray | int] = {}
        start = 0
        for request in trace.requests:
            end = start + len(request.block_ids())
            self._rows[request.line] = int(rows[start]) if end - start == 1 else rows[start:end]
            start = end

    def block_rows(self, request: TraceRequest) -> list[int] | int:
        """A mooncake request's rows of the block table, in prompt order (an int: one block)."""
        rows = self._rows[request.line]
        return rows if isinstance(rows, int) else rows.tolist()

    def block(self, row: int) -> np.ndarray:
        """The 512 tokens of one row of the block table (a read-only view)."""
        return self._table[row]

    def tokens(self, request: TraceRequest) -> np.ndarray:
        if request.input_ids is not None:
            return request.input_ids
        rows = self._rows[request.line]
        if isinstance(rows, int):  # one block (a page-reference stream): its row as it is
            return self._table[rows][: request.input_length]
        return self._table[rows].reshape(-1)[: request.input_length]
