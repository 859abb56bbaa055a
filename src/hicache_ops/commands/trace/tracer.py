"""A trace's steps and the tracer that collects them, shared by the step makers (steps.py,
side_pools.py, observe.py): each step says what it did, whether its invariant holds, and why not."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"


@dataclass
class Step:
    step: int
    name: str
    status: str
    summary: str
    invariant: str = ""
    state: str = ""  # the state this step changed
    detail: dict = field(default_factory=dict)
    elapsed_ms: float = 0.0
    causes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "invariant": self.invariant,
            "state": self.state,
            "detail": self.detail,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "causes": self.causes,
        }


class _Stop(Exception):
    """Raised inside the observer once a step failed: the engine call is abandoned there."""


class Tracer:
    """Collects steps; `on_step` sees each one as it is made (for an interactive walk)."""

    def __init__(self, cache, on_step: Callable[[Step], None] | None = None):
        self.cache = cache
        self.on_step = on_step
        self.steps: list[Step] = []
        self._last = time.perf_counter()

    @property
    def failed(self) -> bool:
        return any(s.status == FAIL for s in self.steps)

    def add(self, name: str, status: str, summary: str, **kw) -> Step:
        now = time.perf_counter()
        step = Step(len(self.steps) + 1, name, status, summary, elapsed_ms=(now - self._last) * 1e3, **kw)
        self._last = now
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
            self._last = time.perf_counter()  # time spent waiting for the user is not the step's
        return step

    def fail(self, name: str, summary: str, causes: list[str], **kw) -> None:
        self.add(name, FAIL, summary, causes=causes, **kw)
        raise _Stop()
