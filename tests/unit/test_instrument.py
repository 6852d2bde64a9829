"""Instrumentation with device values still in flight: rows reach the sink in ``seq`` order, each once its own
and every earlier row's deferred values have landed, read back together per kind."""

import pytest

from mini_engine.instrument import Deferred, Instrumentation


class Landing(Deferred):
    """A deferred int that lands when the test says so; counts how its values were read."""

    reads: list[int] = []

    def __init__(self, value: int) -> None:
        self.value, self.landed = value, False

    def ready(self) -> bool:
        return self.landed

    def wait(self) -> None:
        self.landed = True

    @classmethod
    def resolve_all(cls, values):
        assert all(v.landed for v in values), "a value was read before it landed"
        cls.reads.append(len(values))
        return [v.value for v in values]


@pytest.fixture
def rows():
    Landing.reads = []
    return []


def test_rows_wait_for_their_values_and_keep_their_order(rows):
    events = Instrumentation(rows.append)
    first, second = Landing(11), Landing(22)
    events.emit("host", n=1)
    events.emit("slot_write", checksum=first)
    events.emit("host", n=2)  # behind a waiting row: it waits too
    events.emit("slot_write", checksum=second)
    assert [r["type"] for r in rows] == ["host"] and events.pending == 3
    second.landed = True
    events.flush()
    assert len(rows) == 1, "a landed row must not overtake an earlier one still in flight"
    first.landed = True
    events.flush()
    assert [(r["seq"], r.get("checksum", r.get("n"))) for r in rows] == [(1, 1), (2, 11), (3, 2), (4, 22)]
    assert events.pending == 0 and Landing.reads == [2], "the landed values are read back in one batch"


def test_flush_wait_delivers_everything(rows):
    events = Instrumentation(rows.append)
    events.emit("restore_read", src_checksum=Landing(5), checksum=Landing(6))
    events.flush(wait=True)
    assert rows[0]["src_checksum"] == 5 and rows[0]["checksum"] == 6 and events.pending == 0


class Shared(Deferred):
    """A deferred int landing with an event it shares with others (``landing``); the event counts its queries."""

    def __init__(self, value: int, event: "Event") -> None:
        self.value, self.event = value, event

    def landing(self):
        return self.event

    def ready(self) -> bool:
        self.event.queries += 1
        return self.event.done

    def wait(self) -> None:
        self.event.waits += 1
        self.event.done = True

    @classmethod
    def resolve_all(cls, values):
        return [v.value for v in values]


class Event:
    def __init__(self) -> None:
        self.done, self.queries, self.waits = False, 0, 0


def test_values_that_land_together_are_asked_once_per_flush(rows):
    """A batch's digests share one event: a flush asks it once, not once per value; ``flush(wait=True)`` waits on
    it once; and a second event still in flight holds back its rows and every row after them."""
    events = Instrumentation(rows.append)
    batch, later = Event(), Event()
    for n in range(6):
        events.emit("slot_write", checksum=Shared(n, batch), src_checksum=Shared(10 + n, batch))
    events.emit("slot_write", checksum=Shared(99, later))
    events.emit("host")
    events.flush()
    assert batch.queries == 1 and rows == [], "one question for the twelve values of one landing"
    batch.done = True
    events.flush()
    assert [r["checksum"] for r in rows] == list(range(6)) and batch.queries == 2 and later.queries == 1
    assert events.pending == 2
    events.flush(wait=True)
    assert later.waits == 1 and [r["type"] for r in rows[6:]] == ["slot_write", "host"] and events.pending == 0


def test_without_a_sink_nothing_queues():
    events = Instrumentation()
    events.emit("slot_write", checksum=Landing(1))
    assert events.pending == 0


