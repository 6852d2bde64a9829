"""Bad input gets a 4xx with an OpenAI-style error naming the field; nothing a client sends causes a 5xx."""

from __future__ import annotations

import base64

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mini_engine.engine import Engine, EngineConfig
from tests.server.conftest import TIMEOUT, live_server

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MEDIA_PART = {"type": "input_media", "data": base64.b64encode(b"picture").decode()}


def user(content) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


def media(part: dict) -> dict:
    return user([{"type": "text", "text": "see "}, part])


CASES = [  # (id, endpoint, body (dict, or raw bytes), status, param)
    ("malformed-json", COMPLETIONS, b'{"prompt": "hi", ', 400, None),
    ("body-not-an-object", COMPLETIONS, b"[1, 2]", 400, None),
    ("missing-prompt", COMPLETIONS, {"max_tokens": 2}, 400, "prompt"),
    ("prompt-wrong-type", COMPLETIONS, {"prompt": 123}, 400, "prompt"),
    ("prompt-empty", COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    ("prompt-token-outside-vocab", COMPLETIONS, {"prompt": [1, 2, 999_999]}, 400, "prompt"),
    ("max-tokens-string", COMPLETIONS, {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("max-tokens-zero", COMPLETIONS, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max-tokens-negative", CHAT, {**user("hi"), "max_tokens": -3}, 400, "max_tokens"),
    ("max-completion-tokens-zero", CHAT, {**user("hi"), "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("prompt-plus-max-tokens-over-context", COMPLETIONS, {"prompt": "x" * 100, "max_tokens": 4096}, 400,
     "max_tokens"),
    ("prompt-over-context", COMPLETIONS, {"prompt": "x" * 5000, "max_tokens": 1}, 400, "prompt"),
    ("temperature-string", COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("temperature-negative", COMPLETIONS, {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("seed-negative", COMPLETIONS, {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("n-absurd", COMPLETIONS, {"prompt": "hi", "n": 1000}, 400, "n"),
    ("n-zero", CHAT, {**user("hi"), "n": 0}, 400, "n"),
    ("stop-wrong-type", COMPLETIONS, {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("stop-empty-string", COMPLETIONS, {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("stream-not-bool", COMPLETIONS, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("stream-options-wrong", CHAT, {**user("hi"), "stream": True, "stream_options": {"include_usage": "x"}}, 400,
     "stream_options.include_usage"),
    ("unknown-model", COMPLETIONS, {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    ("messages-missing", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("messages-empty", CHAT, {"messages": [], "max_tokens": 2}, 400, "messages"),
    ("unknown-role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("content-wrong-type", CHAT, user(5), 400, "messages[0].content"),
    ("content-part-unknown-type", CHAT, user([{"type": "video", "video": "x"}]), 400,
     "messages[0].content[0].type"),
    ("content-part-text-not-string", CHAT, user([{"type": "text", "text": 3}]), 400,
     "messages[0].content[0].text"),
    ("media-bad-base64", CHAT, media({"type": "input_media", "data": "not base64!"}), 400,
     "messages[0].content[1].data"),
    ("media-oversized", CHAT, media({"type": "input_media", "data": base64.b64encode(b"x" * 5000).decode()}), 400,
     "messages[0].content[1].data"),
    ("media-not-a-data-url", CHAT, media({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
     400, "messages[0].content[1].image_url.url"),
    ("media-placeholder-in-text", CHAT, user([{"type": "text", "text": "<|media|>"}, MEDIA_PART]), 400,
     "messages"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_naming_the_field(server, endpoint, body, status, param):
    """Each bad request gets its 4xx and an OpenAI error naming the field; the server serves the next one."""
    sent = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {
        "json": body}
    response = server.post(endpoint, **sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert server.post(COMPLETIONS, json={"prompt": "still here", "max_tokens": 1}).status_code == 200


def test_valid_media_of_the_limit_size_is_accepted(server):
    """A media part of exactly max_media_bytes passes (the limit is inclusive) as image_url data URL."""
    data = base64.b64encode(b"y" * server.config.max_media_bytes).decode()
    body = media({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}})
    assert server.post(CHAT, json=body).status_code == 200


def test_unknown_fields_are_ignored(server):
    """Fields OpenAI has and we don't (or nobody has) are ignored, as OpenAI does."""
    body = {"prompt": "hi", "max_tokens": 1, "logprobs": 3, "frobnicate": {"x": [1]}, "user": "u-1"}
    assert server.post(COMPLETIONS, json=body).status_code == 200


SCALARS = (st.none() | st.booleans() | st.integers(-10, 10**7) | st.text(max_size=8)
           | st.floats(allow_nan=False, allow_infinity=False, width=32))  # what JSON can carry
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
# Mostly valid and small (so bodies get past it), never a long generation.
SMALL_OR_JUNK = st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(-2, 0), st.just(10**9), JSON)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot"]) | JSON,
                                 "content": st.text(max_size=20) | JSON})
COMMON = {"model": st.sampled_from(["tiny-random", "other"]) | JSON, "temperature": st.floats(0, 2) | JSON,
          "seed": st.integers(-1, 2**33) | JSON, "n": SMALL_OR_JUNK, "stop": st.text(max_size=3) | JSON,
          "stream": st.booleans() | JSON, "stream_options": st.fixed_dictionaries({"include_usage": JSON}) | JSON,
          "ignore_eos": st.booleans() | JSON, "user": JSON, "max_completion_tokens": SMALL_OR_JUNK}
EXTRA = st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in COMMON), JSON, max_size=3)


def bodies(required: dict) -> st.SearchStrategy[dict]:
    known = st.fixed_dictionaries({**required, "max_tokens": SMALL_OR_JUNK}, optional=COMMON)
    return st.tuples(known, EXTRA).map(lambda pair: {**pair[1], **pair[0]})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=bodies({"prompt": st.text(min_size=1, max_size=30) | st.lists(st.integers(-1, 300), max_size=4)
                    | JSON}))
def test_fuzzed_completion_bodies_never_5xx(server, body):
    """Random types in known fields and random extra fields: /v1/completions answers 200 or a 4xx, never 5xx."""
    assert_no_5xx(server, COMPLETIONS, body)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=bodies({"messages": st.lists(MESSAGE, max_size=3) | JSON}))
def test_fuzzed_chat_bodies_never_5xx(server, body):
    """Random types in known fields and random extra fields: /v1/chat/completions never answers 5xx."""
    assert_no_5xx(server, CHAT, body)


def assert_no_5xx(server, endpoint: str, body: dict) -> None:
    response = server.post(endpoint, json=body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert response.json()["error"]["message"]
    server.wait_until_drained()
    server.assert_no_request_holds_anything()


@pytest.fixture(scope="module")
def guarded(tiny_model):
    with live_server(Engine(EngineConfig(), model=tiny_model), api_key="s3cret") as live:
        yield live


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}])
def test_api_key_is_required_on_the_api(guarded, headers):
    """With --api-key, /v1 answers 401 (OpenAI error shape) without the right Bearer key; /health stays open."""
    response = guarded.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}, headers=headers)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert guarded.get("/debug/integrity", headers=headers).status_code == 401
    assert guarded.get("/health").status_code == 200


def test_the_right_api_key_is_served(guarded):
    """The right Bearer key gets a completion."""
    response = httpx.post(guarded.url + COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}, timeout=TIMEOUT,
                          headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_request_larger_than_the_kv_pool_is_refused_not_queued_forever(tiny_model):
    """With 8 pages of 16 tokens, a 200-token prompt is a 400 naming the prompt, and nothing is left waiting."""
    with live_server(Engine(EngineConfig(num_pages=8), model=tiny_model)) as small:
        response = small.post(COMPLETIONS, json={"prompt": "x" * 200, "max_tokens": 1})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
        assert small.metrics()["mini_engine_requests_waiting"] == 0
        assert small.post(COMPLETIONS, json={"prompt": "fits", "max_tokens": 2}).status_code == 200
