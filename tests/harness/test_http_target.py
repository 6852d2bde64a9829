"""The HTTP target speaks OpenAI streaming: what it sends, what it records, how it fails, and that a
real ``mini-engine`` server hammered through it shows no corruption (abandon = a real disconnect)."""

import base64
import json

import httpx
import pytest
from click.testing import CliRunner

from forensics import HistoryWriter, fold_history, read_history
from forensics.ledger import log_line
from hammer.cli import main
from hammer.interpreter import run_ops
from hammer.patterns import HAMMER_ARM, Op, generate_ops
from hammer.targets import TargetUnavailable
from hammer.targets.http import HttpTarget
from mini_engine.engine import Engine, EngineConfig
from probes import Message, check_history
from tests.server.conftest import live_server, poll_until


def sse(*chunks):
    return ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()


COMPLETION = sse({"choices": [{"index": 0, "text": "4"}]}, {"choices": [{"index": 0, "text": "33"}]},
                 {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
                 {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                           "prompt_tokens_details": {"cached_tokens": 64}},
                  "forensics": {"choices": [{"index": 0, "cache_key": "k1", "restored_slot": 7,
                                             "cached_tokens": 64, "request_id": "cmpl-1"}]}})


def mock_target(handler, **options):
    return HttpTarget("http://server.test", transport=httpx.MockTransport(handler), **options)


def run(target, ops, folder):
    folder.mkdir(parents=True, exist_ok=True)
    with HistoryWriter(folder / "history.jsonl") as writer:
        run_ops(target, ops, writer)
    return read_history(folder / "history.jsonl")


def test_a_completion_stream_is_recorded_with_usage_and_forensics(tmp_path):
    """Deltas become token events; the ok event holds the text, cached_tokens and the forensics extension."""
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, content=COMPLETION)

    target = mock_target(handler, api_key="sekret", headers={"X-Team": "harness"}, model="m")
    events = run(target, [Op(request="a", pattern="p", prompt="hello", max_tokens=4, stop=("\n",))], tmp_path)
    body = json.loads(seen[0].content)
    assert seen[0].url.path == "/v1/completions" and body["prompt"] == "hello" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "m" and body["stop"] == ["\n"]
    assert seen[0].headers["authorization"] == "Bearer sekret" and seen[0].headers["x-team"] == "harness"
    assert [e["text"] for e in events if e["type"] == "token"] == ["4", "33"]
    ok = next(e for e in events if e["type"] == "ok")
    assert ok["text"] == "433" and ok["cached_tokens"] == 64 and ok["finish_reason"] == "stop"
    assert ok["forensic"] == {"cache_key": "k1", "restored_slot": 7, "cached_tokens": 64, "request_id": "cmpl-1"}


def test_every_request_names_itself_and_the_response_id_is_recorded(tmp_path):
    """Each request carries its own X-Request-Id under the run's prefix (a fresh prefix per target, the stored one on
    resume), and with --request-id-field in the body too (SGLang's rid); the ok event keeps the id the response
    carried. A --header of that name, or a field the body already uses, is refused naming the option."""
    seen, fields = [], []

    def handler(request):
        seen.append(request.headers["x-request-id"])
        fields.append(json.loads(request.content).get("rid"))
        return httpx.Response(200, content=sse({"id": f"cmpl-{len(seen)}", "choices": [{"index": 0, "text": "x"}]},
                                               {"id": f"cmpl-{len(seen)}", "choices": [{"index": 0, "text": "",
                                                                                        "finish_reason": "stop"}]}))

    target = mock_target(handler)
    ops = [Op(request=name, pattern="p", prompt="hi") for name in ("a", "b")]
    events = run(target, ops, tmp_path)
    assert seen == [f"{target.request_ids}-a", f"{target.request_ids}-b"] == [target.request_id("a"),
                                                                             target.request_id("b")]
    assert target.describe()["request_ids"] == target.request_ids != mock_target(handler).request_ids
    assert [e["server_id"] for e in events if e["type"] == "ok"] == ["cmpl-1", "cmpl-2"]
    assert fields == [None, None]
    kept = mock_target(handler, request_ids="hammer-kept", request_id_field="rid")
    run(kept, ops[:1], tmp_path / "kept")
    assert seen[-1] == fields[-1] == "hammer-kept-a" and kept.describe()["request_id_field"] == "rid"
    for option, value, named in (("--header", "x-request-id: mine", "--header X-Request-Id"),
                                 ("--request-id-field", "prompt", "--request-id-field"),
                                 ("--request-id-field", "two words", "--request-id-field")):
        refused = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "2", "--target",
                                            "http://127.0.0.1:9", option, value, "--out", str(tmp_path / "runs")])
        assert refused.exit_code == 2 and named in refused.output, refused.output
    assert not (tmp_path / "runs").exists()


