"""Checksums on a GPU without stalling the host: the digest lands on the host behind the work that computed it.

On CUDA a ledger checksum is a ``DeviceDigest``: the Triton kernel's lane sums ([2] int64,
``triton.checksum_lanes``; ``rows_lanes`` for the rows of a table), copied into pinned host memory by a copy
queued right behind the kernel, and an event after that copy (``on_host``): the same digest
``reference.slot_checksum`` gives on the CPU; ``DeviceDigests`` is all of a batch's as one value (a decode
step's rows, made together). The instrumentation queues rows holding one and, once their events have passed,
joins the lanes a whole flush holds in one pass on the host (``mini_engine.instrument``): a flush makes no
device call, so it never waits behind the steps queued since. A check that must land in a device tensor (the
logits') is ``triton.row_digests``.

A forward's digests need no copy or event of their own: ``DigestRows`` are rows the batch's results tensor
holds beyond its tokens, zeroed with them, which the digest kernels fill on the device and the batch's one results
copy brings to the host (``ModelRunner.launch``); they land when the batch's tokens do. A restore's and a clone's
take rows of a block made for them (``mini_engine.engine.landing``).
"""

from __future__ import annotations

import numpy as np
import torch

from mini_engine.instrument import Deferred
from mini_engine.ops.checksum.reference import join_lane_rows

__all__ = ["DeviceDigest", "DeviceDigests", "DigestRows", "on_host", "rows_lanes"]


