"""Resident decode metadata: clean steps pay nothing, dirty shards are fenced, and the fault is a real race."""

from collections import deque

import pytest
import torch

from mini_engine.device import SimDevice
from mini_engine.engine.metadata import (
    MetadataFenceError,
    ResidentDecodeMetadata,
    gather_shards,
)
from mini_engine.instrument import Instrumentation

SHAPE = (4, 8)  # max_batch, pages: two shards of four columns
SEEDS = range(50)


class FakeCopyWorker(SimDevice):
    """The seed's fake async copy worker: an H2D copy is held until a readback drains the worker.

    The first ``lost_races`` readbacks run before the drain (they see the old bytes; the copy is
    still in flight) and later ones land every held copy, FIFO, on the copy's own stream.
    ``lost_races=None`` is a copy that never lands: the worker drops it. Every device call is
    logged in ``calls``, so a test can prove that nothing at all was queued.
    """

    def __init__(self, lost_races: int | None = 0) -> None:
        super().__init__(seed=0)
        self.lost_races = lost_races
        self.calls: list[str] = []
        self._in_flight: deque = deque()

    def copy(self, stream, dst, src, *, label):
        self.calls.append("copy")
        self._in_flight.append((stream, dst, src, label))

    def readback(self, stream, src, *, label):
        self.calls.append("readback")
        if self.lost_races is None:
            self._in_flight.clear()
        elif self.lost_races > 0:
            self.lost_races -= 1
        else:
            while self._in_flight:
                held_stream, dst, held_src, held_label = self._in_flight.popleft()
                super().copy(held_stream, dst, held_src, label=held_label)
        return super().readback(stream, src, label=label)

    def wait_event(self, stream, event):
        self.calls.append("wait_event")
        super().wait_event(stream, event)

    def record(self, event, stream):
        self.calls.append("record")
        super().record(event, stream)

    def launch(self, stream, fn, *, label):
        self.calls.append("launch")
        super().launch(stream, fn, label=label)

    def synchronize(self, stream=None):
        self.calls.append("synchronize")
        super().synchronize(stream)


def table(base):
    """A distinct, nonzero page table per ``base``."""
    return torch.arange(SHAPE[0] * SHAPE[1], dtype=torch.int32).reshape(SHAPE) + 100 * base


def metadata(device, **kwargs):
    return ResidentDecodeMetadata(device, device.stream("copy"), SHAPE, **kwargs)


def read_table(device, meta, buffer, shards):
    """Launch a kernel on the compute stream that reads ``buffer``; mark it dispatched; return its view."""
    seen, compute = [], device.stream("compute")
    device.launch(compute, lambda: seen.append(gather_shards(shards).clone()), label=f"decode:b{buffer}")
    dispatched = device.new_event()
    device.record(dispatched, compute)
    meta.mark_dispatched(buffer, dispatched)
    return seen


def assert_each_shard_is(seen, old, new):
    """Every shard a kernel read is exactly its old or its new content: ordering, never garbage."""
    for got, before, after in zip(seen.chunk(2, dim=1), old.chunk(2, dim=1), new.chunk(2, dim=1)):
        assert torch.equal(got, before) or torch.equal(got, after)


def test_clean_step_queues_no_device_op():
    """The same table twice: the second prepare makes no device call at all and uploads nothing."""
    device = FakeCopyWorker()
    meta = metadata(device)
    first = meta.prepare(0, table(1))
    device.calls.clear()
    second = meta.prepare(0, table(1))
    assert device.calls == []
    assert (first.uploaded_shards, second.uploaded_shards) == ((0, 1), ())
    assert (second.readbacks, second.retries, meta.clean_skips, meta.uploads) == (0, 0, 2, 2)


def test_changed_shard_uploads_only_that_shard():
    """One changed column range re-uploads its shard only; the device then holds the new table."""
    device = FakeCopyWorker()
    meta = metadata(device)
    meta.prepare(0, table(1))
    changed = table(1)
    changed[2, 5] = 999
    device.calls.clear()
    result = meta.prepare(0, changed)
    assert result.uploaded_shards == (1,)
    assert device.calls == ["copy", "readback"]
    assert torch.equal(gather_shards(result.shards), changed)


