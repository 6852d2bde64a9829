"""Slot fences order every cross-stream use of a slot; without them the sim device really races."""

import torch

from mini_engine.device import SimDevice
from mini_engine.engine.fences import SlotFences


def clone_then_restore(seed, fenced):
    """Copy stream clones slot 1 -> 2 (donation); compute stream restores 2 -> 3 (admission)."""
    device = SimDevice(seed)
    copy, compute = device.stream("copy"), device.stream("compute")
    fences = SlotFences(device)
    slots = torch.tensor([0.0, 5.0, 0.0, 0.0])

    def op(stream, src, dst):
        if fenced:
            fences.before(stream, [src, dst])
        device.launch(stream, lambda: slots.__setitem__(dst, slots[src].item()), label=f"{src}->{dst}")
        fences.after(stream, [src, dst])

    op(copy, 1, 2)
    op(compute, 2, 3)
    device.synchronize()
    return float(slots[3])


def test_fenced_restore_always_sees_the_clone():
    """With fences the restore reads the cloned snapshot on every seed."""
    assert {clone_then_restore(seed, fenced=True) for seed in range(30)} == {5.0}


def test_unfenced_restore_can_read_the_stale_slot():
    """Without them some seed runs the restore first and reads the slot's old content (never garbage)."""
    assert {clone_then_restore(seed, fenced=False) for seed in range(30)} == {0.0, 5.0}


def test_completed_events_cost_no_wait():
    """Once the other stream's op has run, later ops on the slot queue no wait at all."""
    device = SimDevice(0)
    copy, compute = device.stream("copy"), device.stream("compute")
    fences = SlotFences(device)
    device.launch(copy, lambda: None, label="clone")
    fences.after(copy, [4])
    device.synchronize()
    fences.before(compute, [4])
    assert fences.waits == 0
