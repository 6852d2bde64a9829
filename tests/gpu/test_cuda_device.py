"""The cuda backend honours the same ordering contract as the sim on real streams."""

import torch

from mini_engine.device import make_device


def _fenced_upload_and_read(device, staged: torch.Tensor, resident: torch.Tensor, seen: torch.Tensor) -> None:
    """Upload on the copy stream, record, wait on the compute stream, read there: the read must see the upload."""
    copy, compute = device.stream("copy"), device.stream("compute")
    device.copy(copy, resident, staged, label="upload")
    uploaded = device.new_event()
    device.record(uploaded, copy)
    device.wait_event(compute, uploaded)
    device.launch(compute, lambda: seen.copy_(resident), label="read")
    assert torch.equal(device.readback(compute, seen, label="seen"), staged)
    device.synchronize()
    resident.zero_()
    device.synchronize()


def test_barrier_orders_upload_before_kernel():
    """With a recorded event and a wait, a kernel on another stream always sees the uploaded value."""
    device = make_device("cuda")
    staged = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    resident, seen = device.zeros(1 << 20), device.zeros(1 << 20)
    for _ in range(20):
        _fenced_upload_and_read(device, staged, resident, seen)


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


def test_the_nemesis_delays_streams_but_keeps_ordered_results():
    """A seeded device queues spin kernels before some ops; the barrier still orders the upload before the
    read (the same bits as without it), and an unfenced read on the other stream, racing a delayed upload,
    sees the previous contents at least once in 20 tries."""
    device = make_device("cuda", seed=11)
    copy, compute = device.stream("copy"), device.stream("compute")
    staged = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    resident, seen = device.zeros(1 << 16), device.zeros(1 << 16)
    stale = 0
    for _ in range(20):
        _fenced_upload_and_read(device, staged, resident, seen)
        device.copy(copy, resident, staged, label="upload, unfenced")
        device.launch(compute, lambda: seen.copy_(resident), label="read, unfenced")
        stale += not torch.equal(device.readback(compute, seen, label="seen"), staged)
        device.synchronize()
        resident.zero_()
    assert device.delays > 0
    assert stale > 0, "the nemesis never let the unfenced read run before its upload"


def test_rows_made_on_their_stream_keep_their_values_when_dropped_before_their_copy_runs():
    """``zeros(stream=)``, the ledger's digest rows (``engine.landing``): rows filled on a stream, then held there
    behind a long kernel before their copy to the host, dropped once the copy is queued and the next rows made at
    once: each copy lands the values it was queued behind. (Made on the default stream, which PyTorch's streams do
    not wait for, the next rows could take the dropped rows' memory and zero it while their copy was still queued.)"""
    device = make_device("cuda")
    stream = device.stream("compute")
    rows, hosts = device.zeros((16, 2), dtype=torch.long, stream=stream), []
    for i in range(16):
        host = torch.zeros((16, 2), dtype=torch.long, pin_memory=True)
        device.launch(stream, lambda rows=rows, value=i + 1: rows.fill_(value), label="digests")
        device.launch(stream, lambda: torch.cuda._sleep(2_000_000), label="forward")  # about a millisecond
        device.copy(stream, host, rows, label="rows to the host")
        hosts.append(host)
        del rows  # dropped before the next are made, as the runner drops a forward's early rows: their memory, maybe
        rows = device.zeros((16, 2), dtype=torch.long, stream=stream)
        device.synchronize()
    assert [sorted(set(h.flatten().tolist())) for h in hosts] == [[i + 1] for i in range(16)]
    assert not rows.any()  # the rows made last, filled by nothing: their zero fill ran
