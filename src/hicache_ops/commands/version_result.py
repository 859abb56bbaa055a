"""The `hicache --version --json` model, built from `version.VersionFacts`."""

from __future__ import annotations

from pydantic import Field

from hicache_ops.commands.version import VersionFacts
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

    @classmethod
    def of(cls, facts: VersionFacts) -> VersionResult:
        wheel = facts.mooncake_installed
        return cls(
            hicache_ops=facts.hicache_ops,
            sglang=SglangVersions(
                supported=list(facts.sglang_supported), default=facts.sglang_default, installed=facts.sglang_installed
            ),
            mooncake=MooncakeVersions(
                measured=facts.mooncake_measured,
                installed=MooncakeWheel(distribution=wheel[0], version=wheel[1]) if wheel else None,
            ),
        )
