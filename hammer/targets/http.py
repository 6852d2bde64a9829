"""The HTTP target: any OpenAI-compatible server, streamed through ``httpx`` (real time, real disconnects).

    prompt ops    POST /v1/completions         {"prompt": text, "stream": true, ...}
    message ops   POST /v1/chat/completions    {"messages": [...], "stream": true, ...}
    media         chat content parts: the text split at each <|media|> marker, one
                  {"type": "image_url", "image_url": {"url": "data:application/octet-stream;base64,..."}}
                  per item (the OpenAI completions API has no media: such ops fail, saying so)

Every request asks ``stream_options.include_usage``, so ``usage.prompt_tokens_details.cached_tokens``
arrives when the server reports it; a ``forensics`` extension object (mini-engine's: per choice
cache_key, media_digest, restored_slot, cached_tokens, request_id) is read when present. A delta is
one text chunk of one choice (servers stream one per token, or per decodable piece).

Request ids: every request carries ``X-Request-Id: <request_ids>-<request>`` (``request_ids``: a prefix
drawn once per run, kept in meta, so ids never repeat across runs against one server); vLLM and
mini-engine name the request after it (``cmpl-<id>``); with ``request_id_field`` (SGLang: ``rid``) the
body carries it too. The ok event records the id the response carried (``server_id``). Either lets
``hammer analyze --ledger-log`` match a server's ledger rows to the run's requests without the
``forensics`` extension (``hammer/ledger_logs.py``).

Errors: a connection that cannot be made is retried (``connect_retries``, backing off) and then the
target is unavailable; nothing that may have reached the server is ever sent twice. An HTTP error
status is a ``fail`` (the server refused); a read timeout is ``info: timeout``; a stream that breaks
or ends without ``[DONE]`` is ``info: unknown``.

Controls run alone, one at a time, after the hammer ops -- on ``control_url`` when given (a second
server with its prefix cache off makes them cold), else on the same server, whose cache state is
then unknown (the analysis flags every control that reports cached tokens).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from hammer.patterns import CONTROL_ARM, Op
from hammer.targets.base import Completion, Delta, Failure, Indeterminate, StreamingTarget, TargetUnavailable, Update
from probes.text import MEDIA_MARKER

__all__ = ["HttpTarget"]

CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)
REQUEST_ID_HEADER = "X-Request-Id"
# Fields of the request bodies this target sends: a request-id field may not be one of them.
RESERVED_FIELDS = frozenset({"max_tokens", "temperature", "seed", "n", "stream", "stream_options", "model", "stop",
                             "prompt", "messages"})


class HttpTarget(StreamingTarget):
    kind = "http"

    def __init__(self, url: str, *, api_key: str | None = None, headers: Mapping[str, str] | None = None,
                 model: str | None = None, timeout: float = 120.0, connect_retries: int = 3,
                 control_url: str | None = None, exact: bool | None = None, request_ids: str | None = None,
                 request_id_field: str | None = None, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if timeout <= 0 or connect_retries < 0:
            raise ValueError(f"need timeout > 0 and connect_retries >= 0; got {timeout}, {connect_retries}")
        if any(name.lower() == REQUEST_ID_HEADER.lower() for name in headers or {}):
            raise ValueError(f"--header {REQUEST_ID_HEADER}: the hammer sends its own, one per request (how a "
                             "server's ledger is matched to the run); leave it out")
        if request_id_field in RESERVED_FIELDS:
            raise ValueError(f"--request-id-field {request_id_field}: the request body already uses that field")
        self.request_ids = request_ids or f"hammer-{secrets.token_hex(4)}"
        self.request_id_field = request_id_field
        self.url, self.control_url = url.rstrip("/"), (control_url or "").rstrip("/") or None
        self.model, self.timeout, self.connect_retries = model, timeout, connect_retries
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.byte_tokens = False  # set by check() when the server is mini-engine (byte-level tokenizer)
        self.server = "unknown"
        self.bit_exact = False  # what /v1/models says: mini-engine on the sim device
        self._exact = exact  # None: exact when the server is a bit-exact mini-engine (float32 on the sim)
        self._client: httpx.AsyncClient | None = None
        self._transport = transport  # tests: an httpx.MockTransport instead of the network

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "model": self.model, "server": self.server,
                "control_url": self.control_url, "header_names": sorted(self.headers), "exact": self.exact,
                "request_ids": self.request_ids, "request_id_field": self.request_id_field}

    def request_id(self, request: str) -> str:
        """The ``X-Request-Id`` sent with ``request`` (every choice of it shares the one request)."""
        return f"{self.request_ids}-{request}"

    @property
    def exact(self) -> bool:
        """Whether a hit that differs from its control is a defect (an engine that is hit-invariant)."""
        return self._exact if self._exact is not None else self.bit_exact

    @property
    def controls(self) -> str:
        if self.control_url:
            return f"alone, one at a time, on {self.control_url} (cold if that server runs with its cache off)"
        return "alone, one at a time, on the same server: cache state unknown (its prefix cache stays on)"

    def check(self) -> None:
        """GET /v1/models on every server used: reachable, authorized, and which model it serves."""
        for url in filter(None, (self.url, self.control_url)):
            cards = self._models(url)
            if self.model is None and cards:
                self.model = cards[0].get("id")
            if url == self.url and cards:
                self.server = str(cards[0].get("owned_by", "unknown"))
                self.byte_tokens = self.server == "mini-engine"
                self.bit_exact = self.byte_tokens and cards[0].get("bit_exact", True) is True

    def _models(self, url: str) -> list[dict[str, Any]]:
        try:
            with httpx.Client(transport=self._transport, headers=self.headers, timeout=min(self.timeout, 10.0)) as client:
                response = client.get(f"{url}/v1/models")
        except httpx.HTTPError as error:
            raise TargetUnavailable(f"cannot reach {url}: {error}; is the server running?") from error
        if response.status_code != 200:
            raise TargetUnavailable(f"{url}/v1/models answered {response.status_code}: {response.text[:200]} "
                                    "(check --api-key and --header)")
        return response.json().get("data") or []

    async def stream(self, op: Op) -> AsyncIterator[Update]:
        try:
            path, body = request_body(op, self.model)
        except ValueError as error:
            yield Failure(str(error))
            return
        base = self.control_url if op.arm == CONTROL_ARM and self.control_url else self.url
        request_id = self.request_id(op.request)
        if self.request_id_field:
            body[self.request_id_field] = request_id
        try:
            opened = await self._open(f"{base}{path}", body, request_id)
        except httpx.TimeoutException as error:  # sent, no answer in time: it may have run
            yield Indeterminate("timeout", f"{type(error).__name__}: {error}")
            return
        except httpx.HTTPError as error:  # sent, then the exchange broke: it may have run, never re-sent
            yield Indeterminate("unknown", f"{type(error).__name__}: {error}")
            return
        async with opened as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")[:500]
                yield Failure(f"HTTP {response.status_code}: {detail}", response.status_code)
                return
            async for update in _read_events(response, op.n):
                yield update

    async def _open(self, url: str, body: dict[str, Any], request_id: str) -> Any:
        """The streaming response, retrying only failures to connect (nothing reached the server)."""
        client = self._client_now()
        for attempt in range(self.connect_retries + 1):
            try:
                request = client.build_request("POST", url, json=body, headers={REQUEST_ID_HEADER: request_id})
                response = await client.send(request, stream=True)
                return _Closing(response)
            except CONNECT_ERRORS as error:
                if attempt == self.connect_retries:
                    raise TargetUnavailable(f"cannot connect to {url} after {attempt + 1} attempt(s): {error}") \
                        from error
                await asyncio.sleep(0.1 * 2 ** attempt)  # back-off between connection attempts, not a barrier
        raise AssertionError("unreachable")

    def _client_now(self) -> httpx.AsyncClient:
        if self._client is None:  # one per event loop: the interpreter runs each round in its own
            timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
            self._client = httpx.AsyncClient(headers=self.headers, timeout=timeout, transport=self._transport,
                                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


class _Closing:
    """``async with`` over an already-sent streaming response: leaving it closes the connection early."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def __aenter__(self) -> httpx.Response:
        return self.response

    async def __aexit__(self, *exc: object) -> None:
        await self.response.aclose()


