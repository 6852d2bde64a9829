"""``X-Request-Id`` names the request, as vLLM does: the response id, every chunk, the ``forensics`` echo and the
ledger rows carry ``<cmpl|chatcmpl>-<id>``, the response echoes the header; a bad id is a 400 naming the header,
and an id still in flight is a 409 (never two requests under one name in the ledger)."""

from __future__ import annotations

import json
import uuid

import httpx

from mini_engine.engine import Engine, EngineConfig
from tests.server.conftest import TIMEOUT, live_server, poll_until

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def fresh_id() -> str:
    return f"client-{uuid.uuid4().hex[:12]}"


def test_the_request_id_header_names_the_request_everywhere(tiny_model):
    """Whole and streamed, completions and chat: the id the client chose is in the response id, the chunks, the
    forensics echo (every choice of n) and the server's ledger rows; the header comes back."""
    rows = []
    with live_server(Engine(EngineConfig(), model=tiny_model, sink=rows.append)) as server:
        whole_id, streamed_id = fresh_id(), fresh_id()
        whole = server.post(COMPLETIONS, json={"prompt": "name me", "max_tokens": 3, "n": 2},
                            headers={"X-Request-Id": whole_id})
        assert whole.status_code == 200, whole.text
        assert whole.headers["x-request-id"] == whole_id and whole.json()["id"] == f"cmpl-{whole_id}"
        assert [c["request_id"] for c in whole.json()["forensics"]["choices"]] == [f"cmpl-{whole_id}",
                                                                                   f"cmpl-{whole_id}#1"]
        body = {"messages": [{"role": "user", "content": "stream me"}], "max_tokens": 3, "stream": True}
        with httpx.stream("POST", server.url + CHAT, json=body, headers={"X-Request-Id": streamed_id},
                          timeout=TIMEOUT) as response:
            assert response.status_code == 200 and response.headers["x-request-id"] == streamed_id
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert chunks and {chunk["id"] for chunk in chunks} == {f"chatcmpl-{streamed_id}"}
        anonymous = server.post(COMPLETIONS, json={"prompt": "no id", "max_tokens": 1})
        assert "x-request-id" not in anonymous.headers and anonymous.json()["id"].startswith("cmpl-")
        server.wait_until_drained()
    named = {row.get("rid") for row in rows}
    assert {f"cmpl-{whole_id}", f"cmpl-{whole_id}#1", f"chatcmpl-{streamed_id}"} <= named


def test_a_bad_request_id_is_a_400_naming_the_header(server):
    for bad in ("has space", "x" * 129, "choice#1", "quote'd"):
        response = server.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}, headers={"X-Request-Id": bad})
        assert response.status_code == 400, (bad, response.text)
        error = response.json()["error"]
        assert error["param"] == "X-Request-Id" and "1 to 128 characters" in error["message"]
    assert server.post(COMPLETIONS, json={"prompt": "still here", "max_tokens": 1}).status_code == 200


def test_an_id_still_in_flight_is_a_409_and_free_again_once_it_ends(server):
    """A second request under the id of one still streaming is refused and leaves the first untouched; once the
    first ends (here: its client leaves), the id may be used again."""
    held, aborted = fresh_id(), server.metrics()["mini_engine_requests_aborted_total"]
    body = {"prompt": "a long one", "max_tokens": 2000, "stream": True}
    with httpx.Client(timeout=TIMEOUT) as client:
        with client.stream("POST", server.url + COMPLETIONS, json=body, headers={"X-Request-Id": held}) as first:
            events = (line for line in first.iter_lines() if line.startswith("data: "))
            assert first.status_code == 200 and json.loads(next(events)[6:])["id"] == f"cmpl-{held}"
            clash = client.post(server.url + COMPLETIONS, json={"prompt": "me too", "max_tokens": 1},
                                headers={"X-Request-Id": held})
            assert clash.status_code == 409, clash.text
            assert clash.json()["error"]["param"] == "X-Request-Id" and "in flight" in clash.json()["error"]["message"]
            assert json.loads(next(events)[6:])["id"] == f"cmpl-{held}"  # the first streams on
        # Counted when the engine thread hands the request back: the same pass forgets its id.
        poll_until(lambda: server.metrics()["mini_engine_requests_aborted_total"] > aborted, "the abort to land")
        again = client.post(server.url + COMPLETIONS, json={"prompt": "now mine", "max_tokens": 1},
                            headers={"X-Request-Id": held})
    assert again.status_code == 200 and again.json()["id"] == f"cmpl-{held}"
