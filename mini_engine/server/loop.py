"""The engine thread: the only code that touches the engine once the server runs.

The engine is single-threaded and in virtual time. One dedicated thread owns it::

    loop:
        wait on the condition while there is nothing to do (no command, engine idle)
        apply the queued commands         (submit, abort, read: integrity / metrics)
        step the engine once if it has work
        publish every live request's new tokens to its asyncio.Queue (call_soon_threadsafe)

The asyncio side never calls the engine: it queues commands (``call``, ``submit``, ``abort``) and
reads ``ChoiceUpdate``s from its queue. If a step raises, the engine's state is unknown: the
thread stops stepping, fails every live stream and keeps answering reads (so the wreck can be
inspected through ``/debug/integrity`` and ``/metrics``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mini_engine.engine import Engine, RequestResult
from mini_engine.server.errors import APIError
from mini_engine.server.prompts import Limits, Submission

__all__ = ["ChoiceUpdate", "EngineLoop", "Generation", "RequestCounters"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", type_="server_error")


@dataclass(frozen=True)
class ChoiceUpdate:
    index: int
    tokens: tuple[int, ...]  # produced since the previous update of this choice
    result: RequestResult | None  # set once, on the choice's last update


@dataclass
class RequestCounters:
    """Totals over finished choices; written only by the engine thread (read there too)."""

    finished: Counter = field(default_factory=Counter)  # finish_reason -> choices
    prompt_tokens: int = 0  # per request, counted when its first choice ends
    cached_tokens: int = 0

    def record(self, index: int, result: RequestResult) -> None:
        self.finished[result.finish_reason] += 1
        if index == 0:
            self.prompt_tokens += result.prompt_tokens
            self.cached_tokens += result.cached_tokens


@dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    choices: list[str]
    sent: list[int]
    done: list[bool]


@dataclass
class Generation:
    """A submitted request as the asyncio side sees it: its ids and its stream of updates."""

    rid: str
    choices: list[str]
    queue: asyncio.Queue

    async def updates(self) -> AsyncIterator[list[ChoiceUpdate]]:
        """Each step's updates until every choice has its result; raises APIError if the engine fails."""
        remaining = len(self.choices)
        while remaining:
            item = await self.queue.get()
            if isinstance(item, APIError):
                raise item
            remaining -= sum(update.result is not None for update in item)
            yield item


