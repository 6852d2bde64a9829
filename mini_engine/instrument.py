"""Instrumentation: the engine emits plain events to an optional sink; it never knows who listens.

An event is a flat dict with a ``type`` (``alloc``, ``snapshot_write``, ``donate``, ``clone``,
``restore``, ``page_cow``, ``metadata_upload``, ``metadata_readback``, ``evict``, ``free``,
``fault``, …) and JSON-serialisable fields. With no sink, ``emit`` returns at once and callers
guard expensive fields (checksums) with ``enabled``.
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

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def emit(self, type_: str, **fields: Any) -> None:
        if self.sink is not None:
            self.sink({"type": type_, "step": self.step, **fields})
