"""The official ``openai`` client talks to the server: streams equal whole responses, hits report cached tokens."""

from __future__ import annotations

import base64
import uuid

import httpx
import pytest
from openai import OpenAI

from mini_engine.engine.engine import media_digest

LONG = "The quick brown fox jumps over the lazy dog while the cache keeps every prefix it saw. " * 2  # 172 bytes


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=30.0, max_retries=0)


def unique(text: str = "") -> str:
    return f"[{uuid.uuid4().hex[:8]}] {text}"


def stream_chat(client: OpenAI, **request) -> tuple[dict[int, str], dict[int, str], object]:
    """The streamed text and finish reason per choice index, and the final usage."""
    texts, finish, usage = {}, {}, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    return texts, finish, usage


def test_streamed_chat_equals_the_whole_response(client):
    """A greedy chat request streamed through the openai client has the same text as the same request whole."""
    request = dict(model="tiny-random", messages=[{"role": "user", "content": unique("Say hi")}], max_tokens=24)
    whole = client.chat.completions.create(**request)
    texts, finish, usage = stream_chat(client, **request)
    assert texts == {0: whole.choices[0].message.content}
    assert finish == {0: whole.choices[0].finish_reason}
    assert usage.completion_tokens == whole.usage.completion_tokens > 0


def test_repeat_of_a_long_prompt_hits_and_is_identical(client):
    """A completion of a > 64-token prompt is cold (cached_tokens 0) first, a hit on repeat, and identical."""
    request = dict(model="tiny-random", prompt=unique(LONG), max_tokens=12, extra_body={"ignore_eos": True})
    cold = client.completions.create(**request)
    warm = client.completions.create(**request)
    assert cold.usage.prompt_tokens > 64
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.usage.prompt_tokens_details.cached_tokens >= 64
    assert warm.choices[0].text == cold.choices[0].text and warm.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **request) if c.choices)
    assert streamed == cold.choices[0].text


def test_streamed_chat_hit_reports_cached_tokens(client):
    """The usage chunk of a streamed chat hit carries prompt_tokens_details.cached_tokens > 0, same text."""
    request = dict(model="tiny-random", messages=[{"role": "user", "content": unique(LONG)}], max_tokens=8)
    first_texts, _, first_usage = stream_chat(client, **request)
    texts, _, usage = stream_chat(client, **request)
    assert first_usage.prompt_tokens_details.cached_tokens == 0
    assert usage.prompt_tokens_details.cached_tokens >= 64
    assert texts == first_texts


def test_n_choices_stream_with_their_index(client):
    """n=2 seeded sampling: each streamed index carries the same text as that choice of the whole response."""
    request = dict(model="tiny-random", messages=[{"role": "user", "content": unique("two")}], max_tokens=10, n=2,
                   temperature=1.0, seed=7)
    whole = client.chat.completions.create(**request)
    texts, finish, usage = stream_chat(client, **request)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert sorted(finish) == [0, 1]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_is_cut_and_never_streamed(client):
    """A stop string taken from the output ends it; streamed text never shows it and equals the whole text.
    The prompt is fixed (the sim engine is bit-exact: the same text on every run and on hits): the random
    model's bytes are often not UTF-8, and a random prompt's text sometimes had no two printable characters
    in a row to stop on."""
    request = dict(model="tiny-random", prompt="[stop-test] stop here", max_tokens=24, extra_body={"ignore_eos": True})
    free = client.completions.create(**request).choices[0].text
    start = next(i for i in range(2, len(free) - 1) if "\ufffd" not in free[i:i + 2])
    stop = free[start:start + 2]
    whole = client.completions.create(stop=[stop], **request)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=[stop], **request)
                       if c.choices)
    assert whole.choices[0].text == streamed == free[:free.index(stop)]
    assert whole.choices[0].finish_reason == "stop"


def test_forensics_name_the_cache_key_and_media(server):
    """Media parts reach the engine: the forensics media_digest is the bytes' digest; other media, other key."""
    def ask(media: bytes, as_url: bool) -> dict:
        data = base64.b64encode(media).decode()
        part = ({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}} if as_url
                else {"type": "input_media", "data": data})
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it? "}, part]}],
                "max_tokens": 2}
        response = server.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["forensics"]["choices"][0]

    a, a_again, b = ask(b"media A", True), ask(b"media A", False), ask(b"media B", True)
    assert a["media_digest"] == a_again["media_digest"] == media_digest([b"media A"])
    assert a["cache_key"] == a_again["cache_key"] != b["cache_key"]
    assert b["media_digest"] == media_digest([b"media B"])


def test_models_health_and_metrics(server):
    """/v1/models lists the served model, /health is ok, /metrics counts finished requests by reason and the
    safeguards' work: a fresh 80-token prompt donates its 64-token snapshot through a clone, and its decode
    steps' page tables go through the fence's readbacks."""
    assert server.get("/v1/models").json()["data"][0]["id"] == "tiny-random"
    assert server.get("/health").json() == {"status": "ok"}
    before = server.metrics()
    assert server.post("/v1/completions", json={"prompt": unique("x" * 80), "max_tokens": 3,
                                                "ignore_eos": True}).status_code == 200
    after = server.metrics()
    key = 'mini_engine_requests_finished_total{finish_reason="length"}'
    assert after[key] == before[key] + 1
    assert after["mini_engine_prompt_tokens_total"] > before["mini_engine_prompt_tokens_total"]
    assert after["mini_engine_donation_clones_total"] > before["mini_engine_donation_clones_total"]
    assert after["mini_engine_donation_clone_bytes_total"] > before["mini_engine_donation_clone_bytes_total"]
    assert after["mini_engine_metadata_fence_readbacks_total"] > before["mini_engine_metadata_fence_readbacks_total"]
    assert (after["mini_engine_metadata_fence_readback_seconds_total"]
            > before["mini_engine_metadata_fence_readback_seconds_total"])
    assert after["mini_engine_slots_capacity"] == server.config.num_slots
    assert httpx.get(server.url + "/metrics", timeout=10).headers["content-type"].startswith("text/plain")
