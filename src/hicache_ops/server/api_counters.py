"""The counts SGLang's tokenizer-side metrics collector keeps, per finished /generate request
(docs/serve-api.md#metrics); the serve's runtime owns one, /generate records into it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class ApiCounters:
    """What SGLang's tokenizer-side collector counts, per finished /generate request."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # (is_streaming) -> counts
    prompt_tokens: dict = field(default_factory=lambda: {False: 0, True: 0})
    generation_tokens: dict = field(default_factory=lambda: {False: 0, True: 0})
    requests: dict = field(default_factory=lambda: {False: 0, True: 0})
    # cache_source -> tokens (device, host, storage)
    cached_tokens: dict = field(default_factory=lambda: {"device": 0, "host": 0, "storage": 0})
    backuped_tokens: int = 0

    def record(self, streaming: bool, prompt: int, generated: int, details: dict | None, stored_tokens: int) -> None:
        with self.lock:
            self.prompt_tokens[streaming] += prompt
            self.generation_tokens[streaming] += generated
            self.requests[streaming] += 1
            for source in ("device", "host", "storage"):
                self.cached_tokens[source] += (details or {}).get(source, 0) or 0
            self.backuped_tokens += stored_tokens

    def record_backup(self, stored_tokens: int) -> None:
        with self.lock:
            self.backuped_tokens += stored_tokens

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "prompt_tokens": dict(self.prompt_tokens),
                "generation_tokens": dict(self.generation_tokens),
                "requests": dict(self.requests),
                "cached_tokens": dict(self.cached_tokens),
                "backuped_tokens": self.backuped_tokens,
            }
