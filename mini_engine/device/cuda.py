"""``cuda``: the same interface on real ``torch.cuda`` streams and events.

Kernels run their ``fn`` at once under the stream's context, so the GPU orders them exactly as the
sim would have to: by stream order and recorded events only. Device tensors shared across streams
are allocated up front by the engine (pools), so the caching allocator never recycles memory that
another stream still reads, and their zero fills, queued on the default stream (which torch's
streams, created non-blocking, do not wait for), are waited for once when the engine is built. A
tensor made later for one stream's ops is made on that stream (``zeros(stream=)``): made on the
default stream, its memory, once dropped, could go to the next tensor made there while that
stream's ops on it were still queued (the ledger's digest rows until session 28).

``seed`` 0 leaves the GPU its own timing. Any other seed adds a nemesis, the real-streams analogue
of the sim's seeded scheduler: before an op, with probability one half, the stream it goes on first
runs a spin kernel of a seeded length (up to ``max_delay_us``), as if that stream were busy with
other work (a copy stream behind bulk transfers, a compute stream behind a long kernel). Only *when*
each stream gets to its ops changes; what they compute and the order the program asked for stay, so
a correct program gives the same bits under any seed, and an unordered pair of ops on two streams
meets in either order.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from mini_engine.device.base import Device, DeviceError, Event, OpRecord, Stream

__all__ = ["CudaDevice"]

_CYCLES_PER_US = 1980  # torch.cuda._sleep counts SM clock ticks: the H100/H200 boost clock (elsewhere delays scale)


class CudaDevice(Device):
    name = "cuda"

    def __init__(self, index: int = 0, *, seed: int = 0, max_delay_us: float = 500.0) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise DeviceError("the cuda device needs a CUDA build of torch and a GPU; use device='sim' on CPU")
        if max_delay_us < 0:
            raise ValueError(f"max_delay_us must be >= 0; got {max_delay_us}")
        self.torch_device = torch.device("cuda", index)
        self.seed = seed
        self._rng = random.Random(seed) if seed else None
        self._max_delay_cycles = int(max_delay_us * _CYCLES_PER_US)
        self.delays = 0  # spin kernels the nemesis queued
        self._streams: dict[str, tuple[Stream, torch.cuda.Stream]] = {}
        self._events: dict[int, torch.cuda.Event] = {}
        self._seq = 0

    def stream(self, name: str) -> Stream:
        if name not in self._streams:
            handle = torch.cuda.Stream(device=self.torch_device)
            self._streams[name] = (Stream(name, len(self._streams)), handle)
        return self._streams[name][0]

    def _handle(self, stream: Stream) -> torch.cuda.Stream:
        if stream.name not in self._streams:
            raise DeviceError(f"stream {stream.name!r} does not belong to this device")
        return self._streams[stream.name][1]

    def new_event(self) -> Event:
        event = Event(len(self._events) + 1)
        self._events[event.index] = torch.cuda.Event()
        return event

    def record(self, event: Event, stream: Stream) -> None:
        event.stream = stream
        self._events[event.index].record(self._handle(stream))

    def wait_event(self, stream: Stream, event: Event) -> None:
        if event.stream is not None:
            self._handle(stream).wait_event(self._events[event.index])

    def zeros(self, *shape: int, dtype: torch.dtype = torch.float32, stream: Stream | None = None) -> torch.Tensor:
        if stream is None:
            return super().zeros(*shape, dtype=dtype)
        with torch.cuda.stream(self._handle(stream)):  # (the caching allocator keys the memory to this stream)
            return torch.zeros(*shape, dtype=dtype, device=self.torch_device)

    def launch(self, stream: Stream, fn: Callable[[], None], *, label: str) -> None:
        with torch.cuda.stream(self._handle(stream)):
            self._delay()
            fn()
        self._issued(stream, label, "kernel")

    def copy(self, stream: Stream, dst: torch.Tensor, src: torch.Tensor, *, label: str) -> None:
        with torch.cuda.stream(self._handle(stream)):
            self._delay()
            dst.copy_(src, non_blocking=True)
        self._issued(stream, label, "copy")

    def _delay(self) -> None:
        """The nemesis (seed != 0): a seeded spin on the current stream, half the time."""
        if self._rng is not None and self._max_delay_cycles and self._rng.random() < 0.5:
            torch.cuda._sleep(self._rng.randrange(self._max_delay_cycles))
            self.delays += 1

    def readback(self, stream: Stream, src: torch.Tensor, *, label: str) -> torch.Tensor:
        handle = self._handle(stream)
        with torch.cuda.stream(handle):
            host = src.detach().to("cpu", non_blocking=False)
        handle.synchronize()
        return host

    def wait_host(self, event: Event) -> None:
        if event.stream is not None:
            self._events[event.index].synchronize()

    def synchronize(self, stream: Stream | None = None) -> None:
        if stream is None:
            torch.cuda.synchronize(self.torch_device)
        else:
            self._handle(stream).synchronize()

    def is_complete(self, event: Event) -> bool:
        return event.stream is None or self._events[event.index].query()

    def _issued(self, stream: Stream, label: str, kind: str) -> None:
        """On CUDA, observers learn of ops when they are issued (the GPU does not report runs)."""
        self._seq += 1
        self._notify(OpRecord(self._seq, stream.name, label, kind))
