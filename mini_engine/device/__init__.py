"""Device layer: streams, events, kernels and copies; ``sim`` (seeded, CPU) and ``cuda`` backends."""

from mini_engine.device.base import Device, DeviceError, Event, OpRecord, Stream
from mini_engine.device.sim import SimDevice

__all__ = ["Device", "DeviceError", "Event", "OpRecord", "SimDevice", "Stream", "make_device"]


def make_device(name: str = "sim", *, seed: int = 0) -> Device:
    """``sim`` (seeded; the default on CPU) or ``cuda`` (seed 0: the GPU's own timing; else seeded stream delays)."""
    if name == "sim":
        return SimDevice(seed)
    if name == "cuda":
        from mini_engine.device.cuda import CudaDevice

        return CudaDevice(seed=seed)
    raise ValueError(f"device must be 'sim' or 'cuda'; got {name!r}")
