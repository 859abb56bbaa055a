"""What every diagnosis of the live key diff reads (diagnoses.py): a prompt's expected objects,
their presence on the master, the prefix SGLang computes from it, and, fetched on first use, the
master's key listing with the alternates worth searching in it (the other SGLang version's names,
other extra_key / cache_salt namespaces)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from hicache_ops.commands.inspect.key_listing import KeyReport, PageRow, expected_keys
from hicache_ops.commands.inspect.store_listing import pages_by_prefix
from hicache_ops.errors import InputError
from hicache_ops.mooncake.admin import AdminClient
from hicache_ops.sglang.hit_policy import LoadablePrefix
from hicache_ops.sglang.page_keys import Deployment, ObjectKeyScheme
from hicache_ops.sglang.versions import SUPPORTED_VERSIONS, V0_5_14, family

# An (extra_key, cache_salt) pair; None for either: not set.
Namespace = tuple[str | None, str | None]
# (kind, label, deployment, page keys, detail) of one alternate naming worth searching.
Alternate = tuple[str, str, Deployment, list[str], str]


def _namespaces(
    version: str,
    extra_key: str | None,
    cache_salt: str | None,
    try_extra_keys: Sequence[str],
    try_cache_salts: Sequence[str],
) -> list[Namespace]:
    """Other (extra_key, cache_salt) pairs worth trying; 0.5.14 ignores namespaces entirely."""
    if family(version) == V0_5_14:
        return []
    extras = [extra_key, *try_extra_keys]
    salts = [cache_salt, *try_cache_salts]
    pairs = [(e, s) for e in dict.fromkeys(extras) for s in dict.fromkeys(salts)]
    pairs.append((None, None))
    given = (extra_key, cache_salt if cache_salt != "" else None)
    out: list[Namespace] = []
    for e, s in pairs:
        key = (e, s if s != "" else None)
        if key != given and key not in out:
            out.append(key)
    return out


def _describe_ns(pair: Namespace) -> str:
    e, s = pair
    return f"extra_key={e!r}, cache_salt={s!r}"


@dataclass(kw_only=True)
class Lookup:
    """What every diagnosis reads: the expected objects, their presence, the prefix SGLang computes,
    and (fetched on first use) the master's key listing with the alternates worth searching."""

    tokens: Sequence[int]
    page_size: int
    deployment: Deployment
    admin: AdminClient
    report: KeyReport
    present: list[list[bool]]
    prefix: LoadablePrefix
    first_missing: str | None
    extra_key: str | None = None
    cache_salt: str | None = None
    try_extra_keys: Sequence[str] = ()
    try_cache_salts: Sequence[str] = ()
    _listing: list[str] | None = None
    _alternates: list[Alternate] | None = None

    @property
    def pages(self) -> list[PageRow]:
        return self.report.pages

    @property
    def page_keys(self) -> list[str]:
        return [p.page_key for p in self.report.pages]

    @property
    def kv_contiguous(self) -> int:
        return self.prefix.kv_pages

    @property
    def schemes(self) -> list[ObjectKeyScheme]:
        return self.deployment.schemes(every_rank=bool(self.report.pools))

    def kv_present(self, page: int) -> list[tuple[str, bool]]:
        row = self.pages[page]
        return [
            (k, ok)
            for k, ok, pool in zip(row.object_keys, self.present[page], row.object_pools, strict=True)
            if pool == "kv"
        ]

    def kv_ok(self, page: int) -> bool:
        return all(ok for _, ok in self.kv_present(page))

    @property
    def missing_pages(self) -> list[int]:
        """Pages from the KV prefix on that lack a KV object."""
        return [i for i in range(self.kv_contiguous, len(self.pages)) if not self.kv_ok(i)]

    @property
    def kv_suffixes(self) -> list[str]:
        return list(dict.fromkeys(s for scheme in self.schemes for s in scheme.suffixes))

    def alternates(self) -> list[Alternate]:
        """(kind, label, deployment, page keys, detail) of the other version and namespaces."""
        if self._alternates is None:
            dep = self.deployment
            out: list[Alternate] = []
            self.same_naming_releases: list[str] = []  # other releases that name these objects alike
            # Releases that name this prompt's objects alike form one alternate, labelled by the
            # newest of them (0.5.17..0.5.19 write what 0.5.17 writes); the reader's own naming is none.
            own = (dep.schemes()[0].prefix, tuple(self.page_keys))
            groups: dict[tuple[str, tuple[str, ...]], list[tuple[str, Deployment]]] = {}
            for other in SUPPORTED_VERSIONS:
                if other == dep.version:
                    continue
                alt = _with_version(dep, other)
                try:
                    keys = expected_keys(
                        self.tokens, self.page_size, alt, extra_key=self.extra_key, cache_salt=self.cache_salt
                    )
                except InputError:
                    continue
                naming = (alt.schemes()[0].prefix, tuple(p.page_key for p in keys.pages))
                if naming != own:
                    groups.setdefault(naming, []).append((other, alt))
                else:
                    self.same_naming_releases.append(other)
            for (_, keys_alt), releases in groups.items():
                names = [v for v, _ in releases]
                span = names[0] if len(names) == 1 else f"{names[0]} to {names[-1]}"
                out.append(("other_version", names[-1], releases[-1][1], list(keys_alt), f"SGLang {span}"))
            for pair in _namespaces(
                dep.version, self.extra_key, self.cache_salt, self.try_extra_keys, self.try_cache_salts
            ):
                keys = expected_keys(self.tokens, self.page_size, dep, extra_key=pair[0], cache_salt=pair[1])
                out.append(
                    ("other_namespace", _describe_ns(pair), dep, [p.page_key for p in keys.pages], _describe_ns(pair))
                )
            self._alternates = out
        return self._alternates

    @property
    def listing_size(self) -> int | None:
        """How many keys the listing held; None when no diagnosis fetched it."""
        return None if self._listing is None else len(self._listing)

    def listing(self) -> list[str]:
        """The master's whole key listing, fetched once."""
        if self._listing is None:
            self._listing = self.admin.get_all_keys()
        return self._listing

    def index(self) -> dict[str, dict[str, set[str]]]:
        """page key -> prefix -> suffixes in the listing, for this prompt's and the alternates' page keys."""
        wanted = set(self.page_keys)
        for *_, keys, _ in self.alternates():
            wanted.update(keys)
        return pages_by_prefix(self.listing(), wanted)


def _with_version(dep: Deployment, version: str) -> Deployment:
    return replace(dep, version=version)
