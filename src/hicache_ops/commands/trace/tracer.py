"""A trace's steps and the tracer that collects them, shared by the step makers (steps.py,
side_pools.py, observe.py): each step says what it did, whether its invariant holds, and why not."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_serializer

from hicache_ops.results import Result

PASS, FAIL, INFO, SKIP = "PASS", "FAIL", "INFO", "SKIP"


class Step(Result):
    """One step of a trace: what it did, whether its invariant holds, and why not (the --json record
    and the serve's /v1/trace steps)."""

    step: int = Field(description="the step's number, from 1 (0: the scenario of an injected fault)")
    name: str = Field(description="what the step looks at (`match`, `L3`, `write policy`, ...)")
    status: Literal["PASS", "FAIL", "INFO", "SKIP"] = Field(
        description="PASS: its invariant holds; FAIL: the path stops here; INFO: observed only; SKIP: not reached"
    )
    summary: str = Field(description="what the step found, in one sentence")
    invariant: str = Field("", description="what the step checks")
    state: str = Field("", description="the state this step changed")
    detail: dict[str, Any] = Field(default_factory=dict, description="the step's figures (keys, pages, bytes)")
    elapsed_ms: float = Field(0.0, description="the step's time in ms, to 3 decimals")
    causes: list[str] = Field(default_factory=list, description="on a FAIL: the likely causes, most likely first")

    @field_serializer("elapsed_ms")
    def _ms(self, value: float) -> float:
        return round(value, 3)

    def record(self) -> StepRecord:
        return StepRecord(
            step=self.step,
            name=self.name,
            status=self.status,
            detail=self.detail,
            elapsed_ms=round(self.elapsed_ms, 3),
            summary=self.summary,
            causes=self.causes,
        )


class StepRecord(Result):
    """`hicache trace write/read --json`: one such object a line, printed as each step is made."""

    step: int = Field(description="the step's number, from 1 (0: the scenario of an injected fault)")
    name: str = Field(description="what the step looks at (`match`, `L3`, `write policy`, ...)")
    status: Literal["PASS", "FAIL", "INFO", "SKIP"] = Field(
        description="PASS: its invariant holds; FAIL: the path stops here; INFO: observed only; SKIP: not reached"
    )
    detail: dict[str, Any] = Field(description="the step's figures (keys, pages, bytes)")
    elapsed_ms: float = Field(description="the step's time in ms, to 3 decimals")
    summary: str = Field(description="what the step found, in one sentence")
    causes: list[str] = Field(description="on a FAIL: the likely causes, most likely first")


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
        step = Step(
            step=len(self.steps) + 1,
            name=name,
            status=status,
            summary=summary,
            elapsed_ms=(now - self._last) * 1e3,
            **kw,
        )
        self._last = now
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
            self._last = time.perf_counter()  # time spent waiting for the user is not the step's
        return step

    def fail(self, name: str, summary: str, causes: list[str], **kw) -> None:
        self.add(name, FAIL, summary, causes=causes, **kw)
        raise _Stop()
