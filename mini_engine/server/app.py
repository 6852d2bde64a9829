"""The OpenAI-compatible HTTP server: routes, Bearer auth, OpenAI-shaped errors, and ``serve``.

    POST /v1/completions        POST /v1/chat/completions     (SSE with "stream": true)
    GET  /v1/models             GET  /health                  GET /metrics (Prometheus text)
    GET  /debug/integrity       the engine's conservation laws, checked on the engine thread

Every error body is ``{"error": {"message", "type", "param", "code"}}``; bad input is a 4xx
naming its field, and nothing a client sends reaches the engine unchecked.
"""

from __future__ import annotations

import secrets
import signal
import time
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from mini_engine.engine import Engine
from mini_engine.server import metrics
from mini_engine.server.completions import generate
from mini_engine.server.errors import APIError, error_body, param_from_loc
from mini_engine.server.loop import EngineLoop
from mini_engine.server.prompts import chat_submission, completion_submission
from mini_engine.server.protocol import ChatCompletionRequest, CompletionRequest
from mini_engine.server.responses import CHAT, COMPLETION

__all__ = ["create_app", "serve"]

PROTECTED_PREFIXES = ("/v1/", "/debug/")


def create_app(engine: Engine, *, served_model_name: str | None = None, api_key: str | None = None) -> FastAPI:
    """An app that owns ``engine`` from startup to shutdown (its lifespan runs the engine thread)."""
    loop = EngineLoop(engine)
    model_name = served_model_name or engine.model.config.name
    bit_exact = engine.config.bit_exact

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(title="mini-engine", lifespan=lifespan)
    app.state.engine_loop = loop
    _routes(app, loop, model_name, bit_exact)
    _error_handlers(app)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    return app


def serve(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Run until SIGINT / SIGTERM, then shut down cleanly (the lifespan stops the engine thread) and return.

    uvicorn handles the signal, shuts down, and then raises the same signal again for the caller;
    here that second delivery just ends ``run`` quietly.
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=5))
    previous = signal.signal(signal.SIGTERM, _stop_quietly)
    try:
        server.run()
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Stopped(Exception):
    """The re-raised SIGTERM, after uvicorn's clean shutdown."""


def _stop_quietly(signum: int, frame: object) -> None:
    raise _Stopped


def _routes(app: FastAPI, loop: EngineLoop, model_name: str, bit_exact: bool) -> None:
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await generate(loop, COMPLETION, body, completion_submission, request, model_name)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await generate(loop, CHAT, body, chat_submission, request, model_name)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "mini-engine",
                "max_model_len": loop.limits.max_context, "bit_exact": bit_exact}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if loop.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "failed", "error": loop.failure or "the engine thread is not running"},
                            status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        snapshot = await loop.call(lambda engine: metrics.read_metrics(engine, loop.counters))
        return PlainTextResponse(metrics.render(snapshot), media_type="text/plain; version=0.0.4")

    @app.get("/debug/integrity")
    async def integrity() -> Response:
        report = await loop.call(metrics.integrity_report)
        return JSONResponse(report, status_code=200 if report["ok"] else 500)


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> Response:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> Response:
        return JSONResponse(_validation_body(err), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> Response:
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(err.detail), type_=kind), status_code=err.status_code,
                            headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> Response:  # a bug: uvicorn logs the traceback
        return JSONResponse(error_body(f"internal error: {type(err).__name__}", type_="server_error"),
                            status_code=500)


def _validation_body(err: RequestValidationError) -> dict:
    """FastAPI's validation error as OpenAI's: the first problem, naming its field."""
    first = err.errors()[0]
    if first.get("type") == "json_invalid":
        return error_body(f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}",
                          code="invalid_json")
    param = param_from_loc(first.get("loc", ()))
    message = f"{param}: {first['msg']}" if param else f"the body must be a JSON object: {first['msg']}"
    return error_body(message, param=param, code=first.get("type"))


class BearerAuth:
    """``Authorization: Bearer <key>`` on the API and debug routes (health and metrics stay open)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self._expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES) and not self._authorized(scope):
            body = error_body("missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
            await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        return secrets.compare_digest(header, self._expected)
