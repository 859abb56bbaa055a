"""The diagnoses of the live key diff (live_diff.py): why a prompt's objects are missing from the
master. Each is one function that reads the `Lookup` (live_lookup.py) and the entries reported before
it, and returns its own entries; DIAGNOSES runs them in report order. The kinds a live diff reports
(all but unreachable_segment, which live_diff.py asks segments.py for, come from here):

  incomplete_page  the page that ends the prefix holds some of its objects, not all
  gap              later pages exist but SGLang never reaches them past the first missing one
  side_pool_missing  a page's KV objects exist but a side pool's do not (pool, pages, effect)
  other_prefix     the same page keys under another prefix (model name or extra_backend_tag)
  dcp              the same page keys under a 0.5.23 DCP prefix (`..._tp{t}_dcp{d}_page{p}_pp{q}_cp{c}_`)
                   while the lookup had no DCP (docs/keys.md#dcp)
  mla_vs_mha       the same page keys with the other attention kind's suffixes (`__k` vs `_0_k/_0_v`)
  other_rank       the same page keys for tp/pp ranks other than the expected ones
  missing_ranks    every missing page has all objects of some expected ranks and none of the
                   others (a writer with a smaller TP/PP layout)
  other_version    the objects the other SGLang version would write (prefix and/or page keys)
  other_namespace  the page keys of another extra_key / cache_salt (0.5.23 seeds the chain)
  unreachable_segment  objects SGLang would read are present, but the segment holding them is
                   unreachable from here (segments.py)
  not_found        no KV object and none of the above: never written, evicted, lost in a master restart, or gone
                   with the segment of a client that closed
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hicache_ops.commands.inspect.live_lookup import Lookup
from hicache_ops.errors import InputError
from hicache_ops.sglang import hit_policy
from hicache_ops.sglang.page_keys import Deployment, dcp_topology, model_in_prefix
from hicache_ops.sglang.versions import V0_5_14, family

_leading = hit_policy.leading


def incomplete_page(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page that ends the KV prefix holds some of its KV objects, not all."""
    at = lookup.kv_contiguous
    if at >= len(lookup.pages):
        return []
    objects = lookup.kv_present(at)
    have = sum(ok for _, ok in objects)
    if not have:
        return []
    return [
        {
            "kind": "incomplete_page",
            "page": at,
            "present": have,
            "expected": len(objects),
            "missing": [k for k, ok in objects if not ok],
            "message": f"page {at} holds {have} of its {len(objects)} objects; "
            f"{lookup.first_missing} is missing, so SGLang's batch_exists stops at {at} pages.",
            "hint": "An interrupted write, an object evicted or removed on its own, or one rank that did not write.",
        }
    ]


