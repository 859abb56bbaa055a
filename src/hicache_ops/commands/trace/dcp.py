"""What a trace shows of 0.5.23 decode context parallel: per page, which DCP rank holds which tokens
and under which object key, and which shard a missing object belongs to (docs/keys.md#dcp).

Token i of a logical page belongs to DCP rank i % dcp_size (SGLang interleaves tokens, one at a
time); tp rank r holds shard r % dcp_size, and the ranks of the first DCP group (tp_rank ==
dcp_rank) write its object.
"""

from __future__ import annotations

from hicache_ops.sglang.page_keys import ObjectKeyScheme


def dcp_size_of(schemes: list[ObjectKeyScheme]) -> int:
    return schemes[0].dcp_size if schemes else 1


def shard_positions(page: int, page_size: int, dcp_size: int, dcp_rank: int) -> list[int]:
    """Prompt positions of the tokens DCP rank `dcp_rank` holds of page `page` (its rows in order)."""
    start = page * page_size
    return list(range(start + dcp_rank, start + page_size, dcp_size))


def _shard_bytes(cache, tp_rank: int) -> int | None:
    ranks = getattr(cache.plane, "ranks", None)
    if ranks is None:  # the accounting plane has no pools
        return None
    return ranks[tp_rank].host_layout.page_objects(0)[0].size


def shard_table(cache, tokens, depths: list[int], page_keys: list[str]) -> list[dict]:
    """Per page: every DCP shard's tokens (positions and ids), object key, writer and readers."""
    schemes = cache.l3.schemes
    dcp, ps = dcp_size_of(schemes), cache.config.page_size
    by_shard: dict[int, list[ObjectKeyScheme]] = {}
    for s in schemes:
        by_shard.setdefault(s.dcp_rank, []).append(s)
    out = []
    for depth, key in zip(depths, page_keys, strict=True):
        shards = []
        for d in range(dcp):
            ranks = by_shard.get(d, [])
            writers = [s.tp_rank for s in ranks if s.writes]
            positions = shard_positions(depth, ps, dcp, d)
            shards.append(
                {
                    "dcp_rank": d,
                    "token_positions": positions,
                    "token_ids": [int(tokens[p]) for p in positions],
                    "object_key": ranks[0].object_keys(key)[0] if ranks else None,
                    "writer_tp_ranks": writers,
                    "reader_tp_ranks": [s.tp_rank for s in ranks],
                    "bytes": _shard_bytes(cache, ranks[0].tp_rank) if ranks else None,
                }
            )
        out.append({"page": depth, "page_key": key, "shards": shards})
    return out


def shard_summary(cache) -> str:
    schemes = cache.l3.schemes
    dcp, ps = dcp_size_of(schemes), cache.config.page_size
    size = _shard_bytes(cache, schemes[0].tp_rank)
    writers = sorted({s.tp_rank for s in schemes if s.writes})
    return (
        f"DCP {dcp}: token i of each {ps}-token page goes to DCP rank i % {dcp} ({ps // dcp} tokens"
        + (f", {size} bytes" if size is not None else "")
        + f" per shard object); tp ranks {writers} write one shard each, tp rank r reads shard r % {dcp}"
    )


def missing_shards(schemes: list[ObjectKeyScheme], rank_hits: list[int], page_keys: list[str]) -> list[dict]:
    """The shards whose object ends the contiguous prefix: per DCP rank, its first missing page and key."""
    hit = min(rank_hits)
    if hit >= len(page_keys):
        return []
    out: dict[int, dict] = {}
    for scheme, count in zip(schemes, rank_hits, strict=True):
        if count != hit:
            continue
        entry = out.setdefault(
            scheme.dcp_rank,
            {
                "dcp_rank": scheme.dcp_rank,
                "page": hit,
                "object_key": scheme.object_keys(page_keys[hit])[0],
                "tp_ranks": [],
            },
        )
        entry["tp_ranks"].append(scheme.tp_rank)
    return [out[d] for d in sorted(out)]


def describe_missing(entries: list[dict]) -> str:
    return "; ".join(
        f"DCP rank {e['dcp_rank']}'s object of page {e['page']} is missing ({e['object_key']}), "
        f"read by tp rank(s) {', '.join(map(str, e['tp_ranks']))}"
        for e in entries
    )


def explain_missing(
    schemes: list[ObjectKeyScheme], rank_hits: list[int], page_keys: list[str], first_page: int
) -> tuple[str, list[dict], list[str]]:
    """For a batch_exists that stops short under DCP: a clause for the step's summary naming the DCP
    rank(s) whose shard object ends the prefix, the entries (absolute page numbers) and a cause line.
    Empty without DCP."""
    if dcp_size_of(schemes) == 1 or not rank_hits:
        return "", [], []
    entries = missing_shards(schemes, rank_hits, page_keys)
    for entry in entries:
        entry["page"] += first_page
    if not entries:
        return "", [], []
    ranks = ", ".join(str(e["dcp_rank"]) for e in entries)
    return f"; page {entries[0]['page']} misses the shard of DCP rank(s) {ranks}", entries, [describe_missing(entries)]
