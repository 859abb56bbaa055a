"""The lab's state file: what was created and started, written before each step so `down` can
undo it after a crash of the process that built it.

    run_dir/lab.json  {"subnet", "bridge", "hosts": [{"index", "namespace", "address", "role",
                       "process": {"pid", "start_time", "argv", "env", "log"}, "url", ...}], "faults"}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hicache_ops.errors import InputError

RUN_DIR_ENV = "HICACHE_LAB_DIR"
DEFAULT_RUN_DIR = "/run/hicache-lab"
STATE_FILE = "lab.json"


def run_dir(path: str | os.PathLike | None = None) -> Path:
    return Path(path or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)


def load(folder: Path) -> dict | None:
    path = folder / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"the lab state file {path} is unreadable ({exc}).",
            hint="Remove it and the hicache-* namespaces by hand (ip netns delete).",
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


def save(folder: Path, state: dict) -> None:
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


def other_labs(folder: Path) -> list[str]:
    """The run folders of the labs up on this machine other than `folder`."""
    found = []
    try:
        entries = sorted(_index().iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            path = Path(entry.read_text().strip())
        except OSError:
            continue
        if path != folder.resolve() and (path / STATE_FILE).is_file():
            found.append(str(path))
    return found


def no_lab_error(folder: Path) -> InputError:
    """ "No lab here", naming the labs that run in other folders and the option that reaches them."""
    others = other_labs(folder)
    if others:
        return InputError(
            f"no lab is up in {folder}; a lab runs in {', '.join(others)}.",
            hint=f"Pass its folder: --run-dir {others[0]}.",
        )
    return InputError(f"no lab is up (no state in {folder}).", hint="Start one with `hicache lab up --hosts 3`.")


def run_dir_flag(folder: str | os.PathLike) -> str:
    """ " --run-dir DIR" when `folder` is not the one commands use without the option, else ""."""
    return "" if Path(folder) == run_dir(None) else f" --run-dir {folder}"
