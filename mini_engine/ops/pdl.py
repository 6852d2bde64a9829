"""Programmatic dependent launches (PDL) for the decode step's Triton kernels (Hopper on).

In a CUDA graph each kernel pays a fixed cost of its own between the end of the kernel before it and its
own start: about 3 us on an H100, whatever it streams (session 12), and a decode step is some 250 kernels.
A kernel launched as a programmatic dependent launch may start while the kernel before it still runs: it
waits at its first statement (``griddepcontrol.wait``: until that kernel has finished and its writes are
visible), then at once lets the kernel after it launch (``griddepcontrol.launch_dependents``), which waits
in turn. Every read and write of such a kernel comes after its wait, so the stream's order is kept and the
bits are the same; only the launch's own latency overlaps the kernel before. A kernel after one that never
lets it launch early (cuBLAS, a torch op) starts when that one ends, as without PDL.

    with pdl.launches(True):     # the decode step: its Triton kernels launched as dependent launches
        kernel[grid](..., **pdl.options())   # a launcher: {"PDL": True, "launch_pdl": True}, or {}

    @triton.jit
    def kernel(..., PDL: tl.constexpr = False):
        pdl.begin(PDL)           # the kernel's first statement

``launches`` is a context variable (per thread): a launcher outside one launches as usual. Whether a device
can: ``supported``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import triton
import triton.language as tl

try:  # sm_90 on; in triton.language.extra.cuda from triton 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older triton: no dependent launches
    gdc_launch_dependents = gdc_wait = None

__all__ = ["available", "begin", "launches", "options", "supported"]

_ON: ContextVar[bool] = ContextVar("pdl", default=False)


def available() -> bool:
    """Whether this triton can emit the wait and the early launch (3.4 on)."""
    return gdc_wait is not None


def supported(device: torch.device | str) -> str | None:
    """None if ``device`` can run dependent launches, else why not (a message that says what is missing)."""
    device = torch.device(device)
    if not available():
        return f"programmatic dependent launches need triton 3.4 or later; this is triton {triton.__version__}"
    if device.type != "cuda":
        return f"programmatic dependent launches run on a CUDA GPU; got device {device}"
    capability = torch.cuda.get_device_capability(device)
    if capability < (9, 0):
        return f"programmatic dependent launches need compute capability 9.0 (Hopper) or later; got {capability}"
    return None


@contextmanager
def launches(enabled: bool) -> Iterator[None]:
    """Inside, ``options()`` makes the launchers that take it launch dependently (``enabled``) or not."""
    token = _ON.set(enabled)
    try:
        yield
    finally:
        _ON.reset(token)


def options(*, always: bool = False) -> dict:
    """A launch's keyword arguments: the kernel's ``PDL`` flag and the launch attribute, inside ``launches(True)``
    or ``always``; nothing otherwise (the attribute is part of a compile's key: a plain launch stays the plain
    compile)."""
    return {"PDL": True, "launch_pdl": True} if always or _ON.get() else {}


@triton.jit
def begin(PDL: tl.constexpr):
    """A dependent launch's first statement: wait for the kernel before to finish, then let the next launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
