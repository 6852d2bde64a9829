"""The cuda backend honours the same ordering contract as the sim on real streams."""

import torch

from mini_engine.device import make_device


def test_barrier_orders_upload_before_kernel():
    """With a recorded event and a wait, a kernel on another stream always sees the uploaded value."""
    device = make_device("cuda")
    copy, compute = device.stream("copy"), device.stream("compute")
    staged = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    resident, seen = device.zeros(1 << 20), device.zeros(1 << 20)
    for _ in range(20):
        device.copy(copy, resident, staged, label="upload")
        uploaded = device.new_event()
        device.record(uploaded, copy)
        device.wait_event(compute, uploaded)
        device.launch(compute, lambda: seen.copy_(resident), label="read")
        assert torch.equal(device.readback(compute, seen, label="seen"), staged)
        resident.zero_()
        device.synchronize()


def test_readback_and_events():
    """readback returns the value after the stream's earlier work; events complete after synchronize."""
    device = make_device("cuda")
    stream = device.stream("compute")
    x = device.zeros(4)
    device.launch(stream, lambda: x.add_(3), label="inc")
    done = device.new_event()
    device.record(done, stream)
    assert device.readback(stream, x, label="x").tolist() == [3.0] * 4
    device.synchronize()
    assert device.is_complete(done)
