"""Where a GPU ledger's digests live: rows taken in order from laps, not a tensor allocated for each digest.

A ledger run on a GPU makes hundreds of digests a second, each a few int64 lane sums: the checksum kernels add
them into zeroed device rows (``zeroed_rows``) and ``deferred.on_host`` copies them into pinned host rows
(``PINNED.copy``). As tensors of their own these cost an allocation each, and on the device a fill launch; a
pinned one also its release, which records an event on each stream that used it (``on_host`` took 60 us a call
in a ledger run on the H200: ``benchmarks/ledger_host_time.py``). Here rows come from a lap, a tensor of
``LAP_ROWS`` rows allocated (on the device, zeroed) once and sliced in order; once a lap is used up the next is
allocated. No row is handed out twice, so nothing written into a row can land on a row someone else holds:

- a device lap is taken from per stream (the stream current when the rows are taken, where the kernel that adds
  into them runs and the copy that reads them is queued). The caching allocator frees its memory when its last
  view is gone, for reuse on the stream it was allocated on, after that stream's work queued so far.
- a host lap is taken from per stream too, and a used-up lap is kept until the event recorded after the last copy
  into it has passed (and then until its last view is gone): whatever torch's pinned allocator tracks of copies
  into slices, no copy can still be landing in a lap that is freed.

Under CUDA graph capture the zeroed rows are a plain ``torch.zeros`` (captured, so each replay zeroes them again);
off a GPU too.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["LAP_ROWS", "PINNED", "PinnedLaps", "recorded", "zeroed_rows"]

LAP_ROWS = 4096  # rows of a lap (64 KiB); a request for more rows than this gets a tensor of its own


class _Lap:
    """A lap's tensor [LAP_ROWS, 2], its next free row, and (host laps) the event after the last copy into it."""

    __slots__ = ("last", "next", "rows")

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows, self.next, self.last = rows, 0, None


class _Laps:
    """Rows [n, 2] int64 from laps made by ``allocate(rows, device)``, one lap in use per stream."""

    def __init__(self, allocate) -> None:
        self._allocate = allocate
        self._current: dict[tuple[int, int], _Lap] = {}  # (device, stream handle) -> the lap its rows come from
        self._lock = threading.Lock()  # engines on several threads share the laps

    def take(self, n: int, stream: torch.cuda.Stream) -> torch.Tensor:
        """``n`` rows from the stream's lap (more than a lap holds: a tensor of their own)."""
        if n > LAP_ROWS:
            return self._allocate(n, stream.device)
        with self._lock:
            return self._take(n, stream)[0]

    def _take(self, n: int, stream: torch.cuda.Stream) -> tuple[torch.Tensor, _Lap]:
        """``take`` with the lock held, and the lap the rows are of."""
        key = (stream.device_index, stream.cuda_stream)  # (each device's default stream is handle 0)
        lap = self._current.get(key)
        if lap is None or lap.next + n > lap.rows.shape[0]:
            if lap is not None:
                self._retire(lap)
            lap = self._current[key] = _Lap(self._allocate(LAP_ROWS, stream.device))
        rows = lap.rows[lap.next: lap.next + n]
        lap.next += n
        return rows, lap

    def _retire(self, lap: _Lap) -> None:
        """A used-up lap is replaced (the caller holds the lock): its memory goes with its last view."""


class PinnedLaps(_Laps):
    """Pinned host rows that device lanes are copied into; a used-up lap is kept until its last copy has landed."""

    def __init__(self) -> None:
        super().__init__(lambda rows, device: torch.empty((rows, 2), dtype=torch.int64, pin_memory=True))
        self._retired: list[_Lap] = []  # used-up laps whose last copy may not have landed when they were replaced

    def copy(self, lanes: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
        """``lanes`` (int64, a whole number of [2] rows), which the current stream is computing, copied into pinned
        host rows by a copy queued now behind that work, and an event recorded after the copy."""
        stream = torch.cuda.current_stream(lanes.device)
        n = lanes.numel() // 2
        if n > LAP_ROWS:
            host = self._allocate(n, stream.device).view(lanes.shape)
            host.copy_(lanes, non_blocking=True)
            return host, recorded(stream)
        with self._lock:  # the copy queued and its event recorded before another thread takes this lap's rows
            rows, lap = self._take(n, stream)
            host = rows.view(lanes.shape)
            host.copy_(lanes, non_blocking=True)
            event = lap.last = recorded(stream)  # a stream's copies land in order: after it, all the lap's have
        return host, event

    def _retire(self, lap: _Lap) -> None:
        self._retired = [old for old in self._retired if not old.last.query()]
        if lap.last is not None:
            self._retired.append(lap)


def recorded(stream: torch.cuda.Stream) -> torch.cuda.Event:
    """An event recorded on ``stream`` now."""
    event = torch.cuda.Event()
    event.record(stream)
    return event


PINNED = PinnedLaps()
def _zeroed_lap(rows: int, device: torch.device) -> torch.Tensor:
    return torch.zeros((rows, 2), dtype=torch.int64, device=device)


_ZEROED = _Laps(_zeroed_lap)


def zeroed_rows(n: int, device: torch.device) -> torch.Tensor:
    """``torch.zeros((n, 2), dtype=torch.int64, device=device)`` for lanes a kernel adds into: on a GPU rows of
    the current stream's lap (no allocation, no fill launch), except under graph capture."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return torch.zeros((n, 2), dtype=torch.int64, device=device)
    return _ZEROED.take(n, torch.cuda.current_stream(device))
