"""A serve's side pools as its /v1/stats config reports them, and the check that flags given to a
client command (warm, prefetch) name the same pools (docs/side-pools.md#side-objects-in-the-engine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache_ops.errors import InputError
from hicache_ops.sglang.side_pool_specs import PoolSpec, parse_pool, side_pools_for


def side_pools_of_serve(config: dict[str, Any]) -> tuple[PoolSpec, ...]:
    """The side pools a serve instance writes (from its /v1/stats config)."""
    return tuple(parse_pool(p["spec"]) for p in config.get("side_pools", ()))


def check_side_pools(config: dict[str, Any], pool_texts: Sequence[str] = (), pool_preset: str | None = None) -> None:
    """`--pool`/`--pool-preset` given with a serve must name the serve's own side pools."""
    if not pool_texts and pool_preset is None:
        return
    mla = config["geometry"]["attention"] == "mla"
    wanted = side_pools_for(pool_texts, pool_preset, config["sglang_version"], mla, config["page_size"])
    have = side_pools_of_serve(config)
    # Compared by what names and gates the objects (to_text), not by host-pool shape options.
    if [p.to_text() for p in wanted] != [p.to_text() for p in have]:
        raise InputError(
            f"the side pools given ({', '.join(p.to_text() for p in wanted)}) differ from the serve's "
            f"({', '.join(p.to_text() for p in have) or 'none'}); the serve writes and reads its own.",
            hint="Drop --pool/--pool-preset, or start the serve with them.",
        )
