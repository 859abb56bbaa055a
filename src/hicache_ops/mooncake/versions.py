"""The Mooncake release the master's formats were measured with, and the one installed here.

Read from package metadata only: importing `mooncake` would load its native library into
`hicache --version`.
"""

from __future__ import annotations

from importlib import metadata

# docs/mooncake.md: the admin API's responses and the master's behaviour were measured with it.
MEASURED = "0.3.13.post1"
# Both wheels provide the module `mooncake`; a host has one of them.
DISTRIBUTIONS: tuple[str, ...] = ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda")


def installed() -> tuple[str, str] | None:
    """(distribution, version) of the installed Mooncake wheel, or None when there is none."""
    for name in DISTRIBUTIONS:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None
