"""Pinned host memory for the small transfers a step makes, cut from arenas rather than allocated one at a time.

A non-blocking copy between host and GPU needs page-locked host memory (from pageable memory the copy waits for
everything queued on its stream). ``Tensor.pin_memory()`` and ``torch.empty(pin_memory=True)`` go through torch's
caching host allocator, whose every allocation takes its lock, polls the events of blocks freed while a copy still
used them and fills a free list: 14-22 us a call on the H100 hosts here (torch.profiler and cProfile, sessions 13-15),
3,000 or so a 0.8B run (each layer of a prefill forward uploads its rows). ``PinnedArena`` hands out views of one
pinned allocation instead, in order, never the same bytes twice: a view stays valid for as long as anything holds
it (it keeps the allocation alive), and a copy queued from or into it has run before the allocator reuses that
memory (torch records the copy's stream against the allocation's block and waits for it when the block is freed).
An arena used up is dropped for a fresh one: the allocator recycles its block once every view is gone and every
copy through it has run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

__all__ = ["ARENA_BYTES", "PinnedArena", "pinned_empty", "stage"]

ARENA_BYTES = 1 << 20  # one arena: some thousands of a step's uploads (a few hundred bytes each)
_ALIGN = 64  # each view starts on a 64-byte boundary (a cache line; any element type's alignment)


class PinnedArena:
    """Views of pinned host memory cut from arenas of ``nbytes`` (``alloc(nbytes)``: a uint8 tensor, pinned by
    default), in order; a request over a sixteenth of an arena gets an allocation of its own. Thread-safe (the
    server's engine runs in a thread of its own)."""

    def __init__(self, nbytes: int = ARENA_BYTES, alloc: Callable[[int], torch.Tensor] | None = None) -> None:
        if nbytes < 16 * _ALIGN:
            raise ValueError(f"an arena holds {16 * _ALIGN} bytes at least; got {nbytes}")
        self.nbytes = nbytes
        self.arenas = 0  # arenas allocated so far
        self._alloc = alloc or _pinned_bytes
        self._arena: torch.Tensor | None = None
        self._used = nbytes
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised pinned tensor of ``shape`` and ``dtype``: a copy's destination (or source, once filled)."""
        count = 1
        for size in shape:
            count *= size
        nbytes = count * dtype.itemsize
        if not nbytes or nbytes > self.nbytes // 16:
            return self._alloc(nbytes).view(dtype).view(shape)
        with self._lock:
            start = self._used
            if start + nbytes > self.nbytes:
                self._arena, self.arenas, start = self._alloc(self.nbytes), self.arenas + 1, 0
            self._used = start + (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            arena = self._arena
        return arena[start: start + nbytes].view(dtype).view(shape)

    def stage(self, host: torch.Tensor) -> torch.Tensor:
        """A pinned copy of ``host`` (a CPU tensor; made contiguous), ready for a non-blocking upload; the caller's
        tensor may change at once."""
        staged = self.empty(tuple(host.shape), host.dtype)
        staged.copy_(host)
        return staged


def _pinned_bytes(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


_ARENA = PinnedArena()


def stage(host: torch.Tensor) -> torch.Tensor:
    """``PinnedArena.stage`` on the process's arena."""
    return _ARENA.stage(host)


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``PinnedArena.empty`` on the process's arena."""
    return _ARENA.empty(shape, dtype)
