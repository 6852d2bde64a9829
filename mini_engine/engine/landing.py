"""Where the slot ledger's device digests land on the host (CUDA): blocks of ``DigestRows`` (zeroed device rows the
digest kernels add their lane sums into, and their pinned host mirror), copied to the host behind the work that
filled them, and the ``Landing`` that passes once that copy has run.

A block is cut from rows made on the stream whose ops fill and copy it (``Device.zeros(stream=)``, ``DigestArena``).
PyTorch's streams do not wait for the default stream, so a block made there had its zero fill unordered with the ops
that add into it, and once dropped (its copy still queued) the caching allocator could hand its memory to the next
tensor made on the default stream, whose zero fill would run at once, ahead of that copy: the restore's digests would
land as zeros.
"""

from __future__ import annotations

import torch

from mini_engine.device import Device, Event, Stream
from mini_engine.instrument import Instrumentation
from mini_engine.ops.checksum.deferred import DigestRows

__all__ = ["DigestArena", "Landing", "lands_in_rows"]


def lands_in_rows(device: Device, instrumentation: Instrumentation) -> bool:
    """Whether the ledger's device digests land in ``DigestRows`` (on CUDA, with a sink), not as ints or each on its
    own."""
    return device.torch_device.type == "cuda" and instrumentation.enabled


class Landing:
    """Digest rows' landing (``DigestRows.landing``: ``query()``, ``synchronize()``): their copy to the host, complete
    once ``done`` is, the event recorded after that copy (whoever queues the copy sets it; asking before is a bug,
    not a wait: the rows would read as landed before the work that fills them had run). Rows of one block copied by
    successive ops on one stream (each clone's two) share it: ``done`` moves on to the last copy's event, which
    passes after the earlier ones'."""

    __slots__ = ("device", "done")

    def __init__(self, device: Device) -> None:
        self.device, self.done = device, None

    def query(self) -> bool:
        return self.device.is_complete(self._done())

    def synchronize(self) -> None:
        self.device.wait_host(self._done())

    def _done(self) -> Event:
        if self.done is None:
            raise RuntimeError("digests asked for before the copy they land with was queued")
        return self.done


class DigestArena:
    """Blocks of digest rows for work queued on ``stream``, cut in order from ``rows`` zeroed rows made there at a
    time (the module's docstring), with their host mirror (pinned on a GPU). No row is handed out twice, so each is
    zero until a digest adds into it. A block made on its own (device rows, a zero fill, pinned host rows), ~23 a
    0.8B run, cost 25 us of host time on an H200's host, a cut 5 (``benchmarks/pinned_transfers.py``). An arena used
    up is dropped for a fresh one: its device memory goes only to later work on ``stream`` once the blocks cut from
    it are gone, its host memory once the copies into it have run (torch's caching host allocator keeps a pinned
    block until the streams that copied through it have passed that point)."""

    __slots__ = ("_device", "_host", "_used", "device", "rows", "stream")

    def __init__(self, device: Device, stream: Stream, rows: int = 1024) -> None:
        if rows < 1:
            raise ValueError(f"a digest arena holds a row at least; got {rows}")
        self.device, self.stream, self.rows = device, stream, rows
        self._device = self._host = None
        self._used = rows

    def block(self, rows: int, landing: Landing | None = None) -> DigestRows:
        """``rows`` zeroed digest rows (at most the arena's), landing with ``landing`` (a new one by default)."""
        if not 0 < rows <= self.rows:
            raise ValueError(f"a digest block takes 1 to {self.rows} rows of its arena; asked for {rows}")
        if self._used + rows > self.rows:
            pinned = self.device.torch_device.type == "cuda"
            self._device = self.device.zeros((self.rows, 2), dtype=torch.long, stream=self.stream)
            self._host = torch.zeros((self.rows, 2), dtype=torch.long, pin_memory=pinned)
            self._used = 0
        first = self._used
        self._used += rows
        return DigestRows(self._device[first: self._used], self._host[first: self._used],
                          landing or Landing(self.device))
