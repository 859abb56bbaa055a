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


def save(folder: Path, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(folder / STATE_FILE)


def remove(folder: Path) -> None:
    (folder / STATE_FILE).unlink(missing_ok=True)