class DeviceDigest(Deferred):
    """A 64-bit digest whose lane sums land in ``lanes`` when ``event`` passes: ``lanes`` [2] int64, or row ``row`` of
    a batch's ``lanes`` [n, 2] (the batch's digests keep one tensor, not a view each: a step makes dozens). On a GPU
    ``lanes`` is pinned host memory: ``on_host``'s copy (``each_of`` makes a batch's digests so) or a batch's results
    (``DigestRows``). ``event``: anything with ``query()`` and ``synchronize()``, one object for the digests that
    land together."""

    __slots__ = ("event", "lanes", "row")

    def __init__(self, lanes: torch.Tensor, event: torch.cuda.Event, row: int | None = None) -> None:
        self.lanes, self.event, self.row = lanes, event, row  # digests computed together share one event

    @classmethod
    def each_of(cls, lanes: torch.Tensor) -> list[DeviceDigest]:
        """The digests of a batch's ``lanes`` [n, 2], which the current stream is computing (``on_host``)."""
        host, done = on_host(lanes)
        return [cls(host, done, i) for i in range(host.shape[0])]

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

    def end(self) -> int:
        """The rows of ``lanes`` (as [n, 2]) its value reads: up to its own."""
        return (self.row or 0) + 1

    def finish(self, read: list[int], first: int):
        """Its value from ``read``, the digests of the values read back together, its lanes' from ``first`` on."""
        return read[first + (self.row or 0)]

    @classmethod
    def resolve_all(cls, values: list[DeviceDigest]) -> list:
        """The values, their lanes joined in one pass: each tensor once, however many values read it, up to the last
        row one reads (a batch's digest rows are as many as it could take); lanes on the host make no device call,
        and are joined as numpy arrays (torch's slices and concatenation cost about twice as much a flush)."""
        batches: dict[int, list] = {}  # id(lanes) -> [lanes, the rows read]
        for v in values:
            end, batch = v.end(), batches.get(id(v.lanes))
            if batch is None:
                batches[id(v.lanes)] = [v.lanes, end]
            elif end > batch[1]:
                batch[1] = end
        firsts, first, arrays = {}, 0, []  # id(lanes) -> its first row in the joined read
        for key, (lanes, end) in batches.items():
            firsts[key], first = first, first + end
            arrays.append(lanes.numpy().reshape(-1, 2)[:end])
        read = join_lane_rows(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
        return [v.finish(read, firsts[id(v.lanes)]) for v in values]


class DeviceDigests(DeviceDigest):
    """The digests of ``count`` rows of a batch's ``lanes`` [n, 2] from row ``row`` (all of them by default), as one
    value: a list of ints once read back (a step's rows made together, ``Instrumentation.emit_rows``)."""

    __slots__ = ("count",)

    def __init__(self, lanes: torch.Tensor, event: torch.cuda.Event, row: int = 0, count: int | None = None) -> None:
        lanes = lanes.view(-1, 2)
        super().__init__(lanes, event, row)
        self.count = lanes.shape[0] - row if count is None else count

    @classmethod
    def all_of(cls, lanes: torch.Tensor) -> DeviceDigests:
        """The digests of ``lanes`` [n, 2], which the current stream is computing (``on_host``)."""
        return cls(*on_host(lanes))

    def end(self) -> int:
        return self.row + self.count

    def finish(self, read: list[int], first: int) -> list[int]:
        first += self.row
        return read[first: first + self.count]


class DigestRows:
    """Rows of lane sums that land with a batch's results (the module's docstring): ``device`` [n, 2] int64, zeroed,
    and its ``host`` mirror, which the batch's results copy fills; ``landing`` passes when it has (``query()``,
    ``synchronize()``). ``take(k)`` hands out the next k device rows, for a digest launch to add its lane sums
    into (or a copy to fill), and their first row's index; ``each_of`` and ``all_of`` are the digests of rows
    taken. Taking more rows than there are is an error: the batch sized them from its items."""

    __slots__ = ("device", "host", "landing", "taken")

    def __init__(self, device: torch.Tensor, host: torch.Tensor, landing) -> None:
        if device.shape != host.shape or device.shape[1:] != (2,) or device.dtype != torch.int64:
            raise ValueError(f"digest rows are int64 [n, 2] on the device and on the host; got {device.dtype} "
                             f"{tuple(device.shape)} and {tuple(host.shape)}")
        self.device, self.host, self.landing, self.taken = device, host, landing, 0

    @property
    def left(self) -> int:
        """Rows not taken yet."""
        return self.device.shape[0] - self.taken

    def take(self, k: int) -> tuple[torch.Tensor, int]:
        first = self.taken
        if first + k > self.device.shape[0]:
            raise RuntimeError(f"{k} more digest rows asked of a batch's {self.device.shape[0]}, {first} taken: the "
                               "batch's count of its digests is short")
        self.taken += k
        return self.device[first: first + k], first

    def each_of(self, first: int, k: int) -> list[DeviceDigest]:
        return [DeviceDigest(self.host, self.landing, first + i) for i in range(k)]

    def all_of(self, first: int, k: int) -> DeviceDigests:
        return DeviceDigests(self.host, self.landing, first, k)


def on_host(lanes: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event]:
    """``lanes``, which the current stream is computing, copied into pinned host memory by a copy queued now behind
    that work, and an event recorded after the copy: once it has passed the host reads the values with no device
    call. (A read-back at the ledger's flush, ``.tolist()`` on the compute stream, would wait for everything
    queued there since: the host would stop running ahead of the device at every flush.) Replaces the clone a
    graph's outputs needed: its next replay overwrites them after this copy has read them."""
    host = torch.empty(lanes.shape, dtype=lanes.dtype, pin_memory=True)
    host.copy_(lanes, non_blocking=True)
    return host, DeviceDigest.event_now()


def rows_lanes(table: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Lane sums [B, 2] of each row of a CUDA ``table`` [B, width] (32-bit elements), cut to ``lengths[b]``
    elements when given (a device int32 [B]); one launch, no sync."""
    from mini_engine.ops.checksum.triton import checksum_lanes

    rows = table.detach().contiguous()
    ids = torch.arange(rows.shape[0], dtype=torch.int32, device=rows.device)
    if lengths is None:
        return checksum_lanes(pool=rows, slots=ids)
    return checksum_lanes(pool=rows.view(rows.shape[0], 1, rows.shape[1], 1), slots=ids, rows=lengths)
