"""The tap: SGLang's own MooncakeStore behind a recorder, loaded by a real server as a dynamic backend.

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "hicache_tap",
            "module_path": "hicache_ops.commands.tap", "class_name": "MooncakeTap", "interface_v1": 1,
            "tap_path": "/tmp/hicache-tap.jsonl", "master_server_address": "10.0.0.1:50051", ...}'

- `backend`: the MooncakeTap class that runs inside SGLang;
- `recording`: the recording (Recorder, what one call looks like, the spy on Mooncake's client);
- `plan`: what `hicache tap` prints (the launch flags above); `hicache trace show` reads the file.

SGLang loads the class as `getattr(import_module("hicache_ops.commands.tap"), "MooncakeTap")`: the class is
built on that first access (PEP 562), which imports SGLang's storage module then; importing this
package imports nothing heavy.
"""

from __future__ import annotations

import threading
from typing import Any

from hicache_ops.commands.tap.backend import CLASS_NAME, build_class

_class_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name == CLASS_NAME:
        with _class_lock:
            cls = globals().get(CLASS_NAME)
            if cls is None:
                cls = build_class()
                globals()[CLASS_NAME] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
