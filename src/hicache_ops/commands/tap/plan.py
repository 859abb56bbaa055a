"""`hicache tap`: the SGLang launch flags that load the tap for a deployment.

    plan = launch_plan(load_extra_config("@mooncake.toml", where="--extra-config"), tp_size=2)
    plan["command_line"], plan["recording"]["files"], plan["notes"]

The flags select `--hicache-storage-backend dynamic` with an extra-config naming the tap's module and
class (`backend`), where to record (`recording`), and the user's own Mooncake keys kept beside them.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hicache_ops.commands.tap.backend import BACKEND_NAME, CLASS_NAME, MODULE_PATH
from hicache_ops.commands.tap.recording import (
    OBJECTS_KEY,
    PATH_ENV,
    PATH_KEY,
    default_path,
    rank_suffix,
    truthy,
    with_suffix,
)
from hicache_ops.errors import InputError, SettingError

if TYPE_CHECKING:
    from hicache_ops.commands.tap.results import TapPlan


def check_recording_path(path: str) -> None:
    """--path names a file to create in a folder that exists (the tap runs where this command runs:
    on the server host); a folder or a missing folder would fail only when SGLang loads the tap."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        raise SettingError(
            "path",
            f"{path!r} is a folder; the tap records into a file.",
            hint=f"Name a file in it, e.g. --path {os.path.join(path, 'hicache-tap.jsonl')}.",
        )
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise SettingError(
            "path",
            f"{path!r}: the folder {folder} does not exist.",
            hint="Create it on the server host first, or name a file in an existing folder.",
        )


def launch_plan(
    extra_config: Mapping[str, Any] | None = None,
    *,
    path: str | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    objects: bool = True,
) -> TapPlan:
    """The SGLang flags that load the tap, the merged extra-config and where each rank records."""
    for setting, size in (("tp_size", tp_size), ("pp_size", pp_size)):
        if size < 1:
            raise SettingError(setting, f"{size} must be >= 1.")
    if path is not None:
        check_recording_path(path)
    user = dict(extra_config or {})
    if truthy(user.get("standalone_storage"), False):
        raise InputError(
            "the tap cannot wrap a standalone_storage Mooncake client: SGLang gives the Mooncake host "
            "allocator only to --hicache-storage-backend mooncake, and MooncakeStore refuses any other.",
            hint="Record with standalone_storage false (an embedded client per rank), or drop the tap.",
        )
    recording = os.path.abspath(os.path.expanduser(path)) if path else default_path()
    tap: dict[str, object] = {
        "backend_name": BACKEND_NAME,
        "module_path": MODULE_PATH,
        "class_name": CLASS_NAME,
        "interface_v1": 1,
        PATH_KEY: recording,
    }
    if not objects:
        tap[OBJECTS_KEY] = False
    replaced = sorted(k for k in tap if k in user and user[k] != tap[k])
    kept = [k for k in user if k not in tap]
    merged = {**tap, **{k: user[k] for k in kept}}
    config_json = json.dumps(merged)
    flags = [
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "dynamic",
        "--hicache-storage-backend-extra-config",
        config_json,
    ]
    files = []
    for pp in range(pp_size):
        for tp in range(tp_size):
            files.append(with_suffix(recording, rank_suffix(tp, tp_size, pp, pp_size)))
    notes = [
        "interface_v1 is required: without it SGLang's controller calls the deprecated batch_get/batch_set, "
        "which MooncakeStore does not serve.",
        "keep --hicache-mem-layout page_first (the default) or page_first_direct: SGLang rewrites layer_first "
        "only for --hicache-storage-backend mooncake, and MooncakeStore rejects an MHA layer_first pool.",
        "the server's Python must import hicache_ops (install hicache-ops in the server's environment).",
        "under the tap SGLang does not reuse a shared Transfer Engine (it creates one only for the built-in "
        "mooncake backend) and /get_hicache_l3_cache_layout reports Mooncake as not attached; "
        "keys, objects and bytes are unchanged.",
    ]
    if not any(user.get(k) is not None for k in ("master_server_address", "client_server_address")):
        notes.append(
            "the extra-config names no master_server_address: MooncakeStore will read the file at "
            "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH, else MOONCAKE_MASTER and the other MOONCAKE_* variables, "
            "in the server's environment."
        )
    if tp_size * pp_size > 1:
        notes.append(
            "each rank appends to its own file (rank suffix before .jsonl); pass them all to `hicache trace show`."
        )
    if replaced:
        notes.append(f"replaced from your extra-config: {', '.join(replaced)}.")
    from hicache_ops.commands.tap.results import TapPlan, TapRecording

    return TapPlan(
        flags=flags,
        command_line=" ".join(shlex.quote(f) for f in flags),
        extra_config=merged,
        kept_keys=kept,
        replaced_keys=replaced,
        tap_keys=[k for k in tap],
        recording=TapRecording(path=recording, env=PATH_ENV, per_rank=tp_size * pp_size > 1, files=files),
        show="hicache trace show " + " ".join(shlex.quote(f) for f in files),
        notes=notes,
    )
