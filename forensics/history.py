"""``history.jsonl``: one writer, append-only, flushed per event; a reader that survives a killed run.

The writer is the only thing that assigns ``index`` and ``time``; it holds a lock around
assign-and-write, so one asyncio loop or several threads may share it and the file's order is the
index order. Each event is one ``write`` of one line followed by a flush, so a reader sees every
event as soon as ``append`` returns, and a run killed midway loses at most the line being written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from forensics.schema import SchemaError, validate_event

__all__ = ["HistoryWriter", "read_history", "read_jsonl"]


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield each line of a JSONL file as a dict.

    A final line cut short (a killed writer: no newline, not valid JSON) is dropped; a bad line
    anywhere else raises SchemaError naming the file and line, since that is not a killed run.
    """
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as error:
            if number == len(lines):  # the unterminated last line of a killed run
                return
            raise SchemaError(f"{path}:{number}: not valid JSON ({error.msg})") from error
        if not isinstance(row, dict):
            raise SchemaError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        yield row


def read_history(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete event of a history file, validated, in index order."""
    events = list(read_jsonl(path))
    for number, event in enumerate(events):
        try:
            validate_event(event)
        except SchemaError as error:
            raise SchemaError(f"{path}: event {number}: {error}") from error
        if number and event["index"] <= events[number - 1]["index"]:
            raise SchemaError(f"{path}: event {number} has index {event['index']} after "
                              f"{events[number - 1]['index']}; indices must increase")
    return events


def _repair_tail(path: Path) -> None:
    """Cut an unterminated final line (a killed writer) so that appending starts on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except json.JSONDecodeError:
            f.truncate(cut)
            return
        f.write(b"\n")  # the last event is whole; only its newline was lost


class HistoryWriter:
    """Appends events to ``history.jsonl``; ``resume`` continues an existing file's indices and times.

    Optional fields given as None are left out of the event. Raises SchemaError (naming the field)
    for an event the schema refuses, before anything is written.
    """

    def __init__(self, path: str | os.PathLike, *, next_index: int = 0, time_offset: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, fsync: bool = False) -> None:
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._next_index = next_index
        self._clock, self._started = clock, clock()
        self._time_offset = self._last_time = time_offset
        self._fsync = fsync

    @classmethod
    def resume(cls, path: str | os.PathLike, **kwargs: Any) -> HistoryWriter:
        """A writer whose indices and times continue after the last complete event of ``path``."""
        path = Path(path)
        _repair_tail(path)
        events = list(read_jsonl(path)) if path.exists() else []
        last = events[-1] if events else {"index": -1, "time": 0.0}
        return cls(path, next_index=last["index"] + 1, time_offset=float(last["time"]), **kwargs)

    @property
    def next_index(self) -> int:
        return self._next_index

    def append(self, kind: str, request: str | None, **fields: Any) -> dict[str, Any]:
        """Write one event now; returns it as written (with its ``index`` and ``time``)."""
        with self._lock:
            now = self._time_offset + (self._clock() - self._started)
            self._last_time = max(self._last_time, now)  # never backwards, even across a resume
            event = {"type": kind, "index": self._next_index, "time": round(self._last_time, 6),
                     "request": request, **{k: v for k, v in fields.items() if v is not None}}
            validate_event(event)
            try:
                line = json.dumps(event, separators=(",", ":"), allow_nan=False)  # ASCII: even lone surrogates survive
            except (TypeError, ValueError) as error:
                raise SchemaError(f"{kind} event for {request!r} is not JSON-serializable: {error}") from error
            self._file.write(line + "\n")
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._next_index += 1
            return event

    def invoke(self, request: str, *, arm: str, key: str, **fields: Any) -> dict[str, Any]:
        """A request was sent (``fields``: the op's fields, e.g. ``Op.invoke_fields()``)."""
        return self.append("invoke", request, arm=arm, key=key, **fields)

    def token(self, request: str, *, position: int, text: str, token_id: int | None = None,
              **fields: Any) -> dict[str, Any]:
        """One streamed delta at output ``position``."""
        return self.append("token", request, position=position, text=text, token_id=token_id, **fields)

    def ok(self, request: str, *, text: str, **fields: Any) -> dict[str, Any]:
        """The request completed: ``text`` plus token_ids, finish_reason, cached_tokens, usage, ..."""
        return self.append("ok", request, text=text, **fields)

    def fail(self, request: str, *, error: str, **fields: Any) -> dict[str, Any]:
        """The request definitely failed (e.g. an HTTP 4xx)."""
        return self.append("fail", request, error=error, **fields)

    def info(self, request: str, *, reason: str, **fields: Any) -> dict[str, Any]:
        """Indeterminate end: ``reason`` "abandoned" (closed on purpose), "timeout" or "unknown"."""
        return self.append("info", request, reason=reason, **fields)

    def fault(self, name: str, *, request: str | None = None, **fields: Any) -> dict[str, Any]:
        """An engine fault event (``name`` as in the fault catalogue, ``site``, ``details``)."""
        return self.append("fault", request, name=name, **fields)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
