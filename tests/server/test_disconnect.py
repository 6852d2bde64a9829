"""A client that goes away aborts its request at once and frees everything it held; load leaks nothing."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from mini_engine.engine import Engine, EngineConfig
from tests.server.conftest import TIMEOUT, live_server, poll_until

LONG_RUN = 3000  # tokens: a request that would run for minutes unless aborted
PREFIX = "A shared prefix long enough to cross the first snapshot boundary of sixty-four tokens: "


@pytest.fixture(scope="module")
def busy_server(tiny_model):
    config = EngineConfig(max_running=32, num_slots=3 * 32 + 64, num_pages=1024)
    with live_server(Engine(config, model=tiny_model)) as live:
        yield live


def aborted(server) -> float:
    return server.metrics()["mini_engine_requests_aborted_total"]


def wait_for_running(server, at_least: int) -> None:
    poll_until(lambda: server.metrics()["mini_engine_requests_running"] >= at_least, "the request to run")


def test_disconnect_mid_stream_frees_all_slots(busy_server):
    """Closing a stream after its first token aborts it (aborted count +1) and frees its slots and pages."""
    before = aborted(busy_server)
    body = {"messages": [{"role": "user", "content": PREFIX + "stream"}], "max_tokens": LONG_RUN,
            "stream": True}
    with httpx.Client(timeout=TIMEOUT) as client, client.stream("POST", busy_server.url + "/v1/chat/completions",
                                                                 json=body) as response:
        assert response.status_code == 200
        contents = 0
        for line in response.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                contents += 1
                if contents == 2:
                    break
    busy_server.wait_until_drained()
    assert aborted(busy_server) == before + 1
    busy_server.assert_no_request_holds_anything()


def test_disconnect_while_waiting_for_a_whole_response_aborts(busy_server):
    """A non-streamed request whose client closes the connection is aborted, not run to its end."""
    before = aborted(busy_server)
    body = {"prompt": PREFIX + "whole", "max_tokens": LONG_RUN, "ignore_eos": True}

    async def ask_then_leave() -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            request = asyncio.create_task(client.post(busy_server.url + "/v1/completions", json=body))
            await asyncio.to_thread(wait_for_running, busy_server, 1)
            request.cancel()  # closes the connection mid-request
            with pytest.raises(asyncio.CancelledError):
                await request

    asyncio.run(asyncio.wait_for(ask_then_leave(), 30))
    busy_server.wait_until_drained()
    assert aborted(busy_server) == before + 1
    busy_server.assert_no_request_holds_anything()


async def one_stream(client: httpx.AsyncClient, url: str, i: int, leave_after: int | None) -> int:
    """Stream request ``i``; close it after ``leave_after`` data lines (None: read to the end)."""
    chat = i % 2 == 0
    text = (PREFIX if i % 5 == 0 else "") + f"load {i % 7}"
    body = ({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text, "ignore_eos": True})
    body |= {"max_tokens": 3, "stream": True, "n": 2 if i % 11 == 0 else 1}
    async with client.stream("POST", url + ("/v1/chat/completions" if chat else "/v1/completions"),
                             json=body) as response:
        lines = 0
        async for line in response.aiter_lines():
            lines += line.startswith("data: ")
            if leave_after is not None and lines > leave_after:
                break
        return response.status_code


def test_200_concurrent_streams_with_random_disconnects_leak_nothing(busy_server):
    """200 concurrent streams, a third abandoned at random points: no 5xx, no leaked slot, integrity holds."""
    rng = random.Random(20261202)
    plan = [rng.choice([None, None, 0, 1, 3]) for _ in range(200)]

    async def storm() -> list[int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), limits=limits) as client:
            return await asyncio.gather(*(one_stream(client, busy_server.url, i, leave)
                                          for i, leave in enumerate(plan)))

    statuses = asyncio.run(asyncio.wait_for(storm(), 90))
    assert statuses == [200] * len(plan)
    samples = busy_server.wait_until_drained()
    assert samples['mini_engine_requests_finished_total{finish_reason="length"}'] > 0
    report = busy_server.assert_no_request_holds_anything()
    assert report["slots_by_role"]["snapshot"] > 0  # the shared prefix was donated: the tree holds snapshots
    assert busy_server.get("/health").status_code == 200