def request_body(op: Op, model: str | None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for ``op``; ValueError when the OpenAI API cannot express it."""
    body: dict[str, Any] = {"max_tokens": op.max_tokens, "temperature": op.temperature, "seed": op.seed, "n": op.n,
                            "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if op.stop:
        body["stop"] = list(op.stop)
    if op.messages is None:
        if op.media:
            raise ValueError("not sent: the OpenAI completions API carries no media (only chat messages do)")
        return "/v1/completions", {**body, "prompt": op.prompt}
    media = iter(op.media)
    messages = [{"role": m.role, "content": content_parts(m.content, media)} for m in op.messages]
    return "/v1/chat/completions", {**body, "messages": messages}


def content_parts(text: str, media: Any) -> str | list[dict[str, Any]]:
    """A message's content: plain text, or text and image_url parts with one part per media marker."""
    if MEDIA_MARKER not in text:
        return text
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(text.split(MEDIA_MARKER)):
        if i:
            data = base64.b64encode(next(media)).decode("ascii")
            parts.append({"type": "image_url", "image_url": {"url": f"data:application/octet-stream;base64,{data}"}})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


async def _read_events(response: httpx.Response, choices: int) -> AsyncIterator[Update]:
    """Deltas as they arrive, then one Completion per choice once ``[DONE]`` arrives."""
    state = _StreamState(choices)
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                for completion in state.completions():
                    yield completion
                return
            for update in state.read(json.loads(data)):
                yield update
    except httpx.TimeoutException as error:
        yield Indeterminate("timeout", f"{type(error).__name__}: {error}")
        return
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        yield Indeterminate("unknown", f"the stream broke: {type(error).__name__}: {error}")
        return
    yield Indeterminate("unknown", "the stream ended without [DONE]")


class _StreamState:
    """What one SSE stream has said so far: text and finish reason per choice, usage, forensics, the response id."""

    def __init__(self, choices: int) -> None:
        self.texts = [[] for _ in range(choices)]
        self.finish: list[str | None] = [None] * choices
        self.usage: dict[str, Any] | None = None
        self.forensics: dict[int, dict[str, Any]] = {}
        self.server_id: str | None = None

    def read(self, chunk: Mapping[str, Any]) -> list[Update]:
        if "error" in chunk:
            return [Indeterminate("unknown", f"the server reported an error mid-stream: {chunk['error']}")]
        updates: list[Update] = []
        if self.server_id is None and isinstance(chunk.get("id"), str):
            self.server_id = chunk["id"]
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
            if text and 0 <= index < len(self.texts):
                self.texts[index].append(text)
                updates.append(Delta(index, text))
            if choice.get("finish_reason") and 0 <= index < len(self.finish):
                self.finish[index] = choice["finish_reason"]
        self.usage = chunk.get("usage") or self.usage
        for item in (chunk.get("forensics") or {}).get("choices", ()):
            self.forensics[item.get("index", 0)] = {k: v for k, v in item.items() if k != "index"}
        return updates

    def completions(self) -> list[Completion]:
        reported = ((self.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        made = []
        for index, pieces in enumerate(self.texts):
            forensic = self.forensics.get(index)
            cached = forensic.get("cached_tokens", reported) if forensic else reported
            made.append(Completion(index, "".join(pieces), None, self.finish[index], cached, self.usage, forensic,
                                   self.server_id))
        return made
