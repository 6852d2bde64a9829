"""Checksums on a GPU without stalling the host: the digest stays on the device until the ledger reads it.

On CUDA a ledger checksum is a ``DeviceDigest``: the Triton kernel's lane sums ([2] int64,
``triton.checksum_lanes``; ``rows_lanes`` for the rows of a table) and an event on the stream that
computed them, the same digest ``reference.slot_checksum`` gives on the CPU; ``DeviceDigests`` is all of a
batch's as one value (a decode step's rows, made together). The instrumentation queues rows holding one and
reads a whole batch of them back in one copy once their events have completed (``mini_engine.instrument``), on
a stream of its own (``read_landed``: not behind the steps queued since). A check that must land in a device
tensor (the logits') is ``triton.row_digests``.
"""

from __future__ import annotations

import functools

import torch

from mini_engine.instrument import Deferred

__all__ = ["DeviceDigest", "DeviceDigests", "read_landed", "rows_lanes"]


class DeviceDigest(Deferred):
    """A 64-bit digest whose lane sums the current stream is computing: ``lanes`` [2] int64, or row ``row`` of a
    batch's ``lanes`` [n, 2] (the batch's digests keep one tensor, not a view each: a step makes dozens)."""

    __slots__ = ("event", "lanes", "row")

    def __init__(self, lanes: torch.Tensor, event: torch.cuda.Event | None = None, row: int | None = None) -> None:
        self.lanes, self.row = lanes, row
        self.event = event or self.event_now()  # digests computed together share one event

    @staticmethod
    def event_now() -> torch.cuda.Event:
        """An event recorded on the current stream (the one the lanes were queued on)."""
        event = torch.cuda.Event()
        event.record()
        return event

    def landing(self) -> torch.cuda.Event:
        return self.event

    def ready(self) -> bool:
        return self.event.query()

    def wait(self) -> None:
        self.event.synchronize()

    def finish(self, read: list[int], first: int):
        """Its value from ``read``, the digests of the values read back together, its lanes' from ``first`` on."""
        return read[first + (self.row or 0)]

    @classmethod
    def resolve_all(cls, values: list[DeviceDigest]) -> list:
        """The values, their lane tensors read back in one copy (each tensor once, however many rows it holds)."""
        from mini_engine.ops.checksum.triton import digests

        batches: dict[int, tuple[torch.Tensor, int]] = {}  # id(lanes) -> (lanes as [n, 2], its first row below)
        first = 0
        for v in values:
            if id(v.lanes) not in batches:
                batches[id(v.lanes)] = (v.lanes.view(-1, 2), first)
                first += batches[id(v.lanes)][0].shape[0]
        read = digests(read_landed([lanes for lanes, _ in batches.values()]))  # one copy back for the batch
        return [v.finish(read, batches[id(v.lanes)][1]) for v in values]


class DeviceDigests(DeviceDigest):
    """All the digests of a batch's ``lanes`` [n, 2], as one value: a list of n ints once read back (a step's rows
    made together, ``Instrumentation.emit_rows``)."""

    __slots__ = ()

    def __init__(self, lanes: torch.Tensor, event: torch.cuda.Event | None = None) -> None:
        super().__init__(lanes.view(-1, 2), event)

    def finish(self, read: list[int], first: int) -> list[int]:
        return read[first: first + self.lanes.shape[0]]


def read_landed(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The rows of ``tensors`` (each [n, k], one dtype) together on the host, for device tensors whose values have
    landed (the events of the work that wrote them have passed) and that nothing writes any more.

    A plain read-back (``.tolist()``, ``.cpu()``) is a copy on the current stream, so it waits for everything queued
    there, the steps launched since those values landed included: the host would stop running ahead of the device
    at every flush of the ledger. Here the copy runs on a stream of its own, which depends on nothing (the values
    are final), and only that stream is waited for. The tensors stay referenced until it has run, so the caching
    allocator cannot hand their memory to other work first."""
    if not tensors[0].is_cuda:
        return torch.cat(tensors)
    side = _reader(tensors[0].device)
    host = torch.empty((sum(t.shape[0] for t in tensors), *tensors[0].shape[1:]), dtype=tensors[0].dtype,
                       pin_memory=True)
    with torch.cuda.stream(side):
        rows = tensors[0] if len(tensors) == 1 else torch.cat(tensors)  # made and freed on the side stream
        host.copy_(rows, non_blocking=True)
    side.synchronize()
    return host


@functools.cache
def _reader(device: torch.device) -> torch.cuda.Stream:
    """The side stream ``read_landed`` copies on (one per device, made once)."""
    return torch.cuda.Stream(device)


def rows_lanes(table: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Lane sums [B, 2] of each row of a CUDA ``table`` [B, width] (32-bit elements), cut to ``lengths[b]``
    elements when given (a device int32 [B]); one launch, no sync."""
    from mini_engine.ops.checksum.triton import checksum_lanes

    rows = table.detach().contiguous()
    ids = torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device)
    if lengths is None:
        return checksum_lanes(pool=rows, slots=ids)
    return checksum_lanes(pool=rows.view(rows.shape[0], 1, rows.shape[1], 1), slots=ids, rows=lengths)
