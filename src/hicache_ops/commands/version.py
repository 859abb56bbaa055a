"""`hicache --version [--json]`: hicache-ops' version, the SGLang releases it knows and the Mooncake
release it was measured with, beside what is installed (read from package metadata: nothing heavy
is imported, pydantic included; the `--json` model is in `version_result`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VersionFacts:
    hicache_ops: str
    sglang_supported: tuple[str, ...]
    sglang_default: str
    sglang_installed: str | None
    mooncake_measured: str
    mooncake_installed: tuple[str, str] | None  # (distribution, version)

    def text(self) -> str:
        """The three lines `hicache --version` prints."""
        wheel = self.mooncake_installed
        return (
            f"hicache-ops {self.hicache_ops}\n"
            f"SGLang {', '.join(self.sglang_supported)} (default {self.sglang_default}; "
            f"{'installed ' + self.sglang_installed if self.sglang_installed else 'not installed'})\n"
            f"Mooncake {self.mooncake_measured} (measured; "
            f"{'installed ' + wheel[0] + ' ' + wheel[1] if wheel else 'not installed'})"
        )


def version_facts() -> VersionFacts:
    """hicache-ops' version, the SGLang releases it knows, and the Mooncake release (metadata only)."""
    from importlib import metadata

    from hicache_ops import __version__
    from hicache_ops.mooncake import versions as mooncake_versions
    from hicache_ops.sglang.versions import SUPPORTED_VERSIONS, default_version

    try:
        sglang: str | None = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        sglang = None
    return VersionFacts(
        hicache_ops=__version__,
        sglang_supported=tuple(SUPPORTED_VERSIONS),
        sglang_default=default_version(),
        sglang_installed=sglang,
        mooncake_measured=mooncake_versions.MEASURED,
        mooncake_installed=mooncake_versions.installed(),
    )
