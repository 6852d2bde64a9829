"""Digest rows from laps (``ops.checksum.laps``): in order, never handed out twice, one lap in use per stream; and the
ledger's read-back of rows viewed from one tensor (``DeviceDigest.resolve_all``). The CUDA side is in
``tests/gpu/test_engine_cuda.py``."""

from types import SimpleNamespace

import torch

from mini_engine.ops.checksum import laps
from mini_engine.ops.checksum.deferred import DeviceDigest, DeviceDigests
from mini_engine.ops.checksum.reference import join_lanes


def _stream(handle: int, device: int = 0):
    return SimpleNamespace(cuda_stream=handle, device_index=device, device=torch.device("cpu"))


def _laps(made: list):
    def allocate(rows, device):
        made.append(rows)
        return torch.zeros((rows, 2), dtype=torch.int64)

    return laps._Laps(allocate)


def test_rows_come_in_order_from_one_lap_until_it_is_used_up(monkeypatch):
    """Consecutive takes on a stream are consecutive rows of one lap; a take that does not fit starts the next lap
    (the rest of the last one is left); more rows than a lap holds are a tensor of their own."""
    monkeypatch.setattr(laps, "LAP_ROWS", 8)
    made = []
    rows = _laps(made)
    stream = _stream(7)
    a, b = rows.take(3, stream), rows.take(4, stream)
    assert a._base is b._base and a.storage_offset() == 0 and b.storage_offset() == 3 * 2 and made == [8]
    c = rows.take(2, stream)  # 7 + 2 > 8: a new lap
    assert c._base is not a._base and c.storage_offset() == 0 and made == [8, 8]
    big = rows.take(9, stream)
    assert big.shape == (9, 2) and big._base is None and made == [8, 8, 9]
    d = rows.take(1, stream)  # the lap in use is still the second
    assert d._base is c._base and d.storage_offset() == 2 * 2
    monkeypatch.setattr(laps, "LAP_ROWS", 64)  # a lap keeps its own length: the one in use ends at its 8 rows
    e = rows.take(6, stream)
    assert e.shape == (6, 2) and e._base is not c._base and made == [8, 8, 9, 64]


def test_no_row_is_handed_out_twice_and_streams_have_laps_of_their_own(monkeypatch):
    """Writing every row taken, across streams (the same handle on two devices is two streams) and laps, never
    writes a row another take holds."""
    monkeypatch.setattr(laps, "LAP_ROWS", 16)
    rows = _laps([])
    streams = [_stream(0, 0), _stream(0, 1), _stream(5, 0)]
    taken = []
    for i in range(60):
        t = rows.take(1 + i % 5, streams[i % 3])
        t.fill_(i + 1)
        taken.append((i + 1, t))
    assert all(bool((t == value).all()) for value, t in taken)
    assert {id(t._base) for i, (_, t) in enumerate(taken) if i % 3 == 0}.isdisjoint(
        {id(t._base) for i, (_, t) in enumerate(taken) if i % 3 == 1})


def test_zeroed_rows_off_a_gpu_are_zeros():
    rows = laps.zeroed_rows(3, torch.device("cpu"))
    assert rows.shape == (3, 2) and rows.dtype == torch.int64 and not rows.any()


def test_digests_viewed_from_one_tensor_read_back_together_across_gaps_and_in_any_order():
    """Values whose lanes are rows of one tensor (a lap) are read once, from the first row of theirs to the last,
    rows between them that no value holds included; values of another tensor beside them, in any order."""
    class Done:
        def query(self):
            return True

    lap = torch.arange(40, dtype=torch.int64).view(20, 2) * 1009
    other = torch.arange(6, dtype=torch.int64).view(3, 2) + 3
    want = [join_lanes(tuple(pair)) for pair in lap.tolist()]
    values = [DeviceDigests(lap[12:15], Done()), DeviceDigest(lap[3], Done()), DeviceDigest(other, Done(), 2),
              DeviceDigest(lap[5:9], Done(), 1), DeviceDigests(other[:2], Done())]
    assert DeviceDigest.resolve_all(values) == [
        want[12:15], want[3], join_lanes((7, 8)), want[6], [join_lanes((3, 4)), join_lanes((5, 6))]]
