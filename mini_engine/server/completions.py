"""The flow both POST endpoints share: build the submission, submit, then stream (SSE) or collect.

A request's id is ``<cmpl|chatcmpl>-<X-Request-Id>`` when the client sends that header (as vLLM names its
requests), else ``<prefix>-<random>``; the response, its chunks, the ledger rows and the ``forensics`` echo all
carry it, and the response echoes the header, so a client can find its requests in the server's ledger without
reading the extension. An id still in flight is refused (409), never shared.

A client that goes away aborts its request at once, freeing every slot it holds:
- streaming: Starlette cancels the response when the client disconnects; the response's
  ``finally`` aborts whatever has not finished;
- whole responses: waiting for the results races a watcher of the connection's ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mini_engine.engine import RequestIdInUse, RequestResult
from mini_engine.model import ByteTokenizer
from mini_engine.server.errors import APIError
from mini_engine.server.loop import EngineLoop, Generation
from mini_engine.server.prompts import Limits, Submission
from mini_engine.server.protocol import ChatCompletionRequest, CompletionRequest
from mini_engine.server.responses import Flavor, ResponseMeta, forensics
from mini_engine.server.streaming import TextStream

__all__ = ["generate"]

Body = CompletionRequest | ChatCompletionRequest
Builder = Callable[[Body, Limits, ByteTokenizer], Submission]
CLIENT_CLOSED = 499  # nobody reads it: the client is gone
REQUEST_ID_HEADER = "X-Request-Id"
# What a ledger log line can carry as one ``rid=`` value (no spaces, no quotes, no ``#``: choice ids use it).
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


async def generate(loop: EngineLoop, flavor: Flavor, body: Body, build: Builder, request: Request,
                   model_name: str) -> Response:
    if body.model is not None and body.model != model_name:
        raise APIError(404, f"model {body.model!r} is not served here; this server serves {model_name!r} "
                            f"(see /v1/models)", param="model", code="model_not_found")
    client_id = _client_request_id(request)
    submission = build(body, loop.limits, loop.tokenizer)
    meta = ResponseMeta(f"{flavor.id_prefix}-{client_id or uuid.uuid4().hex[:24]}", int(time.time()), model_name)
    try:
        generation = await loop.submit(submission, meta.id)
    except RequestIdInUse:
        raise APIError(409, f"{REQUEST_ID_HEADER} {client_id!r} names a request still in flight; send a unique id "
                            "per request", param=REQUEST_ID_HEADER, code="request_id_in_use") from None
    except ValueError as err:  # the engine's own validation (e.g. media placeholders vs media items)
        raise APIError(400, str(err)) from None
    headers = {REQUEST_ID_HEADER: client_id} if client_id else None
    if body.stream:
        texts = [TextStream(loop.tokenizer, body.stop_strings) for _ in generation.choices]
        events = _sse(generation, flavor, meta, texts, body.include_usage)
        return _AbortingStream(events, on_close=lambda: loop.abort(generation.rid), headers=headers)
    results = await _collect_unless_gone(generation, request, loop)
    if results is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(flavor.response(meta, results), headers=headers)


def _client_request_id(request: Request) -> str | None:
    """The client's ``X-Request-Id``, checked (it becomes part of the engine's request id and its ledger rows)."""
    value = request.headers.get(REQUEST_ID_HEADER)
    if value is None:
        return None
    if not REQUEST_ID.fullmatch(value):
        raise APIError(400, f"{REQUEST_ID_HEADER} must be 1 to 128 characters of A-Z a-z 0-9 . _ : -; got "
                            f"{value[:40]!r}", param=REQUEST_ID_HEADER, code="invalid_request_id")
    return value


async def _collect(generation: Generation) -> list[RequestResult]:
    results: list[RequestResult | None] = [None] * len(generation.choices)
    async for updates in generation.updates():
        for update in updates:
            if update.result is not None:
                results[update.index] = update.result
    return results


async def _collect_unless_gone(generation: Generation, request: Request, loop: EngineLoop) -> list | None:
    """The results, or None (and the request aborted) if the client disconnects first."""
    collector = asyncio.ensure_future(_collect(generation))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not collector.done():
            collector.cancel()
            loop.abort(generation.rid)
    return None if collector.cancelled() else collector.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(generation: Generation, flavor: Flavor, meta: ResponseMeta, texts: list[TextStream],
               include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events; the last chunk before ``[DONE]`` carries the ``forensics`` extension."""
    results: list[RequestResult | None] = [None] * len(texts)
    pending = None
    try:
        async for chunk in _chunks(generation, flavor, meta, texts, results, include_usage):
            if pending is not None:
                yield _event(pending)
            pending = chunk
        yield _event({**pending, "forensics": forensics(results)})
        yield "data: [DONE]\n\n"
    except APIError as err:  # the engine failed mid-stream: tell the client in the stream's own terms
        yield _event(err.body())


class _AbortingStream(StreamingResponse):
    """An SSE response that aborts its request whenever it ends: finished (a no-op), failed or disconnected.

    Starlette cancels a streaming response when the client disconnects, possibly before the body
    generator ever started (so a ``finally`` inside it would never run); this ``finally`` always does.
    """

    def __init__(self, events: AsyncIterator[str], *, on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _chunks(generation: Generation, flavor: Flavor, meta: ResponseMeta, texts: list[TextStream],
                  results: list[RequestResult | None], include_usage: bool) -> AsyncIterator[dict]:
    if flavor.chat:
        for index in range(len(texts)):
            yield flavor.chunk(meta, index, None, None)
    async for updates in generation.updates():
        for update in updates:
            delta = texts[update.index].push(update.tokens, update.result)
            if update.result is not None:
                results[update.index] = update.result
            if delta or update.result is not None:
                finish = update.result.finish_reason if update.result is not None else None
                yield flavor.chunk(meta, update.index, delta, finish)
    if include_usage:
        yield flavor.usage_chunk(meta, results)


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
