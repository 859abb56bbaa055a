"""`hicache serve`'s HTTP API over one embedded tiered cache (FastAPI).

Endpoints: POST /v1/prefill, POST /v1/prefetch, POST /flush_cache (L1 and L2, like SGLang),
GET /v1/stats, GET /v1/layout, GET /metrics (Prometheus text), GET /health; and SGLang's own:
POST /generate, GET /health_generate, /v1/models, /model_info, /server_info (with their /get_ aliases) and
0.5.23's /get_hicache_l3_cache_layout (server/sglang_api.py, docs/serve-api.md).
Errors a client can cause come back as 4xx with {"error": {"code", "message", "hint"}}; an L3 that
does not answer makes requests that need it 503, and /health 503 {"status": "degraded", "l3": "down",
"reason", "recover"} (README, "serve API"; docs/serve-api.md#when-l3-is-down).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from hicache_ops.engine.page_pools import CapacityError
from hicache_ops.errors import HicacheError, InputError
from hicache_ops.server.sglang_api import (
    Generation,
    l3_layout_body,
    model_info_body,
    models_body,
    parse_generate,
    server_info_body,
)
from hicache_ops.sglang.versions import V0_5_23

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
    cache = runtime.running_cache

    @app.middleware("http")
    async def _namespace_markers(request: Request, call_next):
        # After each request, before its reply: the namespaces it used are named on the master
        # (server/namespaces.py), so another instance's playbook finds them.
        response = await call_next(request)
        if request.method == "POST":
            await run_in_threadpool(runtime.publish_namespaces)
        return response

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
        runtime.api_counters.record_backup(result.stored_pages * runtime.spec.page_size)
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

    @app.post("/generate")
    async def generate(request: Request):
        """SGLang's /generate: the prompt through the cache, filler output, SGLang's reply or SSE stream.
        The body is JSON whatever its content type says (`curl -d` sends a form type)."""
        req = parse_generate(await request.body())
        served = await run_in_threadpool(Generation, runtime, req)
        if req.stream:
            return StreamingResponse(served.stream(), media_type="text/event-stream")
        return served.reply()

    @app.get("/health_generate")
    def health_generate() -> Response:
        # SGLang answers an empty 200 while it can serve; here: while the cache can (L3 up or absent).
        return Response(status_code=503 if runtime.l3_state["state"] == "down" else 200)

    @app.get("/model_info")
    @app.get("/get_model_info")
    def model_info() -> dict:
        return model_info_body(runtime)

    @app.get("/v1/models")
    def models() -> dict:
        # Clients (SGLang's bench among them) poll this to know the server is up.
        return models_body(runtime)

    @app.get("/server_info")
    @app.get("/get_server_info")
    def server_info() -> dict:
        return server_info_body(runtime)

    if runtime.spec.sglang_version == V0_5_23:

        @app.get("/get_hicache_l3_cache_layout")
        def l3_cache_layout() -> dict:
            return l3_layout_body(runtime)

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
                "recover": runtime.l3_recovery(),
            }
            return JSONResponse(status_code=503, content=body)
        return JSONResponse({"status": "ok", "l3": l3["state"]})

    return app
