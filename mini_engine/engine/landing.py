"""Where the slot ledger's device digests land on the host (CUDA): blocks of ``DigestRows`` (zeroed device rows the
digest kernels add their lane sums into, and their pinned host mirror), copied to the host behind the work that
filled them, and the ``Landing`` that passes once that copy has run.

A block is made on the stream whose ops fill and copy it (``Device.zeros(stream=)``). PyTorch's streams do not wait
for the default stream, so a block made there had its zero fill unordered with the ops that add into it, and once
dropped (its copy still queued) the caching allocator could hand its memory to the next tensor made on the default
stream, whose zero fill would run at once, ahead of that copy: the restore's digests would land as zeros.
"""

from __future__ import annotations

import torch

from mini_engine.device import Device, Event, Stream
from mini_engine.instrument import Instrumentation
from mini_engine.ops.checksum.deferred import DigestRows

__all__ = ["Landing", "digest_block", "lands_in_rows"]


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


def digest_block(device: Device, stream: Stream, rows: int, landing: Landing | None = None) -> DigestRows:
    """``rows`` zeroed digest rows for work queued on ``stream``, made there (the module's docstring), with a host
    mirror (pinned on a GPU), landing with ``landing`` (a new one by default)."""
    pinned = device.torch_device.type == "cuda"
    return DigestRows(device.zeros((rows, 2), dtype=torch.long, stream=stream),
                      torch.zeros((rows, 2), dtype=torch.long, pin_memory=pinned), landing or Landing(device))
