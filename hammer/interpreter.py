"""The interpreter: runs a schedule of ops against a target and writes what happened, as it happens.

It is the only place in ``hammer`` that runs concurrency, and the only writer of the history
(through one ``HistoryWriter``). Every event is on disk when ``append`` returns, so a run killed
at any point keeps everything up to the kill. One round reads like this::

    hammer ops, in arrival order:
        when an op's tick comes        invoke it                    (invoke)
        as its stream arrives          record every delta            (token)
        when the client has seen enough, close the stream            (info: abandoned)
        when it ends                   record how                    (ok | fail | info)
        whatever the engine reports    record it                     (fault)
    then every control, alone, one at a time, to completion

What a tick is depends on the target:

* stepped (embedded): tick t is engine step t of the round; ops of tick t are submitted at the
  start of step t, and every open request is observed after every step.
* streaming (HTTP): a tick is one delta of every open stream. Tick t begins once every request
  started at an earlier tick s has ended or streamed at least t - s deltas; ops of one tick start
  together. A pattern's schedule is therefore a deterministic load shape (who overlaps whom, and
  for how long), not a wall-clock timetable: no sleeps.

An op that ``continues`` another starts at its tick or once that request has ended, whichever is
later, as ``op.continued(base, reply)``. Controls are made from the ops *as sent*: one per distinct
request actually asked (a continuation's depends on the reply it followed).

``concurrency`` caps the requests open at once on both kinds (an op waits for a free place).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from forensics import HistoryWriter, choice_request_id
from hammer.patterns import CONTROL_ARM, Op
from hammer.targets import (Completion, Delta, Failure, Indeterminate, Lane, SteppedTarget, StreamingTarget,
                            Target, TargetUnavailable, Update)

__all__ = ["MAX_IDLE_STEPS", "Recorder", "Round", "Stream", "run_ops"]

MAX_IDLE_STEPS = 100_000  # steps a round may take past its last arrival before the engine counts as stuck


class Recorder:
    """The history of one round: every event goes through ``writer``; ``events`` keeps the round's own."""

    def __init__(self, writer: HistoryWriter, *, round_index: int | None = None, byte_tokens: bool = True) -> None:
        self.writer, self.round, self.byte_tokens = writer, round_index, byte_tokens
        self.events: list[dict[str, Any]] = []

    def append(self, kind: str, request: str | None, **fields: Any) -> None:
        self.events.append(self.writer.append(kind, request, **fields))

    def invoke(self, op: Op) -> None:
        extra = None if self.round is None else {"round": self.round}
        self.append("invoke", op.request, **op.invoke_fields(byte_tokens=self.byte_tokens), extra=extra)

    def faults(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            details = {k: v for k, v in event.items() if k not in ("type", "name", "site", "step", "rid")}
            self.append("fault", event.get("rid"), name=event["name"], site=event.get("site"),
                        step=event.get("step"), details=details or None)


class Stream:
    """The client's side of one request: what it has received, and whether it still listens."""

    def __init__(self, op: Op, recorder: Recorder) -> None:
        self.op, self.recorder = op, recorder
        self.received = [0] * op.n  # deltas per choice
        self.open = set(range(op.n))  # choices that have not ended
        self.total = 0
        self.reply: Completion | None = None  # choice 0's completion: what a next turn continues

    @property
    def ended(self) -> bool:
        return not self.open

    def update(self, update: Update) -> None:
        """Record one update; once the client has had ``abandon_after`` deltas it closes (abandons)."""
        if self.ended:
            return
        if isinstance(update, Delta):
            self._delta(update)
        elif isinstance(update, Completion):
            self._complete(update)
        else:
            self._end_all(update)

    def _id(self, choice: int) -> str:
        return choice_request_id(self.op.request, choice)

    def _delta(self, delta: Delta) -> None:
        if delta.choice not in self.open:
            return
        self.recorder.append("token", self._id(delta.choice), position=self.received[delta.choice],
                             text=delta.text, token_id=delta.token_id)
        self.received[delta.choice] += 1
        self.total += 1
        if self.op.abandon_after is not None and self.total >= self.op.abandon_after:
            self._end_all(Indeterminate("abandoned", ""))

    def _complete(self, done: Completion) -> None:
        if done.choice not in self.open:
            return
        self.open.discard(done.choice)
        if done.choice == 0:
            self.reply = done
        self.recorder.append("ok", self._id(done.choice), text=done.text,
                             token_ids=None if done.token_ids is None else list(done.token_ids),
                             finish_reason=done.finish_reason, cached_tokens=done.cached_tokens,
                             usage=None if done.usage is None else dict(done.usage),
                             forensic=None if done.forensic is None else dict(done.forensic),
                             server_id=done.server_id)

    def _end_all(self, end: Failure | Indeterminate) -> None:
        """End every open choice: failed, or indeterminate (abandoned on purpose, timed out, unknown)."""
        for choice in sorted(self.open):
            if isinstance(end, Failure):
                self.recorder.append("fail", self._id(choice), error=end.error, status=end.status)
            else:
                self.recorder.append("info", self._id(choice), reason=end.reason, error=end.error or None,
                                     tokens_received=self.received[choice])
        self.open.clear()

    @property
    def abandoned(self) -> bool:
        return self.op.abandon_after is not None and self.total >= self.op.abandon_after


class Round:
    """What one round has sent so far: the streams by request, and each asked request as sent."""

    def __init__(self, recorder: Recorder, ops: Iterable[Op]) -> None:
        self.recorder = recorder
        self.scheduled = {op.request for op in ops}
        self.sent: dict[str, Stream] = {}
        self.variants: dict[str, dict[str, Op]] = {}  # generated key -> key as sent -> op as sent

    def ready(self, op: Op) -> bool:
        """Whether ``op`` may start: it continues nothing, or the request it continues has ended."""
        base = op.continues
        return base is None or base not in self.scheduled or (base in self.sent and self.sent[base].ended)

    def open(self, op: Op) -> tuple[Stream, Op | None]:
        """Invoke ``op`` (continued, if it continues a reply); None instead of the op when it cannot be sent."""
        sent, refused = self._as_sent(op)
        stream = Stream(sent, self.recorder)
        self.recorder.invoke(sent)
        self.sent[op.request] = stream
        if refused is not None:
            stream.update(refused)
            return stream, None
        self.variants.setdefault(op.key, {}).setdefault(sent.key, sent)
        return stream, sent

    def _as_sent(self, op: Op) -> tuple[Op, Failure | None]:
        if op.continues is None:
            return op, None
        base = self.sent.get(op.continues)
        if base is None or base.reply is None:
            return op, Failure(f"not sent: {op.continues}, whose reply it continues, did not complete")
        return op.continued(base.op, base.reply.text), None

    def controls(self, controls: Iterable[Op]) -> list[Op]:
        """One control per distinct request as sent, in the order the static controls name them."""
        made, seen = [], set()
        for control in controls:
            for j, variant in enumerate(self.variants.get(control.key, {}).values()):
                if variant.key not in seen:
                    seen.add(variant.key)
                    made.append(variant.control(control.request if j == 0 else f"{control.request}-{j}", control.at))
        return made


def run_ops(target: Target, ops: Iterable[Op], writer: HistoryWriter, *, round_index: int | None = None,
            concurrency: int | None = None) -> list[dict[str, Any]]:
    """Run ``ops`` (hammer ops in arrival order, then controls) against ``target``; returns the round's events.

    Raises TargetUnavailable when the target cannot be reached (after writing what it knows).
    """
    ops = tuple(ops)
    hammer = sorted((op for op in ops if op.arm != CONTROL_ARM), key=lambda op: op.at)
    controls = [op for op in ops if op.arm == CONTROL_ARM]
    round_ = Round(Recorder(writer, round_index=round_index, byte_tokens=target.byte_tokens), hammer)
    if isinstance(target, SteppedTarget):
        _drive(target.lane("hammer"), hammer, round_, concurrency)
        for control in round_.controls(controls):
            _drive(target.lane(CONTROL_ARM), [control], round_, None)
    elif isinstance(target, StreamingTarget):
        asyncio.run(_stream_round(target, hammer, controls, round_, concurrency))
    else:
        raise TypeError(f"{type(target).__name__} is neither a stepped nor a streaming target")
    return round_.recorder.events


# -- stepped targets: one engine step per tick --------------------------------------------------

def _drive(lane: Lane, ops: list[Op], round_: Round, concurrency: int | None) -> None:
    due, waiting, streams = deque(ops), [], {}
    tick = idle = 0
    while due or waiting or streams or lane.busy():
        while due and due[0].at <= tick:
            waiting.append(due.popleft())
        for op in [op for op in waiting if round_.ready(op)]:
            if concurrency is not None and len(streams) >= concurrency:
                break
            waiting.remove(op)
            _start(lane, op, round_, streams)
        lane.step()
        for request, stream in list(streams.items()):
            _observe(lane, request, stream, streams)
        round_.recorder.faults(lane.drain_faults())
        tick += 1
        idle = 0 if due else idle + 1
        if idle > MAX_IDLE_STEPS:
            raise RuntimeError(f"the engine is still busy {MAX_IDLE_STEPS} steps after the last arrival; "
                               f"open requests: {sorted(streams)[:5]}")


def _start(lane: Lane, op: Op, round_: Round, streams: dict[str, Stream]) -> None:
    stream, sent = round_.open(op)
    if sent is None:
        return
    refused = lane.submit(sent)
    if refused is not None:
        stream.update(refused)
    else:
        streams[op.request] = stream


def _observe(lane: Lane, request: str, stream: Stream, streams: dict[str, Stream]) -> None:
    for update in lane.observe(request):
        stream.update(update)
    if stream.abandoned:
        lane.abort(request)  # right after the k-th token: the client is gone
    if stream.ended:
        del streams[request]


# -- streaming targets: a tick is one delta of every open stream --------------------------------

class TickClock:
    """When tick t may begin: every request started at tick s < t has ended or streamed t - s deltas."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, Stream]] = {}
        self._changed = asyncio.Condition()

    def started(self, op: Op, stream: Stream) -> None:
        self._open[op.request] = (op.at, stream)

    async def changed(self, request: str | None = None, *, ended: bool = False) -> None:
        async with self._changed:
            if ended:
                self._open.pop(request, None)
            self._changed.notify_all()

    def _reached(self, tick: int) -> bool:
        return all(s.ended or s.total >= tick - start for start, s in self._open.values())

    async def until(self, tick: int, ready: Any = lambda: True) -> None:
        """Wait for tick ``tick`` and for ``ready()`` (re-checked whenever a stream changes)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._reached(tick) and ready())