def test_keys_are_per_buffer():
    """A table clean in buffer 0 is still dirty in buffer 1, and the two buffers never share memory."""
    device = FakeCopyWorker()
    meta = metadata(device)
    zero = meta.prepare(0, table(1))
    one = meta.prepare(1, table(1))
    assert one.uploaded_shards == (0, 1)
    assert all(a.data_ptr() != b.data_ptr() for a in zero.shards for b in one.shards)


def test_invalidate_marks_every_key_dirty():
    """After invalidate() the same table uploads every shard again."""
    meta = metadata(FakeCopyWorker())
    meta.prepare(0, table(1))
    meta.invalidate()
    assert not meta.is_clean(0, 0)
    assert meta.prepare(0, table(1)).uploaded_shards == (0, 1)


def test_late_copy_retries_then_clean():
    """A readback that loses the race mismatches, the shard is re-uploaded, and only then marked clean."""
    device = FakeCopyWorker(lost_races=1)
    meta = metadata(device)
    result = meta.prepare(0, table(1))
    assert (result.uploaded_shards, result.retries, result.readbacks) == ((0, 1), 1, 3)
    assert device.calls == ["copy", "readback", "copy", "readback", "copy", "readback"]
    assert torch.equal(gather_shards(result.shards), table(1))
    assert meta.prepare(0, table(1)).uploaded_shards == ()


def test_readback_events_disagree_exactly_on_a_mismatch():
    """metadata_readback carries match and both checksums; they differ on the lost race, agree after. The staged
    checksum is computed when the rows are flushed (``Later``): until then the sink has the rows before the first
    readback row, none after it (rows reach it in order)."""
    events = []
    instrumentation = Instrumentation(events.append)
    meta = metadata(FakeCopyWorker(lost_races=1), instrumentation=instrumentation)
    meta.prepare(0, table(1))
    assert [e["type"] for e in events] == ["metadata_upload"] and instrumentation.pending == 5
    instrumentation.flush()
    uploads = [(e["shard"], e["attempt"]) for e in events if e["type"] == "metadata_upload"]
    readbacks = [e for e in events if e["type"] == "metadata_readback"]
    assert uploads == [(0, 1), (0, 2), (1, 1)]
    assert [(e["shard"], e["match"]) for e in readbacks] == [(0, False), (0, True), (1, True)]
    assert [e["readback_checksum"] == e["staged_checksum"] for e in readbacks] == [False, True, True]


@pytest.mark.parametrize("max_attempts", [1, 3, 5])
def test_copy_that_never_lands_fails_loudly_and_stays_dirty(max_attempts):
    """A dropped copy raises after exactly max_attempts uploads; the key stays dirty and re-uploads later."""
    device = FakeCopyWorker(lost_races=None)
    meta = metadata(device, max_attempts=max_attempts)
    with pytest.raises(MetadataFenceError, match=rf"buffer=0 shard=0.* {max_attempts} upload attempts"):
        meta.prepare(0, table(1))
    assert (meta.uploads, meta.readbacks, meta.retries) == (max_attempts, max_attempts, max_attempts - 1)
    assert not meta.is_clean(0, 0)
    device.lost_races = 0
    assert meta.prepare(0, table(1)).uploaded_shards == (0, 1)


def kernel_after_prepare(seed, *, fence):
    """Prepare old, let it land, prepare new, launch a kernel at once; return what the kernel read."""
    device = SimDevice(seed)
    meta = metadata(device, fence=fence, predecessor=fence)
    meta.prepare(0, table(1))
    device.synchronize()
    seen = read_table(device, meta, 0, meta.prepare(0, table(2)).shards)
    device.synchronize()
    return seen[0]


def test_fence_on_kernel_always_reads_the_new_table():
    """With the fence, a kernel launched right after prepare reads the new table on every seed."""
    for seed in SEEDS:
        assert torch.equal(kernel_after_prepare(seed, fence=True), table(2)), f"seed {seed}"


def test_fence_off_kernel_sometimes_reads_the_stale_table_never_garbage():
    """Without the fence the upload really races the kernel: some seed reads the previous table exactly."""
    reads = [kernel_after_prepare(seed, fence=False) for seed in SEEDS]
    for seen in reads:
        assert_each_shard_is(seen, table(1), table(2))
    assert any(torch.equal(seen, table(1)) for seen in reads)
    assert any(torch.equal(seen, table(2)) for seen in reads)


def earlier_kernel_view(seed, *, predecessor):
    """A kernel reads buffer 0 (table 1) and has not run when buffer 0 is re-prepared with table 2."""
    device = SimDevice(seed)
    meta = metadata(device, predecessor=predecessor)
    seen = read_table(device, meta, 0, meta.prepare(0, table(1)).shards)
    meta.prepare(0, table(2))
    device.synchronize()
    return seen[0]