def missing_ranks(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Some ranks wrote every missing page and others none: a writer with another TP/PP layout."""
    missing = lookup.missing_pages
    # A DCP prefix names the tp and pp sizes, so another layout cannot share it: a missing shard is
    # a lost object, which incomplete_page reports (docs/keys.md#dcp).
    if not missing or lookup.deployment.dcp_size > 1:
        return []
    flag_of = {
        k: ok
        for row, flags in zip(lookup.pages, lookup.present, strict=True)
        for k, ok in zip(row.object_keys, flags, strict=True)
    }
    rank_complete: dict[str, bool] = {}
    schemes = lookup.schemes
    for scheme in schemes:
        label = f"tp{scheme.tp_rank}" + (f"/pp{scheme.pp_rank}" if scheme.pp_size > 1 else "")
        flags = [flag_of.get(k, False) for i in missing for k in scheme.object_keys(lookup.pages[i].page_key)]
        rank_complete[label] = all(flags) if flags else False
        if any(flags) and not all(flags):
            rank_complete.pop(label)  # mixed: not a clean rank split
    whole = [r for r, ok in rank_complete.items() if ok]
    none = [r for r, ok in rank_complete.items() if not ok]
    if not (whole and none and len(whole) + len(none) == len(schemes)):
        return []
    return [
        {
            "kind": "missing_ranks",
            "ranks_present": whole,
            "ranks_missing": none,
            "message": f"every missing page has all objects of rank(s) {', '.join(whole)} and none of "
            f"{', '.join(none)}: the writer ran another TP/PP layout (its rank 0 objects even share names "
            "with this deployment's but hold another head split).",
            "hint": "Share L3 only between deployments with the same tp/pp sizes (or page_head with tp_lcm_size).",
        }
    ]


def gap(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later pages hold their KV objects but SGLang never reads past the first missing one."""
    at = lookup.kv_contiguous
    later = [i for i in range(at + 1, len(lookup.pages)) if lookup.kv_ok(i)]
    if at >= len(lookup.pages) or not later:
        return []
    return [
        {
            "kind": "gap",
            "pages": len(later),
            "first": later[0],
            "message": f"{len(later)} later page(s) (from page {later[0]}) are complete, but SGLang "
            f"never reads past the first missing page {at}.",
            "hint": "Those pages are dead weight in L3 until the gap is rewritten.",
        }
    ]


def side_pool_missing(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KV present, a side pool's objects missing: one entry per pool, naming its pages."""
    out = []
    for pool in lookup.report.pools:
        pages: list[int] = []
        missing_first: list[str] = []
        for i in range(lookup.kv_contiguous):
            row = lookup.pages[i]
            gone = [
                k
                for k, ok, name in zip(row.object_keys, lookup.present[i], row.object_pools, strict=True)
                if name == pool.name and not ok
            ]
            if gone:
                pages.append(i)
                missing_first = missing_first or gone
        if not pages:
            continue
        served = lookup.prefix.pool_hit_pages.get(pool.name, 0)
        window = (
            f"the last {pool.trailing_pages} page(s) before a stop point"
            if pool.trailing_pages
            else "every page of the prefix"
        )
        effect = (
            f"this pool alone serves {served} of the {lookup.kv_contiguous} KV pages"
            if pool.trailing_pages is None or family(lookup.deployment.version) == V0_5_14
            else f"this pool alone can stop at {served} at most; SGLang loads {lookup.prefix.pages} pages "
            f"(restorable stop points: {_ranges(lookup.prefix.restorable or [])})"
        )
        out.append(
            {
                "kind": "side_pool_missing",
                "pool": pool.name,
                "hit_policy": pool.hit_policy,
                "trailing_pages": pool.trailing_pages,
                "pages": pages,
                "page": pages[0],
                "missing": missing_first,
                "pool_hit_pages": served,
                "message": f"the KV objects of page {pages[0]} are present but its {pool.name} object(s) "
                f"{', '.join(missing_first)} are missing ({len(pages)} page(s) in all); {pool.name} needs {window}: "
                f"{effect}.",
                "hint": "The side pool was written by another configuration (no speculative/hybrid pools, another "
                "conv/temporal shape or window), its write failed, or its objects were evicted on their own.",
            }
        )
    return out


def other_prefix(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same page keys under another prefix (model name, tag, or a DCP topology)."""
    missing = lookup.missing_pages
    if not missing:
        return []
    index, page_keys, expected = lookup.index(), lookup.page_keys, lookup.report.key_prefix
    kv_set = set(lookup.kv_suffixes)
    by_prefix: Counter[str] = Counter()
    suffixes_by_prefix: dict[str, set[str]] = {}
    for i in missing:
        for prefix, suffixes in index.get(page_keys[i], {}).items():
            if prefix != expected:
                by_prefix[prefix] += 1
                suffixes_by_prefix.setdefault(prefix, set()).update(suffixes)
    # A prefix that is exactly how the other SGLang version names these pages is a version mismatch
    # (reported by other_version_or_namespace), not a model-name or tag mismatch.
    same_keys_other_version = [
        dep
        for kind, _, dep, keys_alt, _ in lookup.alternates()
        if kind == "other_version" and keys_alt == page_keys and dep.schemes()[0].prefix != expected
    ]
    for dep in same_keys_other_version:
        by_prefix.pop(dep.schemes()[0].prefix, None)
    # A reader before 0.5.17 prefixes with the tag only: when a release that adds the model name
    # computes the same page keys, another prefix is that writer's model prefix, a version mismatch
    # first. The newest such release is named (with the model name left out, it names alike).
    newer: list[str] = []
    if not model_in_prefix(lookup.deployment.version):
        keyed = [dep.version for dep in same_keys_other_version if model_in_prefix(dep.version)]
        newer = (keyed or [v for v in lookup.same_naming_releases if model_in_prefix(v)])[-1:]
    runs = {p: _leading([kv_set <= index.get(k, {}).get(p, set()) for k in page_keys]) for p in by_prefix}
    out = []
    for prefix in sorted(by_prefix, key=lambda p: (-runs[p], -by_prefix[p], p)):
        count, run = by_prefix[prefix], runs[prefix]
        found = sorted(suffixes_by_prefix[prefix])
        topology = dcp_topology(prefix)
        if topology is not None and lookup.deployment.dcp_size == 1:
            out.append(_dcp_entry(prefix, topology, count, found, lookup.deployment, page_keys, index))
            continue
        if newer:
            out.append(
                {
                    "kind": "other_version",
                    "sglang_version": newer[0],
                    "prefix": prefix,
                    "pages": count,
                    "contiguous_pages": run,
                    "message": f"{count} missing page(s) exist under the prefix {prefix!r}, the model prefix SGLang "
                    f"{newer[0]} adds and {lookup.deployment.version} never writes; contiguous {run}.",
                    "hint": f"The writer ran SGLang {newer[0]}: pass --sglang-version {newer[0]} and its --model-name "
                    f"(and --extra-backend-tag) so the prefix is {prefix!r}.",
                }
            )
            continue
        out.append(
            {
                "kind": "other_prefix",
                "prefix": prefix,
                "pages": count,
                "contiguous_pages": run,
                "suffixes": found,
                "message": f"{count} missing page(s) exist under the prefix {prefix or '(none)'!r} instead of "
                f"{expected or '(none)'!r}"
                + ("" if set(found) == kv_set else f" (with suffixes {', '.join(found)})")
                + f"; with that prefix the contiguous prefix would be {run} pages.",
                "hint": _prefix_hint(prefix, lookup.deployment),
            }
        )
    return out


def other_suffixes(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same page keys and prefix with other suffixes: the other attention kind, or other ranks."""
    missing = lookup.missing_pages
    if not missing:
        return []
    index, page_keys = lookup.index(), lookup.page_keys
    expected = lookup.kv_suffixes
    known = set(expected)
    found: Counter[str] = Counter()
    for i in missing:
        for suffix in index.get(page_keys[i], {}).get(lookup.report.key_prefix, set()) - known:
            found[suffix] += 1
    out = []
    if lookup.deployment.mla:
        # An MLA writer leaves one K per page; an MHA writer K and V pairs.
        if any(s.endswith("_v") for s in found):
            mha = sorted(s for s in found if s.endswith("_v") or s[:-2] + "_v" in found)
            out.append(
                {
                    "kind": "mla_vs_mha",
                    "found": mha,
                    "pages": max(found[s] for s in mha),
                    "message": f"the page keys exist with MHA suffixes ({', '.join(mha)}: K and V per rank), "
                    f"but an MLA deployment writes one {expected[0]} object per page.",
                    "hint": "Drop --mla: the writer ran an MHA model.",
                }
            )
            for suffix in mha:
                found.pop(suffix)
    elif "__k" in found:
        out.append(
            {
                "kind": "mla_vs_mha",
                "found": ["__k"],
                "pages": found.pop("__k"),
                "message": "the page keys exist with the MLA suffix `__k` (one object per page), but an MHA "
                f"deployment writes {', '.join(expected)}.",
                "hint": "Pass --mla: the writer ran an MLA model (only tp rank 0 writes).",
            }
        )
    if found:
        out.append(
            {
                "kind": "other_rank",
                "found": sorted(found),
                "expected": expected,
                "pages": max(found.values()),
                "message": f"the page keys exist under the expected prefix with rank suffixes "
                f"{', '.join(sorted(found))}, not {', '.join(expected)}.",
                "hint": "Check --tp-size/--tp-rank/--pp-size/--pp-rank (and --tp-lcm-size with page_head) against "
                "the writer.",
            }
        )
    return out


def other_version_or_namespace(lookup: Lookup, _: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects the other SGLang version, or another extra_key / cache_salt, would write."""
    if not lookup.missing_pages:
        return []
    listed = set(lookup.listing())
    out = []
    for kind, label, dep, keys_alt, detail in lookup.alternates():
        alt_schemes = dep.schemes()
        if keys_alt == lookup.page_keys and alt_schemes[0].prefix == lookup.report.key_prefix:
            continue  # identical object names: nothing to tell apart
        flags = [all(o in listed for s in alt_schemes for o in s.object_keys(key)) for key in keys_alt]
        have = sum(flags)
        if have == 0:
            continue
        run = _leading(flags)
        entry = {"kind": kind, "pages": have, "contiguous_pages": run, "prefix": alt_schemes[0].prefix}
        if kind == "other_version":
            entry["sglang_version"] = label
            entry["sglang_releases"] = detail.removeprefix("SGLang ")
            entry["message"] = (
                f"{have} page(s) exist as {detail} name them (prefix {alt_schemes[0].prefix or '(none)'!r}"
                f"{', page keys without the namespace seed' if keys_alt != lookup.page_keys else ''}); contiguous "
                f"{run}."
            )
            entry["hint"] = f"The writer ran {detail}: pass --sglang-version {label}."
        else:
            entry["namespace"] = detail
            entry["message"] = f"{have} page(s) exist under the namespace {detail}; contiguous {run}."
            entry["hint"] = "The request carried another extra_key / cache_salt than the one given here."
        out.append(entry)
    return out


_RELATED = {"other_prefix", "dcp", "mla_vs_mha", "other_rank", "other_version", "other_namespace"}


def not_found(lookup: Lookup, so_far: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pages with none of their KV objects, and nothing related found anywhere."""
    absent = [i for i in lookup.missing_pages if not any(ok for _, ok in lookup.kv_present(i))]
    if not absent or any(entry["kind"] in _RELATED for entry in so_far):
        return []
    return [
        {
            "kind": "not_found",
            "pages": len(absent),
            "first": absent[0],
            "message": f"{len(absent)} page(s) have none of their KV objects, and no related object exists under any "
            "prefix, rank, version or namespace tried.",
            "hint": "Never written (write policy, e.g. write_through_selective needs a second hit), evicted, "
            "lost in a master restart, or gone with the segment of a client that closed; "
            "--try-extra-key / --try-cache-salt test other namespaces.",
        }
    ]


# In report order; a new diagnosis is one more function here.
DIAGNOSES = (
    incomplete_page,
    missing_ranks,
    gap,
    side_pool_missing,
    other_prefix,
    other_suffixes,
    other_version_or_namespace,
    not_found,
)


def _ranges(stops: list[int]) -> str:
    """1,2,3,5 -> "1-3, 5"; "none" when empty."""
    runs: list[list[int]] = []
    for stop in stops:
        if runs and stop == runs[-1][-1] + 1:
            runs[-1].append(stop)
        else:
            runs.append([stop])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs) or "none"


def _dcp_entry(
    prefix: str,
    topology: dict[str, Any],
    count: int,
    found: list[str],
    dep: Deployment,
    page_keys: list[str],
    index: dict[str, Any],
) -> dict[str, Any]:
    """The diagnosis for pages a DCP deployment wrote, looked up without DCP."""
    dcp, tp = topology["dcp_size"], topology["tp_size"]
    run = None  # attention CP shards are not modelled here: no prefix computed for them
    if topology["attn_cp_size"] == 1:
        writer = replace(
            dep,
            mla=True,
            tp_size=tp,
            tp_rank=None,
            pp_size=topology["pp_size"],
            pp_rank=None,
            dcp_size=dcp,
            dcp_rank=None,
            page_size=topology["page_size"],
            version="0.5.23",
        )
        try:
            wanted = {s for scheme in writer.schemes() for s in scheme.suffixes}
        except InputError:  # a topology SGLang itself would refuse (e.g. tp not a multiple of DCP)
            wanted = None
        if wanted is not None:
            run = _leading([wanted <= index.get(k, {}).get(prefix, set()) for k in page_keys])
    return {
        "kind": "dcp",
        "prefix": prefix,
        "pages": count,
        "contiguous_pages": run,
        "suffixes": found,
        "topology": topology,
        "message": f"{count} missing page(s) exist under the DCP prefix {prefix!r} (SGLang 0.5.23, MLA, "
        f"tp {tp}, DCP {dcp}, logical page {topology['page_size']}, pp {topology['pp_size']}, "
        f"cp {topology['attn_cp_size']}; one object per DCP shard: {', '.join(found)}), but these keys were "
        "looked up without DCP"
        + (f"; with DCP the contiguous prefix would be {run} pages." if run is not None else "."),
        "hint": f"Pass --mla --tp-size {tp} --dcp-size {dcp} --page-size {topology['page_size']}.",
    }


def _prefix_hint(prefix: str, dep: Deployment) -> str:
    if dep.dcp_size > 1 and dcp_topology(prefix) is None:
        return (
            f"The writer ran without DCP (no tp..._dcp..._page..._pp..._cp... part in its prefix): "
            f"drop --dcp-size {dep.dcp_size} to look its keys up."
        )
    if dcp_topology(prefix) is not None:
        return f"The writer ran another DCP topology ({dcp_topology(prefix)}): pass its tp, DCP and page sizes."
    if not prefix:
        return (
            "The writer used no prefix: drop --model-name and --extra-backend-tag "
            "(or it ran SGLang 0.5.14 without a tag)."
        )
    parts = prefix[:-1]
    if dep.extra_backend_tag and parts.startswith(f"{dep.extra_backend_tag}_"):
        other = parts[len(dep.extra_backend_tag) + 1 :]
        return f"Same tag, other model: pass --model-name matching {other!r} ('/' is written as '-')."
    return (
        f"Pass the writer's --model-name and/or --extra-backend-tag so the prefix is {prefix!r} "
        "(0.5.23 joins tag and model with '_' and writes '/' as '-')."
    )