def test_chat_media_go_as_content_parts_one_per_marker(tmp_path):
    """A chat op's media travel as image_url data-URL parts where its <|media|> markers stand."""
    bodies = []

    def handler(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse({"choices": [{"index": 0, "delta": {"content": "red"},
                                                              "finish_reason": "stop"}]}))

    op = Op(request="m", pattern="p", messages=(Message("user", "Look: <|media|> now"),), media=(b"\x00img",))
    events = run(mock_target(handler), [op], tmp_path)
    parts = bodies[0]["messages"][0]["content"]
    url = "data:application/octet-stream;base64," + base64.b64encode(b"\x00img").decode()
    assert parts == [{"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": url}},
                     {"type": "text", "text": " now"}]
    assert next(e for e in events if e["type"] == "ok")["text"] == "red"


def test_only_connection_failures_are_retried(tmp_path):
    """Two refused connections then success: sent once more each time; a break after sending is never re-sent."""
    calls = []

    def flaky(request):
        calls.append(request)
        if len(calls) <= 2:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, content=COMPLETION)

    events = run(mock_target(flaky, connect_retries=3), [Op(request="a", pattern="p", prompt="x")], tmp_path)
    assert len(calls) == 3 and events[-1]["type"] == "ok"
    broken = []

    def reset(request):
        broken.append(request)
        raise httpx.ReadError("connection reset")

    events = run(mock_target(reset), [Op(request="b", pattern="p", prompt="x")], tmp_path / "b")
    assert len(broken) == 1 and events[-1]["type"] == "info" and events[-1]["reason"] == "unknown"


def test_an_unreachable_server_stops_the_run_after_recording_a_fail(tmp_path):
    """Connections refused past the retries: the request is a fail and TargetUnavailable ends the run."""
    def refuse(request):
        raise httpx.ConnectError("refused")

    with HistoryWriter(tmp_path / "h.jsonl") as writer, pytest.raises(TargetUnavailable):
        run_ops(mock_target(refuse, connect_retries=1), [Op(request="a", pattern="p", prompt="x")], writer)
    assert [e["type"] for e in read_history(tmp_path / "h.jsonl")] == ["invoke", "fail"]
    with pytest.raises(TargetUnavailable, match="cannot reach"):
        mock_target(refuse).check()


@pytest.mark.parametrize("answer, kind, detail", [
    (httpx.Response(400, json={"error": {"message": "max_tokens: too big"}}), "fail", "HTTP 400"),
    (httpx.ReadTimeout("slow"), "info", "ReadTimeout"),
    (httpx.Response(200, content=b"data: {\"choices\": []}\n\n"), "info", "without [DONE]"),
])
def test_refusals_timeouts_and_cut_streams_end_as_fail_or_info(tmp_path, answer, kind, detail):
    """A 4xx is a fail naming the status; a timeout is info: timeout; a stream without [DONE] is info: unknown."""
    def handler(request):
        if isinstance(answer, Exception):
            raise answer
        return answer

    end = run(mock_target(handler), [Op(request="a", pattern="p", prompt="x")], tmp_path)[-1]
    assert end["type"] == kind and detail in end.get("error", "")
    if kind == "fail":
        assert end["status"] == 400
    if isinstance(answer, httpx.ReadTimeout):
        assert end["reason"] == "timeout"


def finished_total(samples: dict[str, float]) -> float:
    """Choices the server ended, any finish reason (abort included)."""
    return sum(v for name, v in samples.items() if name.startswith("mini_engine_requests_finished_total"))


@pytest.fixture(scope="module")
def servers(tiny_model):
    """mini-engine serve (cache on, overlap) and a cache-off twin for the controls, both on 127.0.0.1."""
    with live_server(Engine(EngineConfig(overlap=True), model=tiny_model)) as hot, \
            live_server(Engine(EngineConfig(enable_cache=False), model=tiny_model)) as cold:
        yield hot, cold