class EngineLoop:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.tokenizer = engine.tokenizer  # stateless
        config = engine.config
        # A request needing more KV pages than the pool holds would wait for admission forever.
        context = min(config.max_context, config.num_pages * config.page_size)
        vocab = min(engine.tokenizer.vocab_size, engine.model.config.vocab_size)
        self.limits = Limits(context, config.max_running, vocab, config.max_media_bytes)
        self.counters = RequestCounters()
        self.failure: str | None = None
        self._cond = threading.Condition()
        self._commands: deque[tuple[Callable[[Engine], Any], concurrent.futures.Future | None]] = deque()
        self._subscribers: dict[str, _Subscriber] = {}
        self._idle = True
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mini-engine", daemon=True)

    # -- the asyncio side --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    def call(self, fn: Callable[[Engine], T]) -> asyncio.Future[T]:
        """Run ``fn(engine)`` on the engine thread between two steps; await its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(fn, future)
        return asyncio.wrap_future(future)

    async def submit(self, submission: Submission, rid: str) -> Generation:
        """Queue a request; raises ValueError if the engine refuses it, APIError if it is down."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def register(engine: Engine) -> list[str]:
            if self.failure:
                raise APIError(503, f"the engine failed and serves no new requests: {self.failure}",
                               type_="server_error")
            engine.submit(submission.prompt, submission.params, rid=rid, n=submission.n, media=submission.media)
            choices = engine.choices(rid)
            self._subscribers[rid] = _Subscriber(loop, queue, choices, [0] * len(choices), [False] * len(choices))
            return choices

        return Generation(rid, await self.call(register), queue)

    def abort(self, rid: str) -> None:
        """Abort every unfinished choice of ``rid`` (no-op once finished); returns at once."""
        self._enqueue(lambda engine: self._abort(engine, rid), None)

    # -- the engine thread -------------------------------------------------------------------
    def _enqueue(self, fn: Callable[[Engine], Any], future: concurrent.futures.Future | None) -> None:
        with self._cond:
            if not self._stopping:
                self._commands.append((fn, future))
                self._cond.notify()
                return
        if future is not None:
            future.set_exception(_shutting_down())

    def _run(self) -> None:
        while (commands := self._wait_for_work()) is not None:
            for fn, future in commands:
                self._apply(fn, future)
            if not self.failure and not self._engine.idle():
                self._step()
            self._publish()
            self._idle = self._engine.idle()
        self._shut_down()

    def _wait_for_work(self) -> list | None:
        with self._cond:
            while not self._commands and not self._stopping and (self._idle or self.failure):
                self._cond.wait()
            if self._stopping:
                return None
            commands, self._commands = list(self._commands), deque()
        return commands

    def _apply(self, fn: Callable[[Engine], Any], future: concurrent.futures.Future | None) -> None:
        if future is not None and not future.set_running_or_notify_cancel():
            return  # the caller gave up waiting (its wrapping asyncio future was cancelled)
        try:
            value = fn(self._engine)
        except Exception as err:  # reported to the caller, who turns it into a response
            if future is None:
                log.exception("engine command failed")
            else:
                future.set_exception(err)
            return
        if future is not None:
            future.set_result(value)

    def _step(self) -> None:
        try:
            self._engine.step()
        except Exception as err:
            log.exception("engine step failed; no further steps will run")
            self.failure = f"{type(err).__name__}: {err}"
            self._fail_all(APIError(503, f"the engine failed: {self.failure}", type_="server_error"))

    def _publish(self) -> None:
        for rid, subscriber in list(self._subscribers.items()):
            updates = [u for i in range(len(subscriber.choices)) if (u := self._update(subscriber, i))]
            if updates:
                _deliver(subscriber, updates)
            if all(subscriber.done):
                del self._subscribers[rid]
                self._engine.forget(rid)  # a long-running server must not keep every request

    def _update(self, subscriber: _Subscriber, index: int) -> ChoiceUpdate | None:
        if subscriber.done[index]:
            return None
        rid = subscriber.choices[index]
        count, reason = self._engine.poll(rid)  # cheap; the full result only when something changed
        finished = reason is not None
        if count == subscriber.sent[index] and not finished:
            return None
        result = self._engine.result(rid) if finished else None
        new = tuple(self._engine.tokens(rid, subscriber.sent[index]))
        subscriber.sent[index] = count
        if finished:
            subscriber.done[index] = True
            self.counters.record(index, result)
        return ChoiceUpdate(index, new, result)

    def _abort(self, engine: Engine, rid: str) -> None:
        subscriber = self._subscribers.get(rid)
        if subscriber is None:
            return
        # The first choice first: aborting it releases the siblings it has not forked yet.
        for choice, done in zip(subscriber.choices, subscriber.done):
            if not done:
                engine.abort(choice)

    def _fail_all(self, error: APIError) -> None:
        for subscriber in self._subscribers.values():
            _deliver(subscriber, error)
        self._subscribers.clear()

    def _shut_down(self) -> None:
        with self._cond:
            commands, self._commands = list(self._commands), deque()
        for _, future in commands:
            if future is not None and future.set_running_or_notify_cancel():
                future.set_exception(_shutting_down())
        self._fail_all(_shutting_down())


def _deliver(subscriber: _Subscriber, item: list[ChoiceUpdate] | APIError) -> None:
    try:
        subscriber.loop.call_soon_threadsafe(subscriber.queue.put_nowait, item)
    except RuntimeError:
        pass  # the event loop is closed: the server is going down and nobody is listening