def test_predecessor_keeps_the_earlier_kernel_on_its_own_table():
    """With the per-buffer predecessor, the upload into a buffer waits for the kernel that read it."""
    for seed in SEEDS:
        assert torch.equal(earlier_kernel_view(seed, predecessor=True), table(1)), f"seed {seed}"


def test_without_predecessor_the_earlier_kernel_sees_newer_content():
    """Without the predecessor wait, some seed's earlier kernel reads the next step's mappings."""
    reads = [earlier_kernel_view(seed, predecessor=False) for seed in SEEDS]
    for seen in reads:
        assert_each_shard_is(seen, table(1), table(2))
    assert any(not torch.equal(seen, table(1)) for seen in reads)


def test_predecessor_wait_is_queued_once_per_dispatch():
    """The copy stream waits on a buffer's last dispatch once; a later dirty prepare adds no second wait."""
    device = FakeCopyWorker()
    meta = metadata(device)
    read_table(device, meta, 0, meta.prepare(0, table(1)).shards)
    device.calls.clear()
    meta.prepare(0, table(2))
    meta.prepare(0, table(3))
    assert device.calls.count("wait_event") == 1


@pytest.mark.parametrize("bad_table, message", [
    (torch.zeros(4, 6, dtype=torch.int32), "table"),
    (torch.zeros(SHAPE, dtype=torch.int64), "table"),
    ([[0] * 8] * 4, "table"),
])
def test_bad_table_is_rejected_by_name(bad_table, message):
    """A table of the wrong shape, dtype or type raises an error naming `table`."""
    with pytest.raises((TypeError, ValueError), match=message):
        metadata(SimDevice()).prepare(0, bad_table)


@pytest.mark.parametrize("buffer", [-1, 2, 1.0])
def test_buffer_out_of_range_is_rejected_by_name(buffer):
    """prepare and mark_dispatched refuse a buffer outside [0, n_buffers), naming `buffer`."""
    meta = metadata(SimDevice())
    with pytest.raises(ValueError, match="buffer"):
        meta.prepare(buffer, table(1))
    with pytest.raises(ValueError, match="buffer"):
        meta.mark_dispatched(buffer, SimDevice().new_event())


@pytest.mark.parametrize("kwargs, message", [
    ({"table_shape": (4, 7)}, "n_shards"),
    ({"table_shape": (0, 8)}, "table_shape"),
    ({"table_shape": (4, 8), "n_buffers": 0}, "n_buffers"),
    ({"table_shape": (4, 8), "max_attempts": 0}, "max_attempts"),
])
def test_bad_config_is_rejected_by_name(kwargs, message):
    """Indivisible pages, empty shapes and non-positive counts raise errors naming the argument."""
    device = SimDevice()
    with pytest.raises(ValueError, match=message):
        ResidentDecodeMetadata(device, device.stream("copy"), **kwargs)


def test_a_staged_content_is_digested_once_for_every_buffer_it_is_uploaded_to(monkeypatch):
    """Double buffering stages each new table into both buffers: the ledger's staged checksum of a content is
    computed once (by content, not by buffer) and every readback row of it carries the same value, the digest of
    those bytes; a new content is digested anew."""
    from mini_engine.engine import metadata as module
    from mini_engine.ops.checksum import checksum_bytes, slot_checksum

    digested = []
    monkeypatch.setattr(module, "checksum_bytes", lambda data: digested.append(data) or checksum_bytes(data))
    events = []
    instrumentation = Instrumentation(events.append)
    meta = metadata(SimDevice(), instrumentation=instrumentation)
    for buffer, content in ((0, 1), (1, 1), (0, 2), (1, 2)):
        meta.prepare(buffer, table(content))
    assert digested == []  # when the rows are flushed
    instrumentation.flush()
    readbacks = [e for e in events if e["type"] == "metadata_readback"]
    shards = [t for c in (1, 2) for t in table(c).chunk(2, dim=1)]
    assert len(readbacks) == 8 and digested == [shard.contiguous().numpy().tobytes() for shard in shards]
    assert [e["staged_checksum"] for e in readbacks] == [slot_checksum(shards[i].contiguous())
                                                        for i in (0, 1, 0, 1, 2, 3, 2, 3)]