def test_the_patterns_through_a_real_server_find_no_corruption(servers, tmp_path):
    """alternate-abandon, follow-up and media-ab over HTTP: hits, real disconnects, 0 corrupted, nothing leaked.

    A cut stream whose last tokens the server had already decoded finishes there rather than aborting
    (disconnect detection itself is tested on long runs in tests/server/test_disconnect.py): so the server
    must end every request it got, and abort none that the client read to the end."""
    hot, cold = servers
    target = HttpTarget(hot.url, control_url=cold.url)
    target.check()
    assert target.byte_tokens and target.exact
    before = hot.wait_until_drained()
    with HistoryWriter(tmp_path / "history.jsonl") as writer:
        for pattern, count in (("alternate-abandon", 8), ("follow-up", 6), ("media-ab", 4)):
            run_ops(target, generate_ops(pattern, 3, count), writer)
    events = read_history(tmp_path / "history.jsonl")
    analysis = check_history(events)
    assert analysis.valid is True and analysis.counts["corrupted"] == 0, analysis.anomalies
    assert analysis.counts["hits"] >= 5 and analysis.counts["abandoned"] == 4
    records = fold_history(events).records.values()
    assert all(len(r.tokens) == r.invoke["abandon_after"] for r in records if r.abandoned)
    assert any(r.invoke.get("continued_from") for r in records)
    sent = sum(r.invoke["arm"] == HAMMER_ARM for r in records)

    def every_request_ended():  # an abort is counted when the engine thread next publishes: poll for it
        samples = hot.wait_until_drained()
        return samples if finished_total(samples) - finished_total(before) == sent else None

    after = poll_until(every_request_ended, f"the server to end all {sent} requests it got")
    aborted = after["mini_engine_requests_aborted_total"] - before["mini_engine_requests_aborted_total"]
    assert aborted <= sum(r.abandoned for r in records)
    hot.assert_no_request_holds_anything()


def test_hammer_run_against_the_server_exits_0(servers, tmp_path):
    """`hammer run --target URL --control-url URL` judges the run clean and records the server in meta.json."""
    hot, cold = servers
    result = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "4", "--target", hot.url,
                                       "--control-url", cold.url, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "last" / "meta.json").read_text())
    assert meta["target"]["server"] == "mini-engine" and meta["target"]["control_url"] == cold.url
    assert f"(X-Request-Id {meta['target']['request_ids']}-<request>)" in result.output
    assert "verdict             CLEAN" in result.output and "unknown" not in result.output


@pytest.mark.parametrize("card, exact", [
    ({"owned_by": "mini-engine", "bit_exact": True}, True),
    ({"owned_by": "mini-engine", "bit_exact": False}, False),  # mini-engine on cuda
    ({"owned_by": "mini-engine"}, True),  # a server from before the field
    ({"owned_by": "vllm", "bit_exact": True}, False),  # only our own engine's word is taken
])
def test_exactness_follows_the_servers_model_card(card, exact):
    """A hit that differs from its control is corruption only on a mini-engine that says it is bit-exact."""
    def handler(request):
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m", **card}]})

    target = mock_target(handler)
    target.check()
    assert target.exact is exact and target.describe()["exact"] is exact
    assert mock_target(handler, exact=True).exact is True  # --exact overrides


def test_the_model_card_says_whether_the_engine_is_bit_exact(servers):
    hot, _ = servers
    card = hot.get("/v1/models").json()["data"][0]
    assert card["owned_by"] == "mini-engine" and card["bit_exact"] is True  # the sim device


class ForeignLog:
    """A server's log as another engine would keep it: ordinary lines, and its slot ledger as ``LEDGER <type>
    key=value`` lines (the public schema's log form, ``forensics.ledger.log_line``), under the server's own request
    ids."""

    def __init__(self, path):
        self.handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- the engine thread writes until closed

    def __call__(self, row) -> None:
        self.handle.write(f"2026-12-05 10:00:00 INFO step {row.get('step')}\n")
        self.handle.write(f"2026-12-05 10:00:00 DEBUG {log_line(row)}\n")
        self.handle.flush()


class WithoutForensics:
    """A server that says nothing beyond the OpenAI API (vLLM, SGLang): mini-engine's streamed chunks with the
    ``forensics`` extension cut out, and with ``cached_tokens=False`` the usage's ``prompt_tokens_details`` too
    (vLLM without --enable-prompt-tokens-details). Its requests are still named after the X-Request-Id sent."""

    def __init__(self, app, *, cached_tokens: bool = True):
        self.app, self.cached_tokens = app, cached_tokens

    async def __call__(self, scope, receive, send):
        async def plain(message):
            if message["type"] == "http.response.body" and message.get("body", b"").startswith(b"data: {"):
                chunk = json.loads(message["body"][6:])
                chunk.pop("forensics", None)
                if not self.cached_tokens and chunk.get("usage"):
                    chunk["usage"].pop("prompt_tokens_details", None)
                message = {**message, "body": f"data: {json.dumps(chunk)}\n\n".encode()}
            await send(message)

        await self.app(scope, receive, plain)


