"""The lab's state file: what was created and started, written before each step so `down` can
undo it after a crash of the process that built it.

    run_dir/lab.json  {"id", "subnet", "bridge": {"name", "address"}, "master",
                       "hosts": [{"index", "namespace", "address", "veth", "role", "url", "segment",
                                  "process": {"pid", "start_time", "argv", "env", "log"}, ...}],
                       "faults"}

"id" names everything the lab creates (topology.py); a lab is addressed by its folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hicache_ops.errors import InputError

Lab = dict[str, Any]  # the state file's content (the layout above)

RUN_DIR_ENV = "HICACHE_LAB_DIR"
DEFAULT_RUN_DIR = "/run/hicache-lab"
STATE_FILE = "lab.json"


def run_dir(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)


def load(folder: Path) -> Lab | None:
    path = folder / STATE_FILE
    try:
        data: Lab = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"the lab state file {path} is unreadable ({exc}).",
            hint="Remove it, the lab's namespaces (hicache-ID-hK) and links (hcID-*) by hand "
            "(ip netns delete, ip link delete).",
        ) from None


# Every lab's run folder is listed here while it is up, so a command without --run-dir can say
# where a lab started with one runs (and how to address it).
INDEX_ENV = "HICACHE_LAB_INDEX"
DEFAULT_INDEX = "/run/hicache-labs"


def _index() -> Path:
    return Path(os.environ.get(INDEX_ENV) or DEFAULT_INDEX)


def _index_entry(folder: Path) -> Path:
    import hashlib

    return _index() / hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]


@contextlib.contextmanager
def creating() -> Iterator[None]:
    """Held while a lab picks its ID and subnet and creates its links, so two `lab up` at once do not
    pick the same /24 (a lock file in the index folder; without one, no lock)."""
    try:
        _index().mkdir(parents=True, exist_ok=True)
        handle = open(_index() / ".lock", "a")  # noqa: SIM115 - held for the with-block
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save(folder: Path, state: Lab) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(folder / STATE_FILE)
    try:
        _index().mkdir(parents=True, exist_ok=True)
        _index_entry(folder).write_text(str(folder.resolve()))
    except OSError:  # the index is a convenience for messages, never a reason to fail
        pass


def remove(folder: Path) -> None:
    (folder / STATE_FILE).unlink(missing_ok=True)
    try:
        _index_entry(folder).unlink(missing_ok=True)
    except OSError:
        pass


def labs_up() -> list[str]:
    """The run folders of every lab up on this machine (listed in the index, state file present), sorted."""
    found = []
    try:
        entries = sorted(e for e in _index().iterdir() if not e.name.startswith("."))
    except OSError:
        return []
    for entry in entries:
        try:
            path = Path(entry.read_text().strip())
        except OSError:
            continue
        if (path / STATE_FILE).is_file() and str(path) not in found:
            found.append(str(path))
    return sorted(found)


def other_labs(folder: Path) -> list[str]:
    """The run folders of the labs up on this machine other than `folder`."""
    return [path for path in labs_up() if Path(path) != folder.resolve()]


def subnets_in_use() -> list[str]:
    """The subnets the labs up on this machine recorded."""
    subnets = []
    for path in labs_up():
        try:
            lab = load(Path(path))
        except InputError:
            continue
        if lab and lab.get("subnet"):
            subnets.append(str(lab["subnet"]))
    return subnets


def lab_in_use(path: str | os.PathLike[str] | None, command: str = "status", verb: str = "show") -> Path:
    """The folder a lab command works on: the one given (--run-dir, else $HICACHE_LAB_DIR); without
    either, the only lab up on this machine (the index knows it), or the default folder when none is.
    Several labs up and none named: InputError listing them, so a bare command never acts on (or
    reports) someone else's lab by chance."""
    if path or os.environ.get(RUN_DIR_ENV):
        return run_dir(path)
    default = run_dir(None)
    up = labs_up()
    if (default / STATE_FILE).is_file() and str(default.resolve()) not in up:
        up.insert(0, str(default))
    if len(up) > 1:
        raise InputError(
            f"{len(up)} labs are up on this machine ({', '.join(up)}); name the one to {verb}.",
            hint=f"Pass its folder: hicache lab {command} --run-dir {up[0]}.",
        )
    return Path(up[0]) if up else default


def lab_to_stop(path: str | os.PathLike[str] | None) -> Path:
    """The folder `lab down` works on (lab_in_use)."""
    return lab_in_use(path, "down", "stop")


def no_lab_error(folder: Path) -> InputError:
    """ "No lab here", naming the labs that run in other folders and the option that reaches them."""
    others = other_labs(folder)
    if others:
        return InputError(
            f"no lab is up in {folder}; a lab runs in {', '.join(others)}.",
            hint=f"Pass its folder: --run-dir {others[0]}.",
        )
    return InputError(f"no lab is up (no state in {folder}).", hint="Start one with `hicache lab up --hosts 3`.")


def run_dir_flag(folder: str | os.PathLike[str]) -> str:
    """ " --run-dir DIR" unless a command without the option reaches `folder`: it is the folder such a
    command uses ($HICACHE_LAB_DIR, else the default) and no other lab up makes it ambiguous."""
    try:
        bare = lab_in_use(None)
    except InputError:  # several labs up: a bare command would refuse
        return f" --run-dir {folder}"
    same = Path(folder).resolve() == bare.resolve() == run_dir(None).resolve()
    return "" if same else f" --run-dir {folder}"
