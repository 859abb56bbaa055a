"""Supported SGLang versions and how the default one is chosen.

Keys differ between versions, so the version is always explicit in the library; the CLI's
default is the installed sglang when its metadata is readable (without importing it), else the
newest supported version.
"""

from __future__ import annotations

from importlib import metadata

from hicache_ops.errors import InputError

V0_5_14 = "0.5.14"
V0_5_23 = "0.5.23"
SUPPORTED_VERSIONS: tuple[str, ...] = (V0_5_14, V0_5_23)
NEWEST = V0_5_23


def validate_version(version: str) -> str:
    """Return `version` if supported, else raise an InputError naming the choices."""
    if version not in SUPPORTED_VERSIONS:
        raise InputError(
            f"SGLang version {version!r} is not supported.",
            hint=f"Use one of: {', '.join(SUPPORTED_VERSIONS)}.",
        )
    return version


def default_version() -> str:
    """The installed sglang's version when it is a supported one, else the newest supported.

    Reads the package metadata only: importing sglang would pull torch into `--help`.
    """
    try:
        installed = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return NEWEST
    return installed if installed in SUPPORTED_VERSIONS else NEWEST
