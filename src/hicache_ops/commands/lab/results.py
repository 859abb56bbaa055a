"""The result models of `hicache lab up`, `status`, `down` and `fault` (their --json)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hicache_ops.results import Result


class LabHostRow(Result):
    """One lab host: where it is, what runs there and whether it is still alive."""

    host: str = Field(description="the lab's name for the host (h0 runs the master, h1.. a serve each)")
    namespace: str = Field(description="its network namespace")
    address: str = Field(description="its address on the lab's bridge")
    process: str = Field(description="what runs there: mooncake_master or hicache serve")
    pid: int | None = Field(description="that process's PID, null if none was started")
    alive: bool = Field(description="whether that process (same PID and start time) still runs")
    url: str = Field(description="the serve's URL, or the master's RPC and HTTP addresses")
    advertises: str | None = Field(description="the hostname its Transfer Engine advertises (docs/mooncake.md)")
    segment: str | None = Field(description="the Mooncake segment the serve mounted, null if it does not answer")
    faults: list[str] = Field(description="the faults injected on this host (or on every host)")
    namespace_present: bool = Field(description="whether its namespace still exists")


class LabStatus(Result):
    """`hicache lab status --json` (and `lab up --json`)."""

    run_dir: str = Field(description="the lab's state and log folder")
    id: str | None = Field(description="the lab's ID (its namespaces and links carry it)")
    subnet: str = Field(description="the lab's subnet")
    bridge: dict[str, Any] = Field(description="the bridge on this host: name and address")
    master: dict[str, Any] = Field(description="the master's RPC and metrics addresses (in h0)")
    hosts: list[LabHostRow] = Field(description="one row per host")
    faults: list[dict[str, Any]] = Field(description="the faults injected and still in place")


class StoppedProcess(Result):
    """A lab process `down` stopped."""

    host: str = Field(description="the lab host it ran on")
    pid: int = Field(description="its PID")


class LabDown(Result):
    """`hicache lab down --json`."""

    id: str | None = Field(description="the lab's ID, null when its state file was gone")
    stopped: list[StoppedProcess] = Field(description="the recorded processes stopped, serves first")
    killed_leftovers: list[int] = Field(description="PIDs of other processes still inside its namespaces, killed")
    not_reaped: list[int] = Field(description="PIDs gone but not yet reaped by their parent (zombies)")
    namespaces_removed: list[str] = Field(description="the namespaces removed")
    run_dir: str = Field(description="the lab's state folder (removed)")


class LabFault(Result):
    """`hicache lab fault --json`: the fault injected (or healed)."""

    name: str = Field(
        description="the fault: loopback-hostname, host-down, partition, master-restart, slow-link or heal"
    )
    host: str = Field(description="the lab host it hit (h0 for master-restart)")
    detail: str = Field(description="what was done, in one sentence")
    run_dir: str = Field(description="the lab's folder (state and logs)")
