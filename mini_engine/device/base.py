"""The device interface: streams, events, kernels and copies, behind one API with two backends.

All device work of the engine — forwards, snapshot writes, restores, clones, metadata uploads and
readbacks — is issued here, so that a missing barrier produces a *real* reordering:

- ``sim`` (``mini_engine.device.sim``) queues every op and runs it later, in an order a seeded
  scheduler picks among the orders that the recorded dependencies allow. A copy reads its source
  when it runs, not when it was queued. Same seed, same interleaving.
- ``cuda`` (``mini_engine.device.cuda``) issues the same calls on real ``torch.cuda`` streams.

Ordering rules, the same on both backends (they are CUDA's):
- ops on one stream run in the order they were queued;
- ``record(event, stream)`` marks the ops queued on ``stream`` so far; the event completes when they
  have all run; ``wait_event(stream, event)`` makes later ops on ``stream`` wait for it;
- ``readback`` blocks the host until the ops queued on its stream before it have run, then
  returns a host copy; ``wait_host(event)`` blocks until one event is complete; ``synchronize``
  blocks until everything (or one stream) has run.
Nothing else orders two streams.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Device", "DeviceError", "Event", "OpRecord", "Stream"]


class DeviceError(RuntimeError):
    """A device misuse or an unsatisfiable wait (e.g. a cycle of cross-stream waits)."""


@dataclass(frozen=True)
class Stream:
    name: str
    index: int


@dataclass(eq=False)
class Event:
    """A point in one stream's queue; complete once every op queued there before it has run."""

    index: int
    stream: Stream | None = None
    position: int = -1  # ops queued on ``stream`` when recorded; -1: never recorded (always complete)


@dataclass(frozen=True)
class OpRecord:
    """What an observer learns when an op runs (for instrumentation; never needed for correctness)."""

    seq: int  # global order in which ops *ran*
    stream: str
    label: str
    kind: str  # "kernel" | "copy" | "wait"


class Device(ABC):
    """One accelerator (or its simulation). Tensors made by ``empty``/``zeros`` live on it."""

    name: str
    torch_device: torch.device

    def __init__(self) -> None:
        self.observers: list[Callable[[OpRecord], None]] = []

    @abstractmethod
    def stream(self, name: str) -> Stream:
        """The stream called ``name``, created on first use."""

    @abstractmethod
    def new_event(self) -> Event: ...

    @abstractmethod
    def record(self, event: Event, stream: Stream) -> None:
        """Mark ``event`` at the current end of ``stream``'s queue (re-recording moves it)."""

    @abstractmethod
    def wait_event(self, stream: Stream, event: Event) -> None:
        """Ops queued on ``stream`` after this call run only once ``event`` is complete."""

    @abstractmethod
    def launch(self, stream: Stream, fn: Callable[[], None], *, label: str) -> None:
        """Queue a kernel: ``fn`` reads and writes device tensors when it runs."""

    @abstractmethod
    def copy(self, stream: Stream, dst: torch.Tensor, src: torch.Tensor, *, label: str) -> None:
        """Queue ``dst.copy_(src)`` (H2D, D2D): ``src`` is read when the copy runs."""

    @abstractmethod
    def readback(self, stream: Stream, src: torch.Tensor, *, label: str) -> torch.Tensor:
        """Blocking D2H: wait for ``stream``'s earlier ops, then return a host copy of ``src``."""

    @abstractmethod
    def wait_host(self, event: Event) -> None:
        """Block the host until ``event`` is complete (and nothing more: later ops may still be queued)."""

    @abstractmethod
    def synchronize(self, stream: Stream | None = None) -> None:
        """Block until every op (or every op of ``stream``) queued so far has run."""

    @abstractmethod
    def is_complete(self, event: Event) -> bool: ...

    def empty(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device=self.torch_device)

    def zeros(self, *shape: int, dtype: torch.dtype = torch.float32, stream: Stream | None = None) -> torch.Tensor:
        """Zeros on the device. ``stream``: the stream whose ops use the tensor (on a GPU it is made there: its zero
        fill is ordered before them, and its memory, once dropped, goes only to later work on that stream)."""
        return torch.zeros(*shape, dtype=dtype, device=self.torch_device)

    def progress(self) -> int:
        """Let the device run some queued work without blocking the host; returns ops run (0 on cuda)."""
        return 0

    def _notify(self, record: OpRecord) -> None:
        for observer in self.observers:
            observer(record)
