"""`hicache --version [--json]`: hicache-ops' version, the SGLang releases it knows and the Mooncake
release it was measured with, beside what is installed (read from package metadata: nothing heavy
is imported)."""

from __future__ import annotations

from pydantic import Field

from hicache_ops.results import Result


class SglangVersions(Result):
    supported: list[str] = Field(description="the SGLang releases whose rules hicache-ops knows (docs/releases.md)")
    default: str = Field(description="the release used when --sglang-version is not given")
    installed: str | None = Field(description="the sglang distribution installed beside hicache-ops, null if none")


class MooncakeWheel(Result):
    distribution: str = Field(description="the Mooncake distribution installed")
    version: str = Field(description="its version")


class MooncakeVersions(Result):
    measured: str = Field(description="the Mooncake release hicache-ops was measured with")
    installed: MooncakeWheel | None = Field(description="the Mooncake wheel installed, null if none")


class VersionResult(Result):
    """`hicache --version --json`."""

    hicache_ops: str = Field(description="hicache-ops' version")
    sglang: SglangVersions = Field(description="the SGLang releases known and installed")
    mooncake: MooncakeVersions = Field(description="the Mooncake release measured and installed")

    def text(self) -> str:
        """The three lines `hicache --version` prints."""
        sglang, mooncake = self.sglang, self.mooncake
        wheel = mooncake.installed
        return (
            f"hicache-ops {self.hicache_ops}\n"
            f"SGLang {', '.join(sglang.supported)} (default {sglang.default}; "
            f"{'installed ' + sglang.installed if sglang.installed else 'not installed'})\n"
            f"Mooncake {mooncake.measured} (measured; "
            f"{'installed ' + wheel.distribution + ' ' + wheel.version if wheel else 'not installed'})"
        )


def version_info() -> VersionResult:
    """hicache-ops' version, the SGLang releases it knows, and the Mooncake release (metadata only)."""
    from importlib import metadata

    from hicache_ops import __version__
    from hicache_ops.mooncake import versions as mooncake_versions
    from hicache_ops.sglang.versions import SUPPORTED_VERSIONS, default_version

    try:
        sglang: str | None = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        sglang = None
    mooncake = mooncake_versions.installed()
    return VersionResult(
        hicache_ops=__version__,
        sglang=SglangVersions(supported=list(SUPPORTED_VERSIONS), default=default_version(), installed=sglang),
        mooncake=MooncakeVersions(
            measured=mooncake_versions.MEASURED,
            installed=MooncakeWheel(distribution=mooncake[0], version=mooncake[1]) if mooncake else None,
        ),
    )