def test_a_server_that_reports_no_cached_tokens_is_not_said_to_have_no_hits(tiny_model, tmp_path):
    """Without cached_tokens a hit cannot be told from a miss: the summary says so and how to turn it on, rather
    than "hits 0"; the run is still judged against its controls."""
    def plain(app):
        return WithoutForensics(app, cached_tokens=False)

    with live_server(Engine(EngineConfig(), model=tiny_model), wrap=plain) as hot, \
            live_server(Engine(EngineConfig(enable_cache=False), model=tiny_model), wrap=plain) as cold:
        result = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "6", "--target", hot.url,
                                           "--control-url", cold.url, "--no-report", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    counts = json.loads((tmp_path / "last" / "summary.json").read_text())["counts"]
    assert counts["hits"] == 0 and counts["hits_unreported"] == counts["completed"] > 0
    assert f"{counts['completed']} completed request(s) report no cached_tokens" in result.output
    assert "--enable-prompt-tokens-details" in result.output


@pytest.mark.parametrize("echoed", [True, False], ids=["forensics-echoed", "openai-only"])
def test_a_servers_ledger_log_attributes_an_http_run(tiny_model, tmp_path, echoed):
    """track_writer=off on the server: `hammer run` over HTTP finds corrupted hits, and `hammer analyze
    --ledger-log` adopts the hammer server's LEDGER log lines and the control server's JSON rows (`serve
    --ledger`'s form), renamed to the run's requests, so that attribution names the snapshot nobody wrote and each
    hit parts from its control at its first forward (its first token's logits too, where the server reports them),
    as on the embedded target. The rows are matched by the request ids the server echoed, or, from a server that
    echoes nothing, by the X-Request-Id each request was sent with: abandoned requests included. A run that already
    has a ledger, or a log naming none of its requests, is refused naming the option."""
    hot_log = ForeignLog(tmp_path / "hot.log")
    cold_rows = (tmp_path / "cold.jsonl").open("w", encoding="utf-8")
    wrap = None if echoed else WithoutForensics
    with live_server(Engine(EngineConfig(faults={"track_writer=off"}, reference_states=True), model=tiny_model,
                            sink=hot_log), wrap=wrap) as hot, \
            live_server(Engine(EngineConfig(enable_cache=False), model=tiny_model,
                               sink=lambda row: cold_rows.write(json.dumps(row) + "\n")), wrap=wrap) as cold:
        run = CliRunner().invoke(main, ["run", "alternate-abandon", "--count", "12", "--seed", "1", "--target",
                                        hot.url, "--control-url", cold.url, "--no-report", "--out", str(tmp_path)])
    hot_log.handle.close()
    cold_rows.close()
    assert run.exit_code == 1, run.output
    run_dir = (tmp_path / "last").resolve()
    assert not (run_dir / "ledger.jsonl").exists()
    analyzed = CliRunner().invoke(main, ["analyze", str(run_dir), "--ledger-log", str(tmp_path / "hot.log"),
                                         "--control-ledger-log", str(tmp_path / "cold.jsonl"), "--no-report"])
    assert analyzed.exit_code == 1 and "ledger attached: hammer " in analyzed.output, analyzed.output
    records = fold_history(read_history(run_dir / "history.jsonl")).records.values()
    assert any(r.end.get("forensic") for r in records) is echoed
    ledger_rids = {json.loads(line).get("rid") for line in (run_dir / "ledger.jsonl").open()}
    assert {r.request for r in records} <= ledger_rids  # every request, the abandoned ones too
    attribution = json.loads((run_dir / "attribution.json").read_text())
    verdicts = {v["verdict"] for v in attribution["verdicts"]}
    assert verdicts == {"bad-at-donate"}, attribution["verdicts"]
    assert attribution["parted"] and all(p["first_forward"] for p in attribution["parted"])
    assert all(p["token"] == (0 if echoed else None) for p in attribution["parted"]), attribution["parted"]
    told = CliRunner().invoke(main, ["postmortem", str(run_dir), "--no-report"])
    prefix = json.loads((run_dir / "meta.json").read_text())["target"]["request_ids"]
    server_ids = [v["server_id"] for v in json.loads((run_dir / "postmortem.json").read_text())["verdicts"]]
    assert server_ids and all(f"{prefix}-" in name for name in server_ids), server_ids
    assert told.exit_code == 0 and "server id" in told.output and server_ids[0] in told.output, told.output
    again = CliRunner().invoke(main, ["analyze", str(run_dir), "--ledger-log", str(tmp_path / "hot.log")])
    assert again.exit_code == 2 and "--ledger-log" in again.output and "already has a ledger" in again.output
    (run_dir / "ledger.jsonl").unlink()
    (tmp_path / "other.log").write_text("LEDGER slot_write rid=nobody slot=1 position=1 checksum=0x1\n")
    stranger = CliRunner().invoke(main, ["analyze", str(run_dir), "--ledger-log", str(tmp_path / "other.log")])
    assert stranger.exit_code == 2 and "no ledger row names a request this run sent" in stranger.output
