"""The result model of `hicache tap` (its --json): the flags that load the tap and where each rank
records. Loaded when the plan is made, not with `hicache --help`."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hicache_ops.results import Result


class TapRecording(Result):
    path: str = Field(description="the recording file on the server host (ranks add .tpN before .jsonl)")
    env: str = Field(description="the variable that names it in the server's environment")
    per_rank: bool = Field(description="each rank records to a file of its own")
    files: list[str] = Field(description="every file the ranks write")


class TapPlan(Result):
    """`hicache tap --json`."""

    flags: list[str] = Field(description="the SGLang launch flags, one argument each")
    command_line: str = Field(description="the same, quoted for a shell")
    extra_config: dict[str, Any] = Field(description="the merged --hicache-storage-backend-extra-config")
    kept_keys: list[str] = Field(description="the keys of your extra-config kept next to the tap's")
    replaced_keys: list[str] = Field(description="your keys the tap's replace")
    tap_keys: list[str] = Field(description="the keys the tap adds")
    recording: TapRecording = Field(description="where the recording goes")
    show: str = Field(description="the command that summarises the recording afterwards")
    notes: list[str] = Field(description="plain-language remarks")
