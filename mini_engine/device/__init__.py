"""Device layer: streams, events, kernels and copies; ``sim`` (seeded, CPU) and ``cuda`` backends."""

import functools
from typing import TYPE_CHECKING

from mini_engine.device.base import Device, DeviceError, Event, OpRecord, Stream
from mini_engine.device.sim import SimDevice

if TYPE_CHECKING:
    import torch

__all__ = ["Device", "DeviceError", "Event", "OpRecord", "SimDevice", "Stream", "make_device", "row_indices",
           "unavailable", "upload"]


def make_device(name: str = "sim", *, seed: int = 0) -> Device:
    """``sim`` (seeded; the default on CPU) or ``cuda`` (seed 0: the GPU's own timing; else seeded stream delays)."""
    if name == "sim":
        return SimDevice(seed)
    if name == "cuda":
        from mini_engine.device.cuda import CudaDevice

        return CudaDevice(seed=seed)
    raise ValueError(f"device must be 'sim' or 'cuda'; got {name!r}")


def unavailable(name: str) -> str | None:
    """Why the device ``name`` cannot run on this machine, or None when it can (checked before anything starts)."""
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ("cuda needs a CUDA build of torch and a visible GPU; this machine has neither "
                    "(use the default, the simulated device)")
    return None


def upload(host, device):
    """``host`` (a tensor) on ``device`` without synchronising: a CPU tensor bound for a GPU goes through pinned
    memory, non-blocking, on the current stream (a plain copy from pageable memory waits for everything queued
    there, so the host stops running ahead of the device: 31 waits in one 0.8B prefill forward, measured, as
    many as it made such uploads). The caching host allocator keeps the pinned copy until the transfer has run,
    and the caller's tensor may change at once. Anything else is ``host.to(device)``."""
    import torch

    device = torch.device(device)
    if host.device.type == "cpu" and device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


@functools.lru_cache(maxsize=64)
def row_indices(n: int, device) -> "torch.Tensor":
    """``arange(n)`` in int32 on ``device``, made once per (n, device) and shared: a kernel's row table for a batch
    that reads its sequences in order (every layer of a forward asks for the same one). Read it, never write it."""
    import torch

    return torch.arange(n, dtype=torch.int32, device=device)
