"""The live key diff: which of a prompt's expected objects a Mooncake master holds, and why not.

For every page, `present` says which expected objects exist; `contiguous_pages` is what SGLang's
`batch_exists` returns over every selected rank (the leading pages whose objects ALL exist; one
missing `_v` ends the prefix, docs/keys.md#batch_exists), and `first_missing` is the object that ends it. When
expected objects are absent, the master's key listing is searched for related objects and each
finding becomes a diagnosis entry:

  incomplete_page  the page that ends the prefix holds some of its objects, not all
  gap              later pages exist but SGLang never reaches them past the first missing one
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
  not_found        none of the above: never written, evicted, lost in a master restart, or gone
                   with the segment of a client that closed

Presence takes one /batch_query_keys per 512 objects; the diagnosis one /get_all_keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import InputError
from .keys import Deployment, KeyReport, expected_keys
from .segments import unreachable_holders
from .store import pages_by_prefix
from ..mooncake.admin import AdminClient
from ..sglang.keys import dcp_topology
from ..sglang.versions import SUPPORTED_VERSIONS, V0_5_14


@dataclass
class LiveDiff:
    master: str
    present: list[list[bool]]
    contiguous_pages: int
    first_missing: str | None
    diagnosis: list[dict] = field(default_factory=list)
    store_keys: int | None = None  # size of the key listing, when the diagnosis needed one

    @property
    def complete(self) -> bool:
        return self.first_missing is None

    def merge_into(self, report_json: dict) -> dict:
        """The inspect-keys JSON with the live fields added (nothing removed or renamed)."""
        for page, present in zip(report_json["pages"], self.present):
            page["present"] = present
        report_json["master"] = self.master
        report_json["contiguous_pages"] = self.contiguous_pages
        report_json["first_missing"] = self.first_missing
        report_json["diagnosis"] = self.diagnosis
        report_json["store_keys"] = self.store_keys
        return report_json


def _leading(flags: Sequence[bool]) -> int:
    n = 0
    for flag in flags:
        if not flag:
            break
        n += 1
    return n


def _namespaces(version: str, extra_key, cache_salt, try_extra_keys, try_cache_salts) -> list[tuple]:
    """Other (extra_key, cache_salt) pairs worth trying; 0.5.14 ignores namespaces entirely."""
    if version == V0_5_14:
        return []
    extras = [extra_key, *try_extra_keys]
    salts = [cache_salt, *try_cache_salts]
    pairs = [(e, s) for e in dict.fromkeys(extras) for s in dict.fromkeys(salts)]
    pairs.append((None, None))
    given = (extra_key, cache_salt if cache_salt != "" else None)
    out = []
    for e, s in pairs:
        key = (e, s if s != "" else None)
        if key != given and key not in out:
            out.append(key)
    return out


def _describe_ns(pair: tuple) -> str:
    e, s = pair
    return f"extra_key={e!r}, cache_salt={s!r}"


def live_diff(
    tokens: Sequence[int],
    page_size: int,
    deployment: Deployment,
    admin: AdminClient,
    *,
    extra_key: str | None = None,
    cache_salt: str | None = None,
    try_extra_keys: Sequence[str] = (),
    try_cache_salts: Sequence[str] = (),
    report: KeyReport | None = None,
) -> LiveDiff:
    """Compare the expected objects of `tokens` with what the master at `admin` holds."""
    if report is None:
        report = expected_keys(tokens, page_size, deployment, extra_key=extra_key, cache_salt=cache_salt)
    pages = report.pages
    flat = report.object_keys
    exists = admin.exists(flat)
    present: list[list[bool]] = []
    at = 0
    for page in pages:
        present.append(exists[at : at + len(page.object_keys)])
        at += len(page.object_keys)
    page_ok = [all(p) for p in present]
    contiguous = _leading(page_ok)
    first_missing = None
    if contiguous < len(pages):
        row = pages[contiguous]
        first_missing = row.object_keys[present[contiguous].index(False)]
    diff = LiveDiff(admin.address, present, contiguous, first_missing)
    readable_prefix = [k for page in pages[:contiguous] for k in page.object_keys]
    diff.diagnosis.extend(unreachable_holders(admin, readable_prefix))
    if first_missing is None:
        return diff

    n = len(pages)
    missing_pages = [i for i in range(contiguous, n) if not page_ok[i]]
    partial = present[contiguous]
    if any(partial):
        have = sum(partial)
        diff.diagnosis.append(
            {
                "kind": "incomplete_page",
                "page": contiguous,
                "present": have,
                "expected": len(partial),
                "missing": [k for k, ok in zip(pages[contiguous].object_keys, partial) if not ok],
                "message": f"page {contiguous} holds {have} of its {len(partial)} objects; "
                f"{first_missing} is missing, so SGLang's batch_exists stops at {contiguous} pages.",
                "hint": "An interrupted write, an object evicted or removed on its own, or one rank that did not write.",
            }
        )
    # Some ranks wrote every missing page and others none: a writer with another TP/PP layout.
    flag_of = dict(zip(flat, exists))
    rank_complete: dict[str, bool] = {}
    for scheme in deployment.schemes():
        label = f"tp{scheme.tp_rank}" + (f"/pp{scheme.pp_rank}" if scheme.pp_size > 1 else "")
        flags = [flag_of.get(k, False) for i in missing_pages for k in scheme.object_keys(pages[i].page_key)]
        rank_complete[label] = all(flags) if flags else False
        if any(flags) and not all(flags):
            rank_complete.pop(label)  # mixed: not a clean rank split
    whole = [r for r, ok in rank_complete.items() if ok]
    none = [r for r, ok in rank_complete.items() if not ok]
    if whole and none and len(whole) + len(none) == len(deployment.schemes()):
        diff.diagnosis.append(
            {
                "kind": "missing_ranks",
                "ranks_present": whole,
                "ranks_missing": none,
                "message": f"every missing page has all objects of rank(s) {', '.join(whole)} and none of "
                f"{', '.join(none)}: the writer ran another TP/PP layout (its rank 0 objects even share names "
                "with this deployment's but hold another head split).",
                "hint": "Share L3 only between deployments with the same tp/pp sizes (or page_head with tp_lcm_size).",
            }
        )
    later = [i for i in range(contiguous + 1, n) if page_ok[i]]
    if later:
        diff.diagnosis.append(
            {
                "kind": "gap",
                "pages": len(later),
                "first": later[0],
                "message": f"{len(later)} later page(s) (from page {later[0]}) are complete, but SGLang "
                f"never reads past the first missing page {contiguous}.",
                "hint": "Those pages are dead weight in L3 until the gap is rewritten.",
            }
        )

    # -- related objects, from one listing ------------------------------------------------------
    schemes = deployment.schemes()
    expected_prefix = report.key_prefix
    expected_suffixes = [s for scheme in schemes for s in scheme.suffixes]
    expected_set = set(expected_suffixes)
    page_keys = [p.page_key for p in pages]
    wanted = set(page_keys)

    alternates: list[tuple[str, str, Deployment, list[str], str]] = []  # kind, label, deployment, keys, detail
    for other in SUPPORTED_VERSIONS:
        if other == deployment.version:
            continue
        dep = _with_version(deployment, other)
        try:
            keys_other = [p.page_key for p in expected_keys(tokens, page_size, dep, extra_key=extra_key, cache_salt=cache_salt).pages]
        except InputError:
            continue
        alternates.append(("other_version", other, dep, keys_other, f"SGLang {other}"))
    for pair in _namespaces(deployment.version, extra_key, cache_salt, try_extra_keys, try_cache_salts):
        keys_ns = [p.page_key for p in expected_keys(tokens, page_size, deployment, extra_key=pair[0], cache_salt=pair[1]).pages]
        alternates.append(("other_namespace", _describe_ns(pair), deployment, keys_ns, _describe_ns(pair)))
    for *_, keys_alt, _ in alternates:
        wanted.update(keys_alt)

    listing = admin.get_all_keys()
    diff.store_keys = len(listing)
    index = pages_by_prefix(listing, wanted)
    listed = set(listing)
    found_any = False

    # Same page keys under other prefixes.
    by_prefix: Counter[str] = Counter()
    suffixes_by_prefix: dict[str, set[str]] = {}
    for i in missing_pages:
        for prefix, suffixes in index.get(page_keys[i], {}).items():
            if prefix != expected_prefix:
                by_prefix[prefix] += 1
                suffixes_by_prefix.setdefault(prefix, set()).update(suffixes)
    # A prefix that is exactly what the other SGLang version names these pages with is a version
    # mismatch (reported below as other_version), not a model-name or tag mismatch.
    version_prefixes = {dep.schemes()[0].prefix for kind, _, dep, keys_alt, _ in alternates
                        if kind == "other_version" and keys_alt == page_keys}
    for prefix in version_prefixes:
        by_prefix.pop(prefix, None)
    # A 0.5.14 reader prefixes with the tag only: when 0.5.23 computes the same page keys, another
    # prefix is a 0.5.23 writer's model prefix, which is a version mismatch first.
    newer_same_keys = [dep for kind, _, dep, keys_alt, _ in alternates
                       if kind == "other_version" and keys_alt == page_keys and dep.version != deployment.version
                       and deployment.version == V0_5_14]
    runs = {p: _leading([expected_set <= index.get(k, {}).get(p, set()) for k in page_keys]) for p in by_prefix}
    for prefix in sorted(by_prefix, key=lambda p: (-runs[p], -by_prefix[p], p)):
        count, run = by_prefix[prefix], runs[prefix]
        found = sorted(suffixes_by_prefix[prefix])
        same = set(found) == expected_set
        found_any = True
        topology = dcp_topology(prefix)
        if topology is not None and deployment.dcp_size == 1:
            diff.diagnosis.append(_dcp_entry(prefix, topology, count, found, deployment, page_keys, index))
        elif newer_same_keys:
            newer = newer_same_keys[0].version
            diff.diagnosis.append(
                {
                    "kind": "other_version",
                    "sglang_version": newer,
                    "prefix": prefix,
                    "pages": count,
                    "contiguous_pages": run,
                    "message": f"{count} missing page(s) exist under the prefix {prefix!r}, the model prefix SGLang {newer} "
                    f"adds and {deployment.version} never writes; contiguous {run}.",
                    "hint": f"The writer ran SGLang {newer}: pass --sglang-version {newer} and its --model-name "
                    f"(and --extra-backend-tag) so the prefix is {prefix!r}.",
                }
            )
            continue
        diff.diagnosis.append(
            {
                "kind": "other_prefix",
                "prefix": prefix,
                "pages": count,
                "contiguous_pages": run,
                "suffixes": found,
                "message": f"{count} missing page(s) exist under the prefix {prefix or '(none)'!r} instead of "
                f"{expected_prefix or '(none)'!r}"
                + ("" if same else f" (with suffixes {', '.join(found)})")
                + f"; with that prefix the contiguous prefix would be {run} pages.",
                "hint": _prefix_hint(prefix, deployment),
            }
        )

    # Same page keys and prefix, other suffixes: MLA vs MHA, or other ranks.
    other_suffixes: Counter[str] = Counter()
    for i in missing_pages:
        for suffix in index.get(page_keys[i], {}).get(expected_prefix, set()) - expected_set:
            other_suffixes[suffix] += 1
    if other_suffixes:
        found_any = True
        if deployment.mla:
            # An MLA writer leaves one K per page; an MHA writer K and V pairs.
            if any(s.endswith("_v") for s in other_suffixes):
                mha = sorted(s for s in other_suffixes if s.endswith("_v") or s[:-2] + "_v" in other_suffixes)
                diff.diagnosis.append(
                    {
                        "kind": "mla_vs_mha",
                        "found": mha,
                        "pages": max(other_suffixes[s] for s in mha),
                        "message": f"the page keys exist with MHA suffixes ({', '.join(mha)}: K and V per rank), "
                        f"but an MLA deployment writes one {expected_suffixes[0]} object per page.",
                        "hint": "Drop --mla: the writer ran an MHA model.",
                    }
                )
                for suffix in mha:
                    other_suffixes.pop(suffix)
        elif "__k" in other_suffixes:
            diff.diagnosis.append(
                {
                    "kind": "mla_vs_mha",
                    "found": ["__k"],
                    "pages": other_suffixes.pop("__k"),
                    "message": "the page keys exist with the MLA suffix `__k` (one object per page), but an MHA "
                    f"deployment writes {', '.join(expected_suffixes)}.",
                    "hint": "Pass --mla: the writer ran an MLA model (only tp rank 0 writes).",
                }
            )
        if other_suffixes:
            diff.diagnosis.append(
                {
                    "kind": "other_rank",
                    "found": sorted(other_suffixes),
                    "expected": expected_suffixes,
                    "pages": max(other_suffixes.values()),
                    "message": f"the page keys exist under the expected prefix with rank suffixes "
                    f"{', '.join(sorted(other_suffixes))}, not {', '.join(expected_suffixes)}.",
                    "hint": "Check --tp-size/--tp-rank/--pp-size/--pp-rank (and --tp-lcm-size with page_head) against the writer.",
                }
            )

    # The other version's scheme, other namespaces.
    for kind, label, dep, keys_alt, detail in alternates:
        if keys_alt == page_keys and dep.schemes()[0].prefix == expected_prefix:
            continue  # identical object names: nothing to tell apart
        alt_schemes = dep.schemes()
        flags = []
        for key in keys_alt:
            objects = [o for s in alt_schemes for o in s.object_keys(key)]
            flags.append(all(o in listed for o in objects))
        have = sum(flags)
        if have == 0:
            continue
        found_any = True
        run = _leading(flags)
        entry = {
            "kind": kind,
            "pages": have,
            "contiguous_pages": run,
            "prefix": alt_schemes[0].prefix,
        }
        if kind == "other_version":
            entry["sglang_version"] = label
            entry["message"] = (
                f"{have} page(s) exist as SGLang {label} names them (prefix {alt_schemes[0].prefix or '(none)'!r}"
                f"{', page keys without the namespace seed' if keys_alt != page_keys else ''}); contiguous {run}."
            )
            entry["hint"] = f"The writer ran SGLang {label}: pass --sglang-version {label}."
        else:
            entry["namespace"] = detail
            entry["message"] = f"{have} page(s) exist under the namespace {detail}; contiguous {run}."
            entry["hint"] = "The request carried another extra_key / cache_salt than the one given here."
        diff.diagnosis.append(entry)

    absent = [i for i in missing_pages if not any(present[i])]
    if absent and not found_any:
        diff.diagnosis.append(
            {
                "kind": "not_found",
                "pages": len(absent),
                "first": absent[0],
                "message": f"{len(absent)} page(s) have none of their objects, and no related object exists under any "
                "prefix, rank, version or namespace tried.",
                "hint": "Never written (write policy, e.g. write_through_selective needs a second hit), evicted, "
                "lost in a master restart, or gone with the segment of a client that closed; "
                "--try-extra-key / --try-cache-salt test other namespaces.",
            }
        )
    return diff


def _with_version(dep: Deployment, version: str) -> Deployment:
    return replace(dep, version=version)


def _dcp_entry(prefix: str, topology: dict, count: int, found: list[str], dep: Deployment,
               page_keys: list[str], index: dict) -> dict:
    """The diagnosis for pages a DCP deployment wrote, looked up without DCP."""
    dcp, tp = topology["dcp_size"], topology["tp_size"]
    run = None  # attention CP shards are not modelled here: no prefix computed for them
    if topology["attn_cp_size"] == 1:
        writer = replace(dep, mla=True, tp_size=tp, tp_rank=None, pp_size=topology["pp_size"], pp_rank=None,
                         dcp_size=dcp, dcp_rank=None, page_size=topology["page_size"], version="0.5.23")
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
        return "The writer used no prefix: drop --model-name and --extra-backend-tag (or it ran SGLang 0.5.14 without a tag)."
    parts = prefix[:-1]
    if dep.extra_backend_tag and parts.startswith(f"{dep.extra_backend_tag}_"):
        return f"Same tag, other model: pass --model-name matching {parts[len(dep.extra_backend_tag) + 1:]!r} ('/' is written as '-')."
    return (
        f"Pass the writer's --model-name and/or --extra-backend-tag so the prefix is {prefix!r} "
        "(0.5.23 joins tag and model with '_' and writes '/' as '-')."
    )

