"""The SGLang releases the toolkit knows, how a version string is read, and how the default is chosen.

Every release from 0.5.14 to 0.5.23 is known, post releases included (docs/releases.md). Rules
that changed between releases are keyed by release ranges with `since(version, "0.5.17")`, one
place per rule (docs/releases.md names the release and SGLang file of each). A version older
than 0.5.14 is refused; a newer one (0.5.24+) gets the newest rules and a warning in `notes`.

Rules not yet keyed by range use `family(version)`: 0.5.14's rules through 0.5.18 (the
HiRadixCache releases), 0.5.23's from 0.5.19 (the UnifiedRadixCache releases).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from importlib import metadata

from hicache_ops.errors import InputError

V0_5_14 = "0.5.14"
V0_5_23 = "0.5.23"
RELEASES: tuple[str, ...] = (
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
)
SUPPORTED_VERSIONS = RELEASES
OLDEST = V0_5_14
NEWEST = V0_5_23
# The first release whose plain models run on UnifiedRadixCache (docs/releases.md#tree).
UNIFIED_TREE_SINCE = "0.5.19"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?(?:[.+-].*)?$")


@functools.lru_cache(maxsize=256)
def parse(version: str) -> tuple[int, int, int, int]:
    """(major, minor, micro, post) of a release string such as 0.5.15.post1; InputError otherwise.
    Memoized (the engine asks it on every request); a refused string raises each time."""
    match = _VERSION.match(str(version).strip())
    if match is None:
        raise InputError(
            f"SGLang version {version!r} is not a release number.",
            hint=f"Pass one such as {OLDEST} or {NEWEST} (post releases like 0.5.15.post1 too).",
        )
    major, minor, micro, post = match.groups()
    return int(major), int(minor), int(micro), int(post or 0)


@functools.lru_cache(maxsize=1024)
def since(version: str, release: str) -> bool:
    """Whether `version` is `release` or newer (the rule changed in `release`). Memoized: the
    engine's policy rules ask it on every request."""
    return parse(version) >= parse(release)


@dataclass(frozen=True)
class VersionChoice:
    """The release whose rules apply, what was asked for, why, and any warning for the output."""

    version: str
    requested: str | None
    reason: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"version": self.version, "requested": self.requested, "reason": self.reason, "notes": self.notes}


def resolve_version(version: str, *, reason: str = "--sglang-version") -> VersionChoice:
    """The rules for `version`: a known release as is; an unknown post release of a known one
    takes that release's rules with a note; 0.5.24+ the newest rules with a warning; older than
    0.5.14 is an InputError."""
    key = parse(version)
    if key < parse(OLDEST):
        raise InputError(
            f"SGLang {version} is older than {OLDEST}, the oldest release the toolkit knows.",
            hint=f"Known releases: {', '.join(RELEASES)}.",
        )
    for release in RELEASES:
        if parse(release) == key:
            return VersionChoice(release, version, reason)
    if key > parse(NEWEST):
        return VersionChoice(
            NEWEST,
            version,
            reason,
            [
                f"warning: SGLang {version} is newer than {NEWEST}, the newest release the toolkit knows; "
                f"{NEWEST}'s rules are applied and may be wrong for it (docs/releases.md)."
            ],
        )
    base = max((r for r in RELEASES if parse(r) <= key), key=parse)
    return VersionChoice(
        base,
        version,
        reason,
        [
            f"warning: SGLang {version} is not a release the toolkit knows; the rules of {base}, "
            "the newest known release before it, are applied (docs/releases.md)."
        ],
    )


@functools.lru_cache(maxsize=256)
def validate_version(version: str) -> str:
    """The release whose rules apply to `version` (see resolve_version); InputError if refused.
    Memoized: the engine asks it on every request, and the answer depends on the string alone."""
    return resolve_version(version).version


def family(version: str) -> str:
    """0.5.14 or 0.5.23: the two rule sets for what is not yet keyed by release range."""
    return V0_5_23 if since(validate_version(version), UNIFIED_TREE_SINCE) else V0_5_14


def installed_version() -> str | None:
    """The installed sglang's version from its metadata (importing it would pull torch into --help)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def default_choice() -> VersionChoice:
    """The version used when none is given: the installed sglang's, said so; else the newest, said why."""
    installed = installed_version()
    if installed is None:
        return VersionChoice(
            NEWEST,
            None,
            "default",
            [f"warning: no --sglang-version and no sglang installed: {NEWEST}'s rules are applied."],
        )
    try:
        choice = resolve_version(installed, reason="installed sglang")
    except InputError:
        return VersionChoice(
            NEWEST,
            installed,
            "default",
            [
                f"warning: the installed sglang {installed} is not a release the toolkit knows (0.5.14+): "
                f"{NEWEST}'s rules are applied; pass --sglang-version to choose."
            ],
        )
    return VersionChoice(
        choice.version,
        installed,
        "installed sglang",
        [f"no --sglang-version: the installed sglang {installed} chose {choice.version}'s rules.", *choice.notes],
    )


def default_version() -> str:
    """The release whose rules apply when no version is given (default_choice() says why)."""
    return default_choice().version


def choose(version: str | None) -> VersionChoice:
    """`--sglang-version` when given (resolved), else the default, with the reason either way."""
    return resolve_version(version) if version else default_choice()
