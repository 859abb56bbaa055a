"""`hicache lab up | down | status | fault`: rehearse cross-host incidents in network namespaces (root)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from hicache_ops.cli.common.help import HicacheCommand, HicacheGroup, examples
from hicache_ops.cli.common.options import JsonOption
from hicache_ops.cli.common.output import emit, reporting, stdout

if TYPE_CHECKING:
    from hicache_ops.commands.lab.results import LabFault

app = typer.Typer(
    cls=HicacheGroup,
    help="Several hosts on one machine (network namespaces, needs root): rehearse cross-host incidents.",
    no_args_is_help=True,
    epilog=examples(
        "sudo hicache lab up --hosts 3", "hicache lab status", "sudo hicache lab down --run-dir /run/hicache-lab"
    ),
)

RunDirOption = Annotated[
    str | None,
    typer.Option(
        "--run-dir",
        help="Folder of the lab's state and logs [default: $HICACHE_LAB_DIR, else /run/hicache-lab].",
        metavar="DIR",
        show_default=False,
    ),
]
# Not --host: that is serve's bind address; here it names a lab host.
OnHostOption = Annotated[
    str | None,
    typer.Option(
        "--on", help="The serve host the fault hits (h1, h2, ...) [default: h1].", metavar="HOST", show_default=False
    ),
]


def _table(data: dict[str, Any]) -> None:
    """Plain aligned columns (a Rich table would squeeze them on an 80-column pipe)."""
    header = ("host", "namespace", "address", "process", "pid", "URL", "segment", "faults")
    lines = [header]
    for row in data["hosts"]:
        pid = str(row["pid"]) if row["alive"] else f"{row['pid']} (dead)"
        lines.append(
            (
                row["host"],
                row["namespace"],
                row["address"],
                row["process"],
                pid,
                row["url"],
                row["segment"] or "-",
                ", ".join(row["faults"]) or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    stdout.print(
        f"[bold]hicache lab {data['id'] or ''}[/] {data['subnet']}  "
        f"(this host: {data['bridge']['address']} on {data['bridge']['name']})"
    )
    for n, line in enumerate(lines):
        text = "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        stdout.print(f"[bold]{text}[/]" if n == 0 else text, markup=n == 0)
    from hicache_ops.commands.lab.state import run_dir_flag

    flag = run_dir_flag(data["run_dir"])
    stdout.print(
        f"[dim]state and logs: {data['run_dir']}   status: hicache lab status{flag}   "
        f"stop with: sudo hicache lab down{flag}[/]"
    )


@app.command("up", cls=HicacheCommand, epilog=examples("sudo hicache lab up --hosts 3", "sudo hicache lab up --json"))
def up(
    hosts: Annotated[
        int, typer.Option("--hosts", help="Hosts h0..h(N-1): h0 runs the master, each other one a serve.", metavar="N")
    ] = 3,
    run_dir: RunDirOption = None,
    json_output: JsonOption = False,
) -> None:
    """Create namespaces hicache-ID-h0.. (ID and subnet picked per lab), start the master in h0 and a serve in every
    other host."""
    with reporting(json_output):
        from hicache_ops.commands.lab.status import status
        from hicache_ops.commands.lab.up import up as lab_up
        from hicache_ops.results import json_data

        lab = lab_up(hosts, run_dir)
        emit(status(lab["run_dir"]), json_output, lambda r: _table(json_data(r)))


@app.command(
    "down",
    cls=HicacheCommand,
    epilog=examples("sudo hicache lab down", "sudo hicache lab down --run-dir /run/hicache-lab"),
)
def down(run_dir: RunDirOption = None, json_output: JsonOption = False) -> None:
    """Stop every process and remove every namespace and link of one lab (idempotent); other labs are left
    alone.

    Without --run-dir (and $HICACHE_LAB_DIR) it stops the only lab up on this machine, and refuses, naming
    them, when several are up."""
    with reporting(json_output):
        from hicache_ops.commands.lab.down import down as lab_down
        from hicache_ops.results import json_data

        data = lab_down(run_dir)

        def render(d: dict[str, Any]) -> None:
            stopped = ", ".join(f"{s['host']} pid {s['pid']}" for s in d["stopped"]) or "nothing running"
            removed = ", ".join(d["namespaces_removed"]) or "none"
            lab = f"lab {d['id']} in {d['run_dir']}" if d["id"] else d["run_dir"]
            stdout.print(f"{lab}: stopped {stopped}; namespaces removed: {removed}", markup=False)
            if d["not_reaped"]:
                pids = ", ".join(str(p) for p in d["not_reaped"])
                stdout.print(f"not yet reaped by their parent (zombies): pid {pids}", markup=False)

        emit(data, json_output, lambda r: render(json_data(r)))


@app.command("status", cls=HicacheCommand, epilog=examples("hicache lab status", "hicache lab status --json"))
def status(run_dir: RunDirOption = None, json_output: JsonOption = False) -> None:
    """What runs where: host, namespace, address, process, URL, faults.

    Without --run-dir (and $HICACHE_LAB_DIR) it shows the only lab up on this machine, and refuses, naming
    them, when several are up."""
    with reporting(json_output):
        from hicache_ops.commands.lab.status import status as lab_status
        from hicache_ops.results import json_data

        emit(lab_status(run_dir), json_output, lambda r: _table(json_data(r)))


@app.command(
    "fault",
    cls=HicacheCommand,
    epilog=examples(
        "sudo hicache lab fault loopback-hostname --on h1",
        "sudo hicache lab fault slow-link --on h2 --latency-ms 300",
        "sudo hicache lab fault heal --on h1",
    ),
)
def fault(
    name: Annotated[
        str,
        typer.Argument(
            help="loopback-hostname, host-down, partition, master-restart, slow-link or heal.", metavar="FAULT"
        ),
    ],
    host: OnHostOption = None,
    latency_ms: Annotated[
        float, typer.Option("--latency-ms", help="slow-link: extra ms per L3 page read.", metavar="MS")
    ] = 200.0,
    run_dir: RunDirOption = None,
    json_output: JsonOption = False,
) -> None:
    """Inject one cross-host fault (see docs/mooncake.md#several-hosts).

    Without --run-dir (and $HICACHE_LAB_DIR) it acts on the only lab up on this machine, and refuses, naming
    them, when several are up."""
    with reporting(json_output):
        from hicache_ops.commands.lab.fault import fault as lab_fault
        from hicache_ops.commands.lab.status import status as lab_status
        from hicache_ops.results import json_data

        def render(result: LabFault) -> None:
            stdout.print(f"[bold]fault {result.name}[/] on {result.host}: {escape(result.detail)}")
            _table(json_data(lab_status(result.run_dir)))

        emit(lab_fault(name, host, latency_ms=latency_ms, run_dir=run_dir), json_output, render)
