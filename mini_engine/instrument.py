"""Instrumentation: the engine emits plain events to an optional sink; it never knows who listens.

An event is a flat dict with a ``type``, the host ``step``, a ``seq`` (emission order) and
JSON-serialisable fields. Host-side events (``alloc``, ``free``, ``snapshot_track``, ``donate``,
``transfer``, ``restore``, ``fork``, ``page_cow``, ``shared_page_write``, ``evict``, ``metadata_upload``, ``abort``,
``fault``) are emitted when the host decides; device-side events (``slot_write``,
``snapshot_write``, ``clone_written``, ``restore_read``, ``decode_metadata``,
``metadata_readback``) are emitted by the op itself when it *runs*, with checksums of the bytes
it wrote or read, so on the sim device ``seq`` is the order things really happened. With no sink,
``emit`` returns at once and callers guard expensive fields (checksums) with ``enabled``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Instrumentation", "Sink"]

Sink = Callable[[dict[str, Any]], None]


class Instrumentation:
    def __init__(self, sink: Sink | None = None) -> None:
        self.sink = sink
        self.step = 0
        self._seq = 0

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def emit(self, type_: str, **fields: Any) -> None:
        if self.sink is not None:
            self._seq += 1
            self.sink({"type": type_, "step": self.step, "seq": self._seq, **fields})
