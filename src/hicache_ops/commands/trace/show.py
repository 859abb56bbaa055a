"""`hicache trace show`: summarise what a tap recording says about a live server's storage calls.

    summary = summarise(load_records(["/tmp/hicache-tap.jsonl"]))
    summary.methods["batch_get_v1"]["latency_ms"]["p99"]
    summary.keys["verdict"]

The recording is JSON Lines written by `hicache_ops.commands.tap.recording` (one object per call, format `v` 1,
see the README). A line that is not a JSON object with a string `method` is an input error (exit 2)
naming the file and line: a recording that cannot be read whole is not summarised in part.

Sections of the summary:
- methods: calls, errors, pages, bytes and latency percentiles per method;
- ranks: the same per (tp, pp, dp) rank;
- queries: each batch_exists's storage-hit prefix (pages asked, pages hit) and their totals;
- failures: calls that raised, reads and writes with failed pages (the first failing key and the
  Mooncake codes of its objects);
- keys: page keys written vs read -- did reads find what writes wrote, which read keys were never
  written in this recording -- and the same for Mooncake object keys when the tap recorded them.
Page keys do not depend on the rank, object keys do: the object view is the exact one.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hicache_ops.commands.tap.recording import META_METHODS, QUERY_METHODS, READ_METHODS, WRITE_METHODS
from hicache_ops.errors import InputError

if TYPE_CHECKING:
    from hicache_ops.commands.trace.show_result import TapSummary

PERCENTILES = (50, 90, 99)
LIST_CAP = 20  # keys listed per category (counts are always complete)
NOT_FOUND = -704  # Mooncake OBJECT_NOT_FOUND


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _bad_line(path: str, lineno: int, why: str) -> InputError:
    return InputError(
        f"{path} line {lineno} is not a tap record: {why}.",
        hint="A recording holds one JSON object per line as `hicache tap` writes it; remove or repair that line.",
    )


def load_records(paths: Sequence[str | Path]) -> list[dict]:
    """Every record of every file, each tagged with `_file` and `_line`; InputError on a bad line."""
    if not paths:
        raise InputError("no recording given.", hint="hicache trace show /tmp/hicache-tap.jsonl")
    records: list[dict] = []
    for p in paths:
        path = str(p)
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            raise InputError(
                f"the recording {path!r} does not exist.",
                hint="Use the path `hicache tap` printed (per rank: .tpN before .jsonl).",
            ) from None
        except OSError as exc:
            raise InputError(
                f"cannot read the recording {path!r}: {exc.strerror}.", hint="Check the path and its permissions."
            ) from None
        before = len(records)
        with handle:
            for lineno, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _bad_line(path, lineno, "not UTF-8 text") from None
                try:
                    rec = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise _bad_line(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(rec, dict):
                    raise _bad_line(path, lineno, f"a JSON {type(rec).__name__}, not an object")
                if not isinstance(rec.get("method"), str):
                    raise _bad_line(path, lineno, "no string field 'method'")
                for field, kinds in (("keys", list), ("objects", dict), ("latency_ms", (int, float))):
                    if field in rec and rec[field] is not None and not isinstance(rec[field], kinds):
                        raise _bad_line(path, lineno, f"field {field!r} has the wrong type")
                rec["_file"], rec["_line"] = path, lineno
                records.append(rec)
        if len(records) == before:
            # The tap writes an "open" record when a rank loads it: an empty file was never written by one.
            raise InputError(
                f"the recording {path!r} is empty: no tap has written to it.",
                hint="Check that the server was launched with the flags `hicache tap` prints, and the path it printed.",
            )
    records.sort(key=lambda r: (r.get("ts") or 0.0, r.get("pid") or 0, r.get("seq") or 0))
    return records


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def latency_stats(values: Sequence[float]) -> dict:
    out = {f"p{q}": _r(percentile(values, q)) for q in PERCENTILES}
    out["max"] = _r(max(values)) if values else None
    out["mean"] = _r(sum(values) / len(values)) if values else None
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def rank_label(rec: Mapping) -> str:
    label = f"tp{rec.get('tp_rank', 0)}"
    if (rec.get("pp_size") or 1) > 1 or rec.get("pp_rank"):
        label += f".pp{rec.get('pp_rank', 0)}"
    if rec.get("dp_rank"):
        label += f".dp{rec.get('dp_rank')}"
    return label


def _page_flags(rec: Mapping) -> list[bool] | None:
    """Per-page success of a read or write, from its result."""
    result = rec.get("result")
    if isinstance(result, list):
        return [bool(x) for x in result]
    if isinstance(result, dict):  # v2: the KV pool's flags, else pages where every pool succeeded
        if isinstance(result.get("kv"), list):
            return [bool(x) for x in result["kv"]]
        cols = [v for v in result.values() if isinstance(v, list)]
        if cols:
            return [all(bool(c[i]) if i < len(c) else False for c in cols) for i in range(max(map(len, cols)))]
    if isinstance(result, bool):  # set/get: one key; batch_set: one verdict for every key
        return [result] * max(1, len(rec.get("keys") or []))
    if rec.get("method") == "get" and result is not None and rec.get("error") is None:
        return [bool(result)]
    return None


def _capped(items: Iterable[str]) -> list[str]:
    return sorted(items)[:LIST_CAP]


# ---------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------


def summarise(records: Sequence[Mapping], files: Sequence[str] | None = None) -> TapSummary:
    storage = [r for r in records if r["method"] not in META_METHODS]
    meta = [r for r in records if r["method"] in META_METHODS]

    # -- sources -------------------------------------------------------------------------------
    opens = [r for r in meta if r["method"] == "open"]
    ts = [r["ts"] for r in records if isinstance(r.get("ts"), (int, float))]
    source = {
        "files": list(files) if files is not None else sorted({r["_file"] for r in records}),
        "records": len(records),
        "storage_calls": len(storage),
        "pids": sorted({r["pid"] for r in records if r.get("pid") is not None}),
        "ranks": sorted({rank_label(r) for r in records}),
        "first_ts": min(ts) if ts else None,
        "last_ts": max(ts) if ts else None,
        "span_s": _r(max(ts) - min(ts)) if ts else None,
        "opens": [
            {
                "rank": rank_label(r),
                "pid": r.get("pid"),
                "model_name": r.get("model_name"),
                "key_prefix": r.get("key_prefix"),
                "sglang_version": r.get("sglang_version"),
                "master": (r.get("mooncake") or {}).get("master_server_address"),
                "error": r.get("error"),
            }
            for r in opens
        ],
        "host_pools": [
            {"rank": rank_label(r), **(r.get("host_pool") or {}), "error": r.get("error")}
            for r in meta
            if r["method"] == "register_mem_pool_host"
        ],
    }

    # -- per method and per rank ---------------------------------------------------------------
    def method_table(recs: Iterable[Mapping]) -> dict:
        groups: dict[str, list[Mapping]] = defaultdict(list)
        for r in recs:
            groups[r["method"]].append(r)
        out = {}
        for name in sorted(groups):
            rs = groups[name]
            lat = [float(r["latency_ms"]) for r in rs if isinstance(r.get("latency_ms"), (int, float))]
            out[name] = {
                "calls": len(rs),
                "errors": sum(1 for r in rs if r.get("error")),
                "pages": sum(int(r.get("pages") or 0) for r in rs),
                "bytes": sum(int(r.get("bytes") or 0) for r in rs),
                "latency_ms": latency_stats(lat),
            }
        return out

    methods = method_table(storage)
    by_rank: dict[str, list[Mapping]] = defaultdict(list)
    for r in storage:
        by_rank[rank_label(r)].append(r)
    ranks = {label: method_table(rs) for label, rs in sorted(by_rank.items())}

    # -- storage-hit prefix per query ----------------------------------------------------------
    query_list = []
    for r in storage:
        if r["method"] not in QUERY_METHODS or r.get("error"):
            continue
        asked = int(r.get("pages") or len(r.get("keys") or []))
        hit = r.get("hit_pages")
        if hit is None and isinstance(r.get("result"), int):
            hit = r["result"]
        if hit is None:
            continue
        query_list.append(
            {
                "seq": r.get("seq"),
                "ts": r.get("ts"),
                "rank": rank_label(r),
                "method": r["method"],
                "pages": asked,
                "hit_pages": int(hit),
                "first_key": (r.get("keys") or [None])[0],
            }
        )
    asked_total = sum(q["pages"] for q in query_list)
    hit_total = sum(q["hit_pages"] for q in query_list)
    queries = {
        "count": len(query_list),
        "full_hits": sum(1 for q in query_list if q["pages"] and q["hit_pages"] == q["pages"]),
        "partial_hits": sum(1 for q in query_list if 0 < q["hit_pages"] < q["pages"]),
        "misses": sum(1 for q in query_list if q["hit_pages"] == 0),
        "pages_asked": asked_total,
        "pages_hit": hit_total,
        "hit_ratio": _r(hit_total / asked_total) if asked_total else None,
        "per_query": query_list,
    }

    # -- failures ------------------------------------------------------------------------------
    failures = []
    for r in storage:
        entry = {
            "seq": r.get("seq"),
            "ts": r.get("ts"),
            "rank": rank_label(r),
            "method": r["method"],
            "file": r["_file"],
            "line": r["_line"],
        }
        if r.get("error"):
            failures.append({**entry, "kind": "raised", "detail": r["error"]})
            continue
        if r["method"] in READ_METHODS or r["method"] in WRITE_METHODS:
            flags = _page_flags(r)
            if flags is None or all(flags):
                continue
            keys = r.get("keys") or []
            failed = [i for i, ok in enumerate(flags) if not ok]
            first = keys[failed[0]] if failed and failed[0] < len(keys) else None
            codes = _object_codes_for(r, first)
            failures.append(
                {
                    **entry,
                    "kind": "read_failed" if r["method"] in READ_METHODS else "write_failed",
                    "pages": len(flags),
                    "failed_pages": len(failed),
                    "first_failed_index": failed[0],
                    "first_failed_key": first,
                    "object_codes": codes,
                    "detail": _failure_detail(r["method"] in READ_METHODS, codes),
                }
            )
    failure_counts = Counter(f["kind"] for f in failures)

    from hicache_ops.commands.trace.show_result import TapFailures, TapSource, TapSummary

    return TapSummary(
        source=TapSource(**source),
        methods=methods,
        ranks=ranks,
        queries=queries,
        failures=TapFailures(count=len(failures), by_kind=dict(failure_counts), failed=failures),
        keys=_key_analysis(storage),
    )


def _object_codes_for(rec: Mapping, page_key: str | None) -> dict[str, int]:
    """Mooncake return codes of the objects of one page key (from the tap's object notes)."""
    if not page_key:
        return {}
    out: dict[str, int] = {}
    for kind in ("exist", "put", "get"):
        for entry in (rec.get("objects") or {}).get(kind, []):
            for key, code in zip(entry.get("keys") or [], entry.get("codes") or [], strict=False):
                if page_key in key:
                    out[f"{kind}:{key}"] = code
    return out


def _failure_detail(read: bool, codes: Mapping[str, int]) -> str:
    bad = {k: c for k, c in codes.items() if (k.startswith("get:") and c <= 0) or (k.startswith("put:") and c != 0)}
    if not bad:
        return "no object detail recorded" if not codes else "objects answered, page still reported failed"
    if read and all(c == NOT_FOUND for c in bad.values()):
        return f"its {len(bad)} object(s) not found (-704): never written, evicted, or their segment is gone"
    return "object codes " + ", ".join(f"{k.split(':', 1)[1]}={c}" for k, c in sorted(bad.items()))


def _key_analysis(storage: Sequence[Mapping]) -> dict:
    written: set[str] = set()  # page keys a write reported stored
    write_failed: set[str] = set()
    read_ok: set[str] = set()
    read_failed: set[str] = set()
    queried_hit: set[str] = set()
    queried_miss: set[str] = set()
    # time order: a read "found what writes wrote" only if the write came first
    written_before: set[str] = set()
    found_after_write: set[str] = set()
    failed_after_write: set[str] = set()

    for r in storage:
        if r.get("error"):
            continue
        m = r["method"]
        keys = [str(k) for k in (r.get("keys") or [])]
        if m in WRITE_METHODS:
            flags = _page_flags(r)
            if flags is None:
                continue
            for k, ok in zip(keys, flags, strict=False):
                (written if ok else write_failed).add(k)
                if ok:
                    written_before.add(k)
        elif m in READ_METHODS:
            flags = _page_flags(r)
            if flags is None:
                continue
            for k, ok in zip(keys, flags, strict=False):
                if ok:
                    read_ok.add(k)
                    if k in written_before:
                        found_after_write.add(k)
                else:
                    read_failed.add(k)
                    if k in written_before:
                        failed_after_write.add(k)
        elif m in QUERY_METHODS:
            hit = r.get("hit_pages")
            if not isinstance(hit, int):
                continue
            queried_hit.update(keys[:hit])
            queried_miss.update(keys[hit : hit + 1])  # the page that ended the prefix

    read_any = read_ok | read_failed
    pages = {
        "written": len(written),
        "write_failed": len(write_failed - written),
        "read_ok": len(read_ok),
        "read_failed": len(read_failed - read_ok),
        "read_ok_written_here": len(read_ok & written),
        "read_ok_written_before_read": len(found_after_write),
        "read_ok_not_written_here": len(read_ok - written),
        "read_failed_after_write": len(failed_after_write - read_ok),
        "read_never_written": len(read_any - written),
        "written_never_read": len(written - read_any),
        "queried_hit": len(queried_hit),
        "queried_hit_written_here": len(queried_hit & written),
        "queried_prefix_breaks": len(queried_miss),
        "lists": {
            "read_never_written": _capped(read_any - written),
            "read_failed_after_write": _capped(failed_after_write - read_ok),
            "written_never_read": _capped(written - read_any),
            "queried_prefix_breaks_written_here": _capped(queried_miss & written),
        },
    }
    objects = _object_analysis(storage)

    if not written and not read_any:
        verdict = "no page was written or read in this recording"
    elif not written:
        verdict = f"no write in this recording; {len(read_ok)} page(s) read from earlier writes or other writers"
    elif not read_any:
        verdict = f"{len(written)} page(s) written, none read back in this recording"
    elif found_after_write and not failed_after_write - read_ok:
        verdict = (
            f"yes: reads found {len(found_after_write)} of the {len(written)} page(s) writes wrote, "
            "and no read of a written page failed"
        )
    elif found_after_write:
        verdict = (
            f"partly: reads found {len(found_after_write)} written page(s), but "
            f"{len(failed_after_write - read_ok)} written page(s) failed to read"
        )
    elif failed_after_write:
        verdict = f"no: {len(failed_after_write)} written page(s) were read and every such read failed"
    else:
        verdict = "no read asked for a page written in this recording"
    return {"pages": pages, "objects": objects, "verdict": verdict}


def _object_analysis(storage: Sequence[Mapping]) -> dict | None:
    """Exact object-key view from the tap's client notes (None when the tap did not record objects)."""
    put_ok: set[str] = set()
    present_at_set: set[str] = set()
    get_ok: set[str] = set()
    get_failed: Counter = Counter()
    seen = False
    for r in storage:
        objs = r.get("objects")
        if not isinstance(objs, dict):
            continue
        seen = True
        is_write = r["method"] in WRITE_METHODS
        for entry in objs.get("put", []):
            for k, c in zip(entry.get("keys") or [], entry.get("codes") or [], strict=False):
                if c == 0:
                    put_ok.add(k)
        if is_write:
            for entry in objs.get("exist", []):
                for k, c in zip(entry.get("keys") or [], entry.get("codes") or [], strict=False):
                    if c == 1:
                        present_at_set.add(k)
        for entry in objs.get("get", []):
            for k, c in zip(entry.get("keys") or [], entry.get("codes") or [], strict=False):
                if isinstance(c, int) and c > 0:
                    get_ok.add(k)
                else:
                    get_failed[k] = c
    if not seen:
        return None
    failed = set(get_failed) - get_ok
    codes = Counter(get_failed[k] for k in failed)
    return {
        "put": len(put_ok),
        "present_at_set": len(present_at_set - put_ok),
        "get_ok": len(get_ok),
        "get_ok_put_here": len(get_ok & put_ok),
        "get_failed": len(failed),
        "get_failed_put_here": len(failed & put_ok),
        "get_failed_codes": {str(c): n for c, n in sorted(codes.items())},
        "lists": {
            "get_failed_put_here": _capped(failed & put_ok),
            "get_failed_never_put": _capped(failed - put_ok - present_at_set),
        },
    }


def show(paths: Sequence[str | Path]) -> TapSummary:
    """Load and summarise; the library call behind `hicache trace show`."""
    files = [str(p) for p in paths]
    return summarise(load_records(files), files)
