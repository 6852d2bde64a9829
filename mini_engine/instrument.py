"""Instrumentation: the engine emits plain events to an optional sink; it never knows who listens.

An event is a flat dict with a ``type``, the host ``step``, a ``seq`` (emission order) and
JSON-serialisable fields. Host-side events (``alloc``, ``free``, ``snapshot_track``, ``donate``,
``transfer``, ``restore``, ``fork``, ``page_cow``, ``shared_page_write``, ``evict``, ``metadata_upload``, ``abort``,
``fault``) are emitted when the host decides; device-side events (``slot_write``,
``snapshot_write``, ``clone_written``, ``restore_read``, ``decode_metadata``,
``metadata_readback``) are emitted by the op itself when it *runs*, with checksums of the bytes
it wrote or read, so on the sim device ``seq`` is the order things really happened. With no sink,
``emit`` returns at once and callers guard expensive fields (checksums) with ``enabled``.

On a GPU a checksum is a device value: reading it at once would stall the host on the stream for every
slot event. There a device-side event carries ``Deferred`` fields (a checksum still being computed on
its stream); the row keeps its ``seq`` and waits in a queue, and ``flush`` hands rows to the sink in
``seq`` order once their values have landed, read back together. A ``Later`` field is host work
moved into the flush (a value nothing waits for, computed there). ``flush(wait=True)`` waits for them (the
engine does when it goes idle; while busy it flushes where the host is about to block on the device anyway, a
chunk of rows at a time until the device has finished (``flush(until=)``), else every few steps:
``Engine._process``). ``emit_rows`` queues the rows of a whole step at once: they take their ``seq``s when
emitted and are made from one value (say the step's digests, read back together) when it lands, with no
``Deferred`` per field and no row until then (a decode step's rows, batch 32, cost 0.20-0.26x the host time of one
``emit`` each on the CPU, less than rows of host values do: ``benchmarks/ledger_rows.py``, session 26).

``host_seconds`` counts the host time the instrumentation costs the engine: inside ``emit`` and ``flush``
(the sink's own time included; not ``flush(wait=True)``'s wait for the device) and inside ``timing()``,
which the engine wraps around its instrumented-only work (the ledger's checksum launches, or on the sim
the checksums themselves).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FLUSH_CHUNK_ROWS", "Deferred", "Instrumentation", "Later", "Sink"]

Sink = Callable[[dict[str, Any]], None]
# the rows a flush with an end (``flush(until=)``) delivers between its checks of that end: a decode step's at batch 32
FLUSH_CHUNK_ROWS = 64


class Deferred:
    """A field whose value a device is still computing.

    ``ready()``: whether it has landed (non-blocking). ``wait()``: block until it has.
    ``resolve_all(values)``: the values, read back together (one copy for a batch of them); a subclass that keeps
    it is resolved in the same call (its values may be of either class).
    ``landing()``: what it waits on; values with the same landing land together, so one ``ready()`` or
    ``wait()`` answers for all of them (default: the value alone).
    """

    def landing(self) -> object:
        return self

    def ready(self) -> bool:
        raise NotImplementedError

    def wait(self) -> None:
        raise NotImplementedError

    @classmethod
    def resolve_all(cls, values: list[Deferred]) -> list[Any]:
        raise NotImplementedError


class Later(Deferred):
    """A field the host computes when its row is flushed rather than when it is emitted: ``fn(*args)``, from values
    that no longer change (a staged shard's bytes). It is ready at once; what it moves is host work a row needs but
    nothing on the step's path waits for, into the flush, which the engine makes in the device's shadow where it
    can (``Engine._process``)."""

    __slots__ = ("args", "fn", "value")
    _LANDING = object()  # one landing for them all: asked once a flush
    _NONE = object()  # not computed yet

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args, self.value = fn, args, Later._NONE

    def landing(self) -> object:
        return Later._LANDING

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        pass

    @classmethod
    def resolve_all(cls, values: list[Later]) -> list[Any]:
        """Each value, computed once however many fields hold it."""
        for v in values:
            if v.value is Later._NONE:
                v.value = v.fn(*v.args)
        return [v.value for v in values]


class Instrumentation:
    def __init__(self, sink: Sink | None = None) -> None:
        self.sink = sink
        self.step = 0
        self._seq = 0
        # rows waiting for their own or an earlier row's device values, each with the keys of its own (none: only
        # behind another); or an ``emit_rows``' rows, keyed by their one value
        self._queue: list[tuple[dict[str, Any] | _Rows, Sequence[str]]] = []
        self._timer = _HostTimer()  # host time inside emit, flush and timing() (nested uses counted once)

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    @property
    def queued(self) -> bool:
        """Whether rows wait for device values or ``Later`` work (``pending`` without the count)."""
        return bool(self._queue)

    @property
    def pending(self) -> int:
        """Rows emitted but not yet handed to the sink (waiting for device values or ``Later`` work)."""
        return sum(1 if type(held) is dict else held.count for held, _ in self._queue)

    @property
    def host_seconds(self) -> float:
        """The instrumentation's own host time so far (see the module's docstring)."""
        return self._timer.seconds

    def timing(self) -> _HostTimer:
        """``with events.timing():`` counts the host time inside as the instrumentation's own; nested uses count
        once. (A plain object, not a generator: it runs once per ledger row.)"""
        return self._timer

    def emit(self, type_: str, **fields: Any) -> None:
        if self.sink is None:
            return
        with self._timer:
            self._seq += 1
            row = {"type": type_, "step": self.step, "seq": self._seq, **fields}
            deferred = [k for k, v in fields.items() if isinstance(v, Deferred)]
            if self._queue or deferred:
                self._queue.append((row, deferred))  # behind a row that waits: the sink sees rows in seq order
            else:
                self.sink(row)

    def emit_rows(self, count: int, values: Any, build: Callable[[Any, int, int], list[dict[str, Any]]]) -> None:
        """``count`` rows made by ``build(values, step, seq)`` once ``values`` has landed (a ``Deferred``, or a host
        value: at once unless rows wait before them). They take the next ``count`` seqs now, in order: ``build``
        makes whole rows, each ``{"type": ..., "step": step, "seq": seq + i, **fields}`` for its i-th row (one dict
        a row, not a row made of its fields: a decode step's rows are most of a ledger)."""
        if self.sink is None:
            return
        with self._timer:
            rows = _Rows(self.step, self._seq + 1, count, build, values)
            self._seq += count
            deferred = isinstance(values, Deferred)
            if self._queue or deferred:
                self._queue.append((rows, _Rows.KEYS if deferred else []))
            else:
                self._deliver(rows)

    def flush(self, *, wait: bool = False, until: Callable[[], bool] | None = None) -> bool:
        """Hand the sink every queued row whose device values (and every earlier row's) have landed;
        with ``wait``, all of them, blocking until they land. With ``until`` (a flush while the host has time to
        spare, which ends when ``until()`` is true: the device's shadow), they go ``FLUSH_CHUNK_ROWS`` rows at a time
        and the flush stops once ``until()`` is true, the rest left queued. Returns whether every row that had landed
        went."""
        if not self._queue:
            return True
        if wait:  # (the device's time, not the instrumentation's: not counted in host_seconds)
            landings = {row[k].landing(): row[k] for row, keys in self._queue for k in keys}
            for v in landings.values():
                v.wait()
        with self.timing():
            return self._flush(until)

    def _flush(self, until: Callable[[], bool] | None) -> bool:
        landed: dict[object, bool] = {}  # a landing asked once per flush (a batch's digests share one event)
        ready = 0
        for row, keys in self._queue:
            if not _landed(row, keys, landed):
                break
            ready += 1
        while ready:
            take = ready if until is None else _chunk(self._queue, ready)
            held, self._queue = self._queue[:take], self._queue[take:]
            ready -= take
            self._resolve(held)
            for row, _ in held:
                self._deliver(row)
            if ready and until():
                return False
        return True

    @staticmethod
    def _resolve(held: list[tuple[dict[str, Any] | _Rows, Sequence[str]]]) -> None:
        """Put the values of rows that have landed in place, read back together: the values of every kind that
        shares a ``resolve_all`` (a subclass that only ``finish``es differently), one call for them all."""
        places: dict[type, list[tuple[dict[str, Any], str]]] = {}  # a kind -> where its values are
        for row, keys in held:
            for key in keys:
                places.setdefault(type(row[key]), []).append((row, key))
        by_resolve: dict[Any, tuple[type, list[tuple[dict[str, Any], str]]]] = {}  # resolve_all -> (a kind, places)
        for kind, where in places.items():
            by_resolve.setdefault(kind.resolve_all.__func__, (kind, []))[1].extend(where)
        for kind, where in by_resolve.values():
            for (row, key), value in zip(where, kind.resolve_all([row[key] for row, key in where])):
                row[key] = value

    def _deliver(self, held: dict[str, Any] | _Rows) -> None:
        if type(held) is dict:
            self.sink(held)
            return
        for row in held.rows():
            self.sink(row)


class _Rows:
    """``emit_rows``' rows, queued as one: their one field ``values`` (a row's keys, for the queue), what makes them."""

    KEYS = ("values",)
    __slots__ = ("build", "count", "seq", "step", "values")

    def __init__(self, step: int, seq: int, count: int, build: Callable, values: Any) -> None:
        self.step, self.seq, self.count, self.build, self.values = step, seq, count, build, values

    def __getitem__(self, key: str) -> Any:
        return self.values

    def __setitem__(self, key: str, value: Any) -> None:
        self.values = value

    def rows(self) -> list[dict[str, Any]]:
        seq, count = self.seq, self.count
        rows = self.build(self.values, self.step, seq)
        if len(rows) != count:
            raise RuntimeError(f"emit_rows promised {count} rows and made {len(rows)}: the seqs after them are taken")
        if count and (rows[0]["seq"], rows[-1]["seq"]) != (seq, seq + count - 1):
            raise RuntimeError(f"emit_rows' rows are numbered {rows[0]['seq']}..{rows[-1]['seq']}; their seqs are "
                               f"{seq}..{seq + count - 1}")
        return rows


def _chunk(queue: list[tuple[dict[str, Any] | _Rows, Sequence[str]]], ready: int) -> int:
    """How many of the first ``ready`` entries of ``queue`` make the next ``FLUSH_CHUNK_ROWS`` rows (at least one)."""
    rows = 0
    for i in range(ready):
        held = queue[i][0]
        rows += 1 if type(held) is dict else held.count
        if rows >= FLUSH_CHUNK_ROWS:
            return i + 1
    return ready


def _landed(row: dict[str, Any], keys: list[str], landed: dict[object, bool]) -> bool:
    """Whether the values at ``keys`` of ``row`` have all landed; ``landed`` remembers each landing's answer (asked once
    a flush: a batch's digests share one event)."""
    for key in keys:
        value = row[key]
        landing = value.landing()
        ok = landed.get(landing)
        if ok is None:
            ok = landed[landing] = value.ready()
        if not ok:
            return False
    return True


class _HostTimer:
    """A reentrant context manager adding the time spent inside its outermost use to ``seconds``."""

    __slots__ = ("_depth", "_started", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._started = 0.0

    def __enter__(self) -> None:
        self._depth += 1
        if self._depth == 1:
            self._started = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._started
