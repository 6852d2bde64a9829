"""The sim device: seeded, replayable interleavings that respect exactly the recorded dependencies."""

import pytest
import torch

from mini_engine.device import SimDevice, make_device


def trace(device):
    ran = []
    device.observers.append(lambda r: ran.append((r.stream, r.label)))
    return ran


def producer_consumer(seed, *, with_barrier):
    """Copy stream writes a value; compute stream reads it. Returns what the reader saw."""
    device = SimDevice(seed)
    copy, compute = device.stream("copy"), device.stream("compute")
    staged, resident, seen = torch.tensor([7.0]), torch.zeros(1), torch.zeros(1)
    device.copy(copy, resident, staged, label="upload")
    if with_barrier:
        uploaded = device.new_event()
        device.record(uploaded, copy)
        device.wait_event(compute, uploaded)
    device.launch(compute, lambda: seen.copy_(resident), label="kernel")
    device.synchronize()
    return float(seen)


def test_missing_barrier_races_and_barrier_orders():
    """Without a wait the kernel sometimes reads before the upload lands; with it, never."""
    unordered = {producer_consumer(seed, with_barrier=False) for seed in range(40)}
    assert unordered == {0.0, 7.0}
    assert {producer_consumer(seed, with_barrier=True) for seed in range(40)} == {7.0}


def schedule(seed):
    device = SimDevice(seed)
    ran = trace(device)
    streams = [device.stream(n) for n in ("a", "b", "c")]
    for i in range(6):
        for s in streams:
            device.launch(s, lambda: None, label=f"{s.name}{i}")
        device.progress()
    device.synchronize()
    return ran


def test_same_seed_same_interleaving_and_seeds_differ():
    """A seed fixes the interleaving; different seeds give different ones."""
    assert schedule(3) == schedule(3)
    assert len({tuple(schedule(s)) for s in range(8)}) > 1


def test_stream_order_is_fifo():
    """Ops of one stream always run in the order they were queued."""
    for seed in range(10):
        ran = schedule(seed)
        for name in "abc":
            labels = [label for stream, label in ran if stream == name]
            assert labels == [f"{name}{i}" for i in range(6)]


def test_copy_reads_its_source_when_it_runs():
    """A queued copy sees host changes made to its source before it runs."""
    device = SimDevice(0)
    stream = device.stream("copy")
    src, dst = torch.tensor([1.0]), torch.zeros(1)
    device.copy(stream, dst, src, label="h2d")
    src.fill_(2.0)
    device.synchronize(stream)
    assert float(dst) == 2.0


def test_readback_drains_its_stream_only_as_needed():
    """A readback returns the value after its stream's earlier ops, and may leave other streams queued."""
    leftovers = set()
    for seed in range(20):
        device = SimDevice(seed)
        a, b = device.stream("a"), device.stream("b")
        x = torch.zeros(1)
        device.launch(a, lambda: x.add_(1), label="inc")
        device.launch(b, lambda: None, label="other")
        assert float(device.readback(a, x, label="x")) == 1.0
        leftovers.add(device.pending())
    assert 1 in leftovers


def read_after_rerecord(seed):
    device = SimDevice(seed)
    a, b = device.stream("a"), device.stream("b")
    x, seen = torch.zeros(1), torch.zeros(1)
    event = device.new_event()
    device.launch(a, lambda: x.fill_(1), label="first")
    device.record(event, a)
    device.wait_event(b, event)
    device.launch(b, lambda: seen.copy_(x), label="read")
    device.launch(a, lambda: x.fill_(2), label="second")
    device.record(event, a)
    device.synchronize()
    return float(seen)


def test_wait_uses_the_record_current_at_call_time():
    """Re-recording an event after a wait was queued does not move that wait (CUDA semantics)."""
    assert {read_after_rerecord(seed) for seed in range(30)} == {1.0, 2.0}
    assert SimDevice(0).is_complete(SimDevice(0).new_event())


def test_progress_is_bounded_and_nonblocking():
    """progress() runs at most max_progress ready ops and never blocks on waits."""
    device = SimDevice(1, max_progress=3)
    s = device.stream("s")
    for i in range(10):
        device.launch(s, lambda: None, label=str(i))
    counts = [device.progress() for _ in range(3)]
    assert all(0 <= c <= 3 for c in counts) and device.pending() == 10 - sum(counts)


def test_make_device_names():
    """Only the two backends exist; a bad name is an error naming the choices."""
    assert make_device("sim", seed=5).seed == 5
    with pytest.raises(ValueError, match="'sim' or 'cuda'"):
        make_device("tpu")
