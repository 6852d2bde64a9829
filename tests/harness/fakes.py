"""A fake target for offline tests (Jepsen ``simulate``): ops in, a history out, no engine.

The fake model is perfect and exact: it answers every probe right and the same way cold or hot.
A request whose payload was asked before hits its 64-aligned prefix (the last token is recomputed). ``corrupt``
decides which requests come back wrong, so tests can plant corruption where they want it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from forensics import HistoryWriter, choice_request_id
from hammer.patterns import CONTROL_ARM, Op


def perfect_output(op: Op, choice: int) -> str:
    return op.probe.expected if op.probe is not None else f"output {op.key[:6]} {choice}"


def simulate(ops: Iterable[Op], path: Path, *, corrupt: Callable[[Op, bool], bool] = lambda op, hit: False,
             output: Callable[[Op, int], str] = perfect_output) -> Path:
    """Run ``ops`` in order against the fake model, writing ``path``; returns it."""
    seen: set[str] = set()
    with HistoryWriter(path) as writer:
        for op in ops:
            seen_before = op.arm != CONTROL_ARM and op.payload in seen
            cached = (op.prompt_tokens - 1) // 64 * 64 if seen_before else 0
            hit = cached > 0
            writer.invoke(op.request, **op.invoke_fields())
            for choice in range(op.n):
                text = "garbled!" if corrupt(op, hit) else output(op, choice)
                _stream(writer, op, choice_request_id(op.request, choice), text, cached)
            seen.add(op.payload)
    return path


def _stream(writer: HistoryWriter, op: Op, rid: str, text: str, cached: int) -> None:
    for position, char in enumerate(text):
        if op.abandon_after is not None and position == op.abandon_after:
            writer.info(rid, reason="abandoned", tokens_received=position)
            return
        writer.token(rid, position=position, text=char, token_id=ord(char))
    writer.ok(rid, text=text, token_ids=[ord(c) for c in text], finish_reason="stop", cached_tokens=cached,
              usage={"prompt_tokens": op.prompt_tokens, "completion_tokens": len(text)},
              forensic={"cache_key": op.payload, "media_digest": op.media_digest} if op.media else None,
              latency=0.01, ttft=0.001)
