"""`mini-engine serve`: its options, errors naming the option, a clean stop on SIGINT / SIGTERM; engine failures."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch
from click.testing import CliRunner

from mini_engine.cli import main
from mini_engine.engine import Engine, EngineConfig
from tests.server.conftest import TIMEOUT, live_server


def test_serve_help_lists_the_options():
    """`serve --help` documents binding, auth, the engine's sizes and the faults."""
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--api-key", "--fault", "--model", "--device", "--dtype", "--overlap",
                   "--device-seed", "--max-running", "--num-slots", "--num-pages", "--max-context",
                   "--served-model-name", "--decode-gemm", "--decode-pdl"):
        assert option in result.output


@pytest.mark.parametrize(("args", "option"), [
    (["--max-running", "0"], "--max-running"),
    (["--fault", "no_such_fault"], "--fault"),
    (["--port", "70000"], "--port"),
    (["--max-running", "40", "--num-slots", "50"], "--num-slots"),  # 3 slots per running request
    (["--model", "/no/such/checkpoint"], "--model"),
    (["--dtype", "float16"], "--dtype"),
    (["--decode-gemm", "fast"], "--decode-gemm"),
    (["--decode-pdl"], "--decode-pdl"),  # on the simulated device: it launches the GPU's decode kernels
    pytest.param(["--device", "cuda"], "--device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without a GPU")),
])
def test_serve_bad_option_names_the_option(args, option):
    """A bad value is a usage error (exit 2) naming its option, before any server starts."""
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2 and option in result.output, result.output


def test_generate_runs_in_bfloat16_and_says_so():
    """`generate --dtype bfloat16` serves with bfloat16 projections (on the simulated device here)."""
    result = CliRunner().invoke(main, ["generate", "--prompt", "hi", "--max-tokens", "2", "--model", "tiny-random",
                                       "--dtype", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert "device: sim (seed 0)  dtype: bfloat16" in result.output and "generated: 2" in result.output


def test_generate_takes_faults():
    """`generate --fault` switches the safeguard off and says so."""
    result = CliRunner().invoke(main, ["generate", "--prompt", "hi", "--max-tokens", "2",
                                       "--fault", "track_writer=off", "--fault", "page_cow=off"])
    assert result.exit_code == 0, result.output
    assert "faults: page_cow=off, track_writer=off" in result.output


def read_until(process: subprocess.Popen, pattern: str, deadline_s: float = 60.0) -> re.Match:
    """Read the server's stderr (unbuffered) until ``pattern`` matches (bounded by the deadline)."""
    selector, end, seen = selectors.DefaultSelector(), time.monotonic() + deadline_s, b""
    selector.register(process.stderr, selectors.EVENT_READ)
    while time.monotonic() < end:
        if selector.select(timeout=end - time.monotonic()):
            chunk = os.read(process.stderr.fileno(), 65536)
            seen += chunk
            if match := re.search(pattern, seen.decode(errors="replace")):
                return match
            if not chunk:
                break
    raise AssertionError(f"no match for {pattern!r}; stderr: {seen.decode(errors='replace')}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_stops_cleanly_on_signal(sig):
    """A running `mini-engine serve` answers, then on SIGINT / SIGTERM shuts down and exits 0."""
    command = [sys.executable, "-c", "from mini_engine.cli import main; main()", "serve", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = read_until(process, r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT).status_code == 200
        process.send_signal(sig)
        assert process.wait(timeout=30) == 0
        assert "Application shutdown complete" in process.stderr.read().decode()
    finally:
        process.kill()
        process.wait(timeout=30)


def test_serve_refuses_a_ledger_file_that_holds_rows(tmp_path):
    """A ledger is one server's rows (seq from 1): a file with an earlier server's rows is a usage error naming
    --ledger, and the file is left as it was; an empty file is taken."""
    ledger = tmp_path / "ledger.jsonl"
    earlier = '{"type":"alloc","seq":1}\n{"type":"free","seq":2}\n'
    ledger.write_text(earlier)
    result = CliRunner().invoke(main, ["serve", "--ledger", str(ledger), "--max-running", "0"])
    assert result.exit_code == 2 and "--ledger" in result.output and "already holds 2 rows" in result.output
    assert ledger.read_text() == earlier
    ledger.write_text("")
    result = CliRunner().invoke(main, ["serve", "--ledger", str(ledger), "--max-running", "0"])
    assert result.exit_code == 2 and "--max-running" in result.output, "the empty ledger passed; the next check failed"


def test_serve_ledger_writes_the_slot_ledger_and_the_logits_checks(tmp_path):
    """`serve --ledger FILE`: every slot event a JSON row in FILE (the request's live-slot writes under the id the
    response echoes, the donation's cold reference state), and the response's forensics carry the logits checks of
    its tokens."""
    ledger = tmp_path / "ledger.jsonl"
    command = [sys.executable, "-c", "from mini_engine.cli import main; main()", "serve", "--port", "0", "--model",
               "tiny-random", "--ledger", str(ledger)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = read_until(process, r"Uvicorn running on http://127\.0\.0\.1:(\d+)").group(1)
        body = {"prompt": "a prompt long enough " * 8, "max_tokens": 3, "ignore_eos": True}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=TIMEOUT).json()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait(timeout=30)
    (choice,) = answer["forensics"]["choices"]
    assert len(choice["logit_checks"]) == 3 and choice["logits_digest"]
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    writes = [r for r in rows if r["type"] == "slot_write" and r["rid"] == choice["request_id"]]
    assert [r["position"] for r in writes] == [128, 168, 169, 170]  # two prefill chunks (168 bytes), two decodes
    assert {r["type"] for r in rows} >= {"alloc", "donate", "reference_state", "free"}


def test_an_engine_failure_ends_streams_with_an_error_and_health_reports_it(tiny_model, monkeypatch):
    """If a step raises, the live stream ends with an error event, new requests get 503, /health says failed."""
    engine = Engine(EngineConfig(), model=tiny_model)

    def planted_failure():
        raise RuntimeError("planted failure")

    body = {"prompt": "doomed", "max_tokens": 50, "stream": True, "ignore_eos": True}
    with live_server(engine) as server:
        with httpx.Client(timeout=TIMEOUT) as client, client.stream("POST", server.url + "/v1/completions",
                                                                     json=body) as response:
            events = (line for line in response.iter_lines() if line.startswith("data: "))
            assert '"text"' in next(events)
            monkeypatch.setattr(engine, "step", planted_failure)
            last = list(events)[-1]
        assert '"error"' in last and "planted failure" in last
        assert server.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code == 503
        health = server.get("/health")
        assert health.status_code == 503 and "planted failure" in health.json()["error"]
