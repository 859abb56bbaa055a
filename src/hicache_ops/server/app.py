"""`hicache serve`'s HTTP API over one embedded tiered cache (FastAPI).

Endpoints: POST /v1/prefill, POST /v1/prefetch, POST /flush_cache (L1 and L2, like SGLang),
GET /v1/stats, GET /v1/layout, GET /metrics (Prometheus text), GET /health.
Errors a client can cause come back as 4xx with {"error": {"code", "message", "hint"}}; an L3 that
does not answer makes requests that need it 503, and /health 503 {"status": "degraded", "l3": "down"}
(README, "serve API").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.errors import HicacheError, InputError

if TYPE_CHECKING:
    from hicache_ops.server.runtime import Runtime


class PromptRequest(BaseModel):
    input_ids: list[int] = Field(..., description="Token ids of the prompt.")
    extra_key: str | None = None
    cache_salt: str | None = None
    return_keys: bool = Field(False, description="Include the L3 page keys in the response.")
    backup: bool = Field(False, description="Back every whole page up to host and L3 now, whatever the write policy.")


class TraceRequest(BaseModel):
    input_ids: list[int] = Field(..., description="Token ids of the prompt.")
    extra_key: str | None = None
    cache_salt: str | None = None
    flush: bool = Field(False, description="Flush L1 and L2 first (to trace the L3 path).")
    observe: bool = Field(
        False,
        description="Read only: observe the path without changing the cache "
        "(src/hicache_ops/commands/trace/observe.py).",
    )


def _error(status: int, err: HicacheError) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"code": err.code, "message": err.message, "hint": err.hint}}
    )


def create_app(runtime: Runtime) -> FastAPI:
    app = FastAPI(title="hicache serve", version="1")
    cache = runtime.cache

    @app.exception_handler(CapacityError)
    async def _capacity(request: Request, err: CapacityError):
        return _error(413, err)

    @app.exception_handler(InputError)
    async def _input(request: Request, err: InputError):
        return _error(400, err)

    @app.exception_handler(HicacheError)
    async def _other(request: Request, err: HicacheError):
        # An L3 that stopped answering is the server's dependency failing, not the client's fault.
        if err.exit_code == 3:
            runtime.record_l3_error(err.message)
        return _error(503 if err.exit_code == 3 else 500, err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where or 'body'}: {first.get('msg', 'invalid request')}."
        return _error(400, InputError(message, hint='Send JSON such as {"input_ids": [1, 2, 3]}.'))

    @app.post("/v1/prefill")
    def prefill(req: PromptRequest) -> dict:
        result = cache.prefill(
            req.input_ids, req.extra_key, req.cache_salt, with_keys=req.return_keys, force_backup=req.backup
        )
        return result.to_json(with_keys=req.return_keys)

    @app.post("/v1/prefetch")
    def prefetch(req: PromptRequest) -> dict:
        return cache.prefetch(req.input_ids, req.extra_key, req.cache_salt).to_json()

    @app.post("/v1/trace/{kind}")
    def trace(kind: str, req: TraceRequest) -> dict:
        """Run the write or read path of one prompt on this instance, step by step."""
        if kind not in ("write", "read"):
            raise InputError(f"trace kind {kind!r} is neither write nor read.")
        if req.observe and req.flush:
            raise InputError("observe and flush contradict each other: a flush changes the cache.")
        return runtime.trace(kind, req.input_ids, req.extra_key, req.cache_salt, flush=req.flush, observe=req.observe)

    @app.post("/flush_cache")
    def flush_cache() -> dict:
        cache.flush()
        return {"flushed": ["L1", "L2"]}

    @app.get("/v1/stats")
    def stats() -> dict:
        return runtime.stats()

    @app.get("/v1/layout")
    def layout() -> dict:
        return runtime.layout_report()

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(runtime.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    def health() -> JSONResponse:
        l3 = runtime.l3_state
        if l3["state"] == "down":
            body = {
                "status": "degraded",
                "l3": "down",
                "reason": l3["reason"],
                "since": l3["since"],
                "l3_errors": l3["errors"],
            }
            return JSONResponse(status_code=503, content=body)
        return JSONResponse({"status": "ok", "l3": l3["state"]})

    return app
