"""A real uvicorn server on 127.0.0.1 (a pre-bound port 0 socket) in a background thread, per module.

``httpx.ASGITransport`` buffers whole responses, so SSE and disconnects are tested against this.
The socket listens before uvicorn starts, so clients can connect at once: no readiness wait.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp

from mini_engine.engine import Engine, EngineConfig
from mini_engine.server import create_app

TIMEOUT = httpx.Timeout(30.0)


@dataclass(frozen=True)
class LiveServer:
    url: str
    config: EngineConfig  # the engine itself belongs to the server's engine thread

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=TIMEOUT, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=TIMEOUT, **kwargs)

    def metrics(self) -> dict[str, float]:
        """The Prometheus samples by name (labels included), e.g. ``mini_engine_requests_running``."""
        text = self.get("/metrics").text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def wait_until_drained(self) -> dict[str, float]:
        """Poll /metrics until nothing runs or waits (bounded); returns the last samples."""
        def drained():
            samples = self.metrics()
            busy = samples["mini_engine_requests_running"] + samples["mini_engine_requests_waiting"]
            return samples if busy == 0 else None
        return poll_until(drained, "the server to drain")

    def assert_no_request_holds_anything(self) -> dict:
        """Integrity holds and only tree-owned snapshot slots remain."""
        report = self.get("/debug/integrity").json()
        assert report["ok"], report
        assert report["slots_by_role"]["live"] == report["slots_by_role"]["pingpong"] == 0, report
        assert report["slots_used"] == report["slots_by_role"]["snapshot"], report
        return report


def poll_until(observe, what: str, deadline_s: float = 30.0, interval_s: float = 0.02):
    """Poll an observable server state until ``observe()`` is truthy (returned); fail after the deadline."""
    end = time.monotonic() + deadline_s
    while not (value := observe()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(interval_s)
    return value


@contextmanager
def live_server(engine: Engine, *, wrap: Callable[[ASGIApp], ASGIApp] | None = None,
                **app_options) -> Iterator[LiveServer]:
    """Serve ``engine`` (from here on its engine thread owns it) until the block ends; ``wrap``: middleware
    around the app (another server's behaviour in front of the engine)."""
    app = create_app(engine, **app_options)
    app = wrap(app) if wrap is not None else app
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        yield LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", engine.config)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[LiveServer]:
    with live_server(Engine(EngineConfig(), model=tiny_model)) as live:
        yield live
