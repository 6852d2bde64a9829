"""``sim``: a deterministic, seeded, asynchronous device on the CPU.

Every op is queued on its stream and runs later. Whenever ops must run — a ``progress()`` call at
a host step boundary, or a blocking ``readback`` / ``synchronize`` — a seeded scheduler picks the
next op among the *ready* heads of all streams (a head is ready unless it is a wait on an
incomplete event). So the device may run a copy stream's upload before or after the compute
stream's next kernel exactly when the program left the two unordered, and two runs with the same
seed and the same program interleave identically: every race is replayable.

``progress()`` runs a seeded number of ready ops (sometimes none, sometimes all): the host never
knows how far the device has got, as on real hardware.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mini_engine.device.base import Device, DeviceError, Event, OpRecord, Stream

__all__ = ["SimDevice"]


@dataclass(eq=False)
class _Op:
    kind: str  # "kernel" | "copy" | "wait"
    label: str
    run: Callable[[], None]
    waits_for: Event | None = None


class SimDevice(Device):
    name = "sim"
    torch_device = torch.device("cpu")

    def __init__(self, seed: int = 0, *, max_progress: int = 8) -> None:
        super().__init__()
        self.seed = seed
        self.max_progress = max_progress
        self._rng = random.Random(seed)
        self._streams: dict[str, Stream] = {}
        self._queues: dict[Stream, deque[_Op]] = {}
        self._queued: dict[Stream, int] = {}  # ops ever queued per stream
        self._done: dict[Stream, int] = {}  # ops ever run per stream
        self._events = 0
        self.ops_run = 0

    def stream(self, name: str) -> Stream:
        if name not in self._streams:
            stream = Stream(name, len(self._streams))
            self._streams[name] = stream
            self._queues[stream], self._queued[stream], self._done[stream] = deque(), 0, 0
        return self._streams[name]

    def new_event(self) -> Event:
        self._events += 1
        return Event(self._events)

    def record(self, event: Event, stream: Stream) -> None:
        event.stream, event.position = stream, self._queued[stream]

    def wait_event(self, stream: Stream, event: Event) -> None:
        """As in CUDA, the wait is for the event's *latest record at call time* (a later re-record does not move it)."""
        frozen = Event(event.index, event.stream, event.position)
        self._enqueue(stream, _Op("wait", f"wait:event{event.index}", lambda: None, frozen))

    def launch(self, stream: Stream, fn: Callable[[], None], *, label: str) -> None:
        self._enqueue(stream, _Op("kernel", label, fn))

    def copy(self, stream: Stream, dst: torch.Tensor, src: torch.Tensor, *, label: str) -> None:
        self._enqueue(stream, _Op("copy", label, lambda: dst.copy_(src)))

    def readback(self, stream: Stream, src: torch.Tensor, *, label: str) -> torch.Tensor:
        target = self._queued[stream]
        self._run_until(lambda: self._done[stream] >= target, f"readback {label!r} on {stream.name}")
        return src.detach().clone()

    def wait_host(self, event: Event) -> None:
        self._run_until(lambda: self.is_complete(event), f"wait_host(event{event.index})")

    def synchronize(self, stream: Stream | None = None) -> None:
        streams = list(self._queues) if stream is None else [stream]
        targets = {s: self._queued[s] for s in streams}
        self._run_until(lambda: all(self._done[s] >= n for s, n in targets.items()), "synchronize")

    def is_complete(self, event: Event) -> bool:
        return event.stream is None or self._done[event.stream] >= event.position

    def progress(self) -> int:
        """Run a seeded number (0..max_progress) of ready ops; never blocks, never raises."""
        budget, ran = self._rng.randint(0, self.max_progress), 0
        while ran < budget and self._step():
            ran += 1
        return ran

    def pending(self) -> int:
        """Ops queued but not yet run, over all streams."""
        return sum(len(q) for q in self._queues.values())

    def _enqueue(self, stream: Stream, op: _Op) -> None:
        if stream.name not in self._streams:
            raise DeviceError(f"stream {stream.name!r} does not belong to this device")
        self._queues[stream].append(op)
        self._queued[stream] += 1

    def _ready(self) -> list[Stream]:
        return [s for s, q in self._queues.items()
                if q and (q[0].waits_for is None or self.is_complete(q[0].waits_for))]

    def _step(self) -> bool:
        ready = self._ready()
        if not ready:
            return False
        stream = ready[self._rng.randrange(len(ready))]
        op = self._queues[stream].popleft()
        op.run()
        self._done[stream] += 1
        self.ops_run += 1
        self._notify(OpRecord(self.ops_run, stream.name, op.label, op.kind))
        return True

    def _run_until(self, condition: Callable[[], bool], what: str) -> None:
        # Waits only ever name already-queued ops, so a stall means the simulator itself is broken.
        while not condition():
            if not self._step():
                blocked = {s.name: q[0].label for s, q in self._queues.items() if q}
                raise DeviceError(f"{what} can never complete: every stream is blocked ({blocked})")