async def _stream_round(target: StreamingTarget, hammer: list[Op], controls: list[Op], round_: Round,
                        concurrency: int | None) -> None:
    clock, places = TickClock(), asyncio.Semaphore(concurrency or len(hammer) or 1)
    try:
        async with asyncio.TaskGroup() as group:
            for op in hammer:
                await clock.until(op.at, lambda op=op: round_.ready(op))
                await places.acquire()
                group.create_task(_stream_one(target, op, round_, clock, places))
        for control in round_.controls(controls):
            await _stream_one(target, control, round_, TickClock(), asyncio.Semaphore(0))
    except* TargetUnavailable as group_error:
        raise group_error.exceptions[0] from None
    finally:
        await target.aclose()


def _stream_one(target: StreamingTarget, op: Op, round_: Round, clock: TickClock, places: asyncio.Semaphore) -> Any:
    """Invoke ``op`` now (in arrival order, counted by the clock at once); the coroutine streams it."""
    stream, sent = round_.open(op)
    clock.started(op, stream)

    async def follow() -> None:
        try:
            if sent is not None:
                await _follow(target.stream(sent), stream, clock)
        finally:
            places.release()
            await clock.changed(op.request, ended=True)

    return follow()


async def _follow(updates: Any, stream: Stream, clock: TickClock) -> None:
    """Record a stream's updates until it ends; leaving early closes it: a real disconnect."""
    try:
        async for update in updates:
            stream.update(update)
            await clock.changed()
            if stream.ended:
                break
    except TargetUnavailable as error:
        stream.update(Failure(str(error)))
        raise
    finally:
        await updates.aclose()
        if not stream.ended:
            stream.update(Indeterminate("unknown", "the stream stopped before the request ended"))