def test_device_digests_resolve_to_the_reference_digests():
    """The ledger's deferred digests (lane sums of table rows cut to their lengths, as the runner takes them)
    read back to ``slot_checksum`` of the same bytes, one row each (``DeviceDigest``) or a batch's all together
    (``DeviceDigests``), both kinds in one read-back."""
    import torch

    from mini_engine.ops.checksum import slot_checksum
    from mini_engine.ops.checksum.deferred import DeviceDigest, DeviceDigests, rows_lanes

    class Done:  # an event that has completed
        def query(self):
            return True

        def synchronize(self):
            pass

    table = torch.randint(0, 1 << 30, (3, 5), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    lengths = [5, 2, 0]
    lanes = rows_lanes(table, torch.tensor(lengths, dtype=torch.int32))
    want = [slot_checksum(row[:n]) for row, n in zip(table, lengths)]
    digests = [DeviceDigest(lanes, Done(), r) for r in range(3)]  # rows of one batch's lanes
    assert all(d.ready() for d in digests) and DeviceDigest.resolve_all(digests) == want
    whole = rows_lanes(table)
    batches = [DeviceDigests(lanes[1:], Done()), DeviceDigests(whole, Done())]
    assert DeviceDigests.resolve_all(batches) == [want[1:], [slot_checksum(row) for row in table]]
    # both kinds, a batch's rows, a lone digest's lanes and whole batches, in one call (as a flush reads them back)
    mixed = [digests[2], batches[1], DeviceDigest(lanes[1], Done()), batches[0], digests[0]]
    whole_want = [slot_checksum(row) for row in table]
    assert DeviceDigest.resolve_all(mixed) == [want[2], whole_want, want[1], want[1:], want[0]]


def test_kinds_that_share_a_read_back_are_read_back_in_one_call(rows):
    """A subclass that keeps its parent's ``resolve_all`` (``DeviceDigests`` of ``DeviceDigest``) is read back in the
    same call as the parent's values, one copy a flush; a kind with its own ``resolve_all`` gets its own call."""
    calls = []

    class Counted(Shared):
        @classmethod
        def resolve_all(cls, values):
            calls.append(sorted(type(v).__name__ for v in values))
            return [v.value for v in values]

    class Flag(Counted):
        pass

    events = Instrumentation(rows.append)
    done = Event()
    done.done = True
    events.emit("slot_write", checksum=Counted(1, done), match=Flag(2, done))
    events.emit("decode_metadata", read_checksum=Flag(3, done), other=Shared(4, done))
    events.flush()
    assert calls == [["Counted", "Flag", "Flag"]]
    assert [(r.get("checksum"), r.get("match"), r.get("read_checksum"), r.get("other")) for r in rows] == [
        (1, 2, None, None), (None, None, 3, 4)]


def test_a_steps_rows_take_their_seqs_when_emitted_and_are_made_once_their_value_lands(rows):
    """``emit_rows``: a step's rows queue as one, numbered when emitted, made by ``build`` from their one value
    only once it has landed (read back with the other landed values), and the rows after them wait."""
    events = Instrumentation(rows.append)
    made = []
    digests = Landing([7, 8])

    def build(values, step, seq):
        made.append(values)
        return [{"type": "slot_write", "step": step, "seq": seq, "slot": 1, "checksum": values[0]},
                {"type": "decode_metadata", "step": step, "seq": seq + 1, "read_checksum": values[1]}]

    events.emit("host", n=1)
    events.emit_rows(2, digests, build)
    events.emit("restore_read", checksum=Landing(9))
    assert [r["type"] for r in rows] == ["host"] and events.pending == 3 and made == []
    digests.landed = True
    events.flush()
    assert made == [[7, 8]] and events.pending == 1 and Landing.reads == [1]
    events.flush(wait=True)
    assert [(r["seq"], r["type"], r.get("checksum", r.get("read_checksum", r.get("n")))) for r in rows] == [
        (1, "host", 1), (2, "slot_write", 7), (3, "decode_metadata", 8), (4, "restore_read", 9)]
    assert rows[1] == {"type": "slot_write", "step": 0, "seq": 2, "slot": 1, "checksum": 7}


def test_rows_of_host_values_go_at_once_unless_rows_wait_before_them(rows):
    events = Instrumentation(rows.append)
    events.emit_rows(1, [5], lambda v, step, seq: [{"type": "slot_write", "step": step, "seq": seq, "checksum": v[0]}])
    assert [(r["seq"], r["checksum"]) for r in rows] == [(1, 5)]
    events.emit("restore_read", checksum=Landing(6))
    events.emit_rows(1, [7], lambda v, step, seq: [{"type": "slot_write", "step": step, "seq": seq, "checksum": v[0]}])
    assert len(rows) == 1 and events.pending == 2
    events.flush(wait=True)
    assert [(r["seq"], r["checksum"]) for r in rows] == [(1, 5), (2, 6), (3, 7)]


def test_a_step_must_make_the_rows_it_promised(rows):
    """Its seqs were taken when it was emitted: making more or fewer rows, or numbering them otherwise, would break
    the numbering."""
    events = Instrumentation(rows.append)
    with pytest.raises(RuntimeError, match="promised 2 rows and made 1"):
        events.emit_rows(2, [5], lambda v, step, seq: [{"type": "slot_write", "step": step, "seq": seq}])
    with pytest.raises(RuntimeError, match=r"numbered 2..3; their seqs are 3..4"):
        events.emit_rows(2, [5], lambda v, step, seq: [{"type": "a", "seq": seq - 1}, {"type": "b", "seq": seq}])
    unused = []
    Instrumentation().emit_rows(2, [5], lambda *v: unused.append(v) or [])
    assert unused == [], "without a sink nothing is made"


def test_digest_rows_hand_out_their_rows_once_and_read_back_as_the_batchs_digests():
    """``DigestRows``: a batch's digests written into rows of its results (here by copies of ``rows_lanes``, as the
    decode step's are) read back from the host mirror as each row's and a run of rows' reference digests, the rows
    not taken staying out of them; asking for more rows than the batch has, or rows of the wrong shape, is refused
    with what went wrong."""
    import torch

    from mini_engine.ops.checksum import slot_checksum
    from mini_engine.ops.checksum.deferred import DeviceDigest, DigestRows, rows_lanes

    class Copied:  # the batch's results copy: the host mirror is filled when it is asked whether it landed
        def __init__(self, device, host):
            self.device, self.host, self.queries = device, host, 0

        def query(self):
            self.queries += 1
            self.host.copy_(self.device)
            return True

        def synchronize(self):
            self.host.copy_(self.device)

    table = torch.randint(0, 1 << 30, (4, 6), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    want = [slot_checksum(row) for row in table]
    device, host = torch.zeros((7, 2), dtype=torch.int64), torch.zeros((7, 2), dtype=torch.int64)
    landing = Copied(device, host)
    rows = DigestRows(device, host, landing)
    out, first = rows.take(3)
    out.copy_(rows_lanes(table[:3]))
    single, second = rows.take(1)
    single.copy_(rows_lanes(table[3:]))
    assert (first, second, rows.taken) == (0, 3, 4)
    values = [rows.all_of(first, 3), *rows.each_of(second, 1), *rows.each_of(first + 1, 2)]
    assert all(v.landing() is landing for v in values) and values[1].ready()
    assert DeviceDigest.resolve_all(values) == [want[:3], want[3], want[1], want[2]]
    with pytest.raises(RuntimeError, match="4 more digest rows asked of a batch's 7, 4 taken"):
        rows.take(4)
    assert rows.taken == 4, "a refused take takes nothing"
    with pytest.raises(ValueError, match=r"int64 \[n, 2\]"):
        DigestRows(device[:, :1], host[:, :1], landing)


def _recorded_length(calls: list[bytes]):
    """A digest's stand-in for ``Later``: the bytes' length, each call recorded in ``calls``."""
    def digest(data: bytes) -> int:
        calls.append(data)
        return len(data)

    return digest


def test_a_later_field_is_computed_at_the_flush_and_its_row_keeps_its_place(rows):
    """A ``Later`` field is host work moved into the flush: its row waits (and rows after it) until a flush, which
    computes it once however many fields hold it, beside device values of other kinds, and delivers in ``seq``
    order."""
    from mini_engine.instrument import Later

    calls = []
    digest = _recorded_length(calls)
    events = Instrumentation(rows.append)
    device = Landing(7)
    staged = Later(digest, b"abc")
    events.emit("metadata_readback", staged=staged, readback=staged)  # one value, two fields
    events.emit("host", n=1)
    events.emit("slot_write", checksum=device)
    assert rows == [] and calls == [] and events.pending == 3
    events.flush()  # the device value has not landed: the rows before it go
    assert [(r["type"], r.get("staged"), r.get("readback")) for r in rows] == [("metadata_readback", 3, 3),
                                                                                ("host", None, None)]
    assert calls == [b"abc"] and events.pending == 1
    device.landed = True
    events.flush()
    assert [r["seq"] for r in rows] == [1, 2, 3] and rows[-1]["checksum"] == 7 and calls == [b"abc"]


def test_a_later_held_by_two_rows_flushed_apart_is_computed_once(rows):
    """A donate row and its ``reference_state`` row share one ``Later`` prefix: when a device value that has not
    landed sits between them, the first row goes at one flush and the second at a later one, with the same value,
    computed once."""
    from mini_engine.instrument import Later

    calls = []
    digest = _recorded_length(calls)
    events = Instrumentation(rows.append)
    device = Landing(5)
    prefix = Later(digest, b"prefix")
    events.emit("donate", prefix=prefix)
    events.emit("slot_write", checksum=device)
    events.emit("reference_state", prefix=prefix)
    events.flush()
    assert [(r["type"], r["prefix"]) for r in rows] == [("donate", 6)] and calls == [b"prefix"]
    device.landed = True
    events.flush()
    assert [(r["type"], r.get("prefix")) for r in rows] == [("donate", 6), ("slot_write", None),
                                                            ("reference_state", 6)]
    assert calls == [b"prefix"]


def test_a_flush_with_an_end_goes_a_chunk_at_a_time_and_stops_there(rows, monkeypatch):
    """``flush(until=)`` delivers ``FLUSH_CHUNK_ROWS`` rows at a time (a step's ``emit_rows`` counting as its rows),
    asks ``until`` only between chunks with rows left, and once it is true leaves the rest queued and says so; the
    next flush delivers them, in ``seq`` order, each value read once."""
    from mini_engine import instrument

    monkeypatch.setattr(instrument, "FLUSH_CHUNK_ROWS", 3)
    events = Instrumentation(rows.append)
    device = Landing(9)
    events.emit("slot_write", checksum=device)  # everything waits behind it
    for i in range(4):
        events.emit("host", i=i)
    events.emit_rows(3, device, lambda digest, step, seq: [{"type": "step", "step": step, "seq": seq + j,
                                                            "checksum": digest} for j in range(3)])
    events.emit("host", i=4)
    device.landed = True
    asked = []
    assert events.flush(until=lambda: asked.append(len(rows)) or len(asked) == 2) is False
    # the second chunk: two rows, then the step's three (they go together)
    assert asked == [3, 8] and [r["seq"] for r in rows] == list(range(1, 9)) and events.pending == 1
    assert rows[0]["checksum"] == 9
    assert events.flush(until=lambda: asked.append(len(rows)) or False) is True  # the rest: one chunk, no question
    assert asked == [3, 8] and [r["seq"] for r in rows] == list(range(1, 10)) and events.pending == 0
    assert [r.get("checksum") for r in rows[5:8]] == [9, 9, 9]
    assert events.flush(until=lambda: True) is True  # nothing queued
