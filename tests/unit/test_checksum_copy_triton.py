"""Triton slot checksum and batched slot copy match their references bit for bit (in the interpreter on CPU)."""

import pytest
import torch

from mini_engine.ops.checksum import slot_checksum as reference_checksum
from mini_engine.ops.checksum.triton import slot_checksum, slot_checksums
from mini_engine.ops.slot_copy.triton import copy_slots
from tests.unit.kernel_support import (
    check_copy_slots,
    check_row_digests,
    check_slot_checksums,
    check_state_copy,
    check_state_digest,
    check_state_memo,
    random_pool,
)

SMALL_STATE = dict(n_slots=9, layers=2, conv=(13, 3), rec=(3, 8, 5), width=11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(6, 2, 7), (5, 3, 7, 10), (3, 1, 9000)], ids=str)
def test_pool_checksums_equal_reference(shape, dtype):
    """Digests of whole slots and of their first rows equal slot_checksum, over several chunks too (9000 words)."""
    check_slot_checksums(shape=shape, dtype=dtype, device="cpu")


def test_state_digest_composes_from_segments():
    """The conv | rec | pending digest of a slot is the sum of three segments' lanes with word offsets."""
    check_state_digest(device="cpu", **SMALL_STATE)


def test_the_memos_digests_are_the_read_back_digests():
    check_state_memo(device="cpu", **SMALL_STATE)


def test_the_storages_lanes_are_the_ledgers_digests_of_its_slots():
    """``StateStorage.lanes`` (what the ledger digests on a GPU, here in the interpreter) reads back to the reference
    digest of each (slot, length)'s bytes, a slot listed twice at two lengths and a 64-multiple among them; its
    byte count is the bytes those states hold."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.storage import StateStorage
    from mini_engine.model.builtin import builtin_config
    from mini_engine.ops.checksum.triton import digests

    states = StateStorage(builtin_config("tiny-random"), 4, SimDevice())
    gen = torch.Generator().manual_seed(6)
    for pool in (states.conv, states.rec, states.pending):
        pool.copy_(torch.randn(pool.shape, generator=gen))
    slots, lengths = [3, 1, 3, 4], [70, 128, 5, 63]
    assert digests(states.lanes(slots, lengths)) == [reference_checksum(states.slot_bytes(s, n))
                                                     for s, n in zip(slots, lengths)]
    assert [states.nbytes(n) for n in lengths] == [states.slot_bytes(1, n).nbytes for n in lengths]


def test_a_whole_state_written_back_keeps_the_memo_only_if_its_digested_bytes_are_the_same_bits():
    """``StateStorage.write`` of a state one token on (the reference decode's write-back) keeps the slot's memo when
    rec and the rows it digested compare equal bit for bit, and the next digest reads conv and the new row; a
    write that changes any of those bits (0.0 to -0.0 in rec, one word of an old row) forgets it. Every digest
    equals the read-back one."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.storage import StateStorage
    from mini_engine.model import SequenceState
    from mini_engine.model.builtin import builtin_config

    states = StateStorage(builtin_config("tiny-random"), 2, SimDevice())
    gen = torch.Generator().manual_seed(8)
    for pool in (states.conv, states.rec, states.pending):
        pool.copy_(torch.randn(pool.shape, generator=gen))
    states.rec[1, 0, 0, 0, 0] = 0.0
    slot, memo = 1, states.memo

    def state(length, **change):
        conv, rec, pending = (t.clone() for t in states.read(slot, length - 1))
        pending = torch.cat([pending, torch.randn(pending.shape[0], 1, pending.shape[2], generator=gen)], dim=1)
        for name, edit in change.items():
            edit({"rec": rec, "pending": pending}[name])
        return SequenceState(length, torch.randn(conv.shape, generator=gen), rec, pending, torch.zeros(0), torch.zeros(0))

    def digest(length):
        before = memo.host_hashed
        (got,) = states.step_checksums([slot], [length])
        assert got == reference_checksum(states.slot_bytes(slot, length))
        return memo.host_hashed - before

    assert digest(70) == states.nbytes(70)
    step = states.conv[0].nbytes + states.pending[0, :, 0].nbytes
    states.write(slot, state(71))
    assert int(memo.lengths[slot]) == 70 and digest(71) == step
    states.write(slot, state(72, rec=lambda rec: rec[0, 0, 0].__setitem__(0, -0.0)))
    assert int(memo.lengths[slot]) == -1 and digest(72) == states.nbytes(72)
    states.write(slot, state(73, pending=lambda rows: rows[0, 3].__setitem__(5, rows[0, 3, 5] + 1)))
    assert int(memo.lengths[slot]) == -1 and digest(73) == states.nbytes(73)


def test_single_tensor_checksum_equals_reference():
    """slot_checksum on any dtype whose bytes are whole words equals the reference; odd byte counts are refused."""
    gen = torch.Generator().manual_seed(3)
    for tensor in (torch.randn(3, 5, 7, generator=gen), torch.arange(6, dtype=torch.int16),
                   torch.randn(4, 9, generator=gen).t()):
        assert slot_checksum(tensor) == reference_checksum(tensor)
    with pytest.raises(ValueError, match="whole number of 32-bit"):
        slot_checksum(torch.arange(7, dtype=torch.uint8))


def test_one_bit_flip_changes_the_digest():
    """Flipping one bit (first, middle, last word; low and sign bits) changes the digest, as in the reference."""
    gen = torch.Generator().manual_seed(4)
    pool = random_pool(4, 3, 333, dtype=torch.int32, gen=gen)
    slot = torch.tensor([2], dtype=torch.int32)
    base = slot_checksums(pool=pool, slots=slot)[0]
    for index in (0, 500, 998):
        for bit in (0, 17, 31):
            flipped = pool.clone()
            flipped[2].view(-1)[index] ^= (1 << bit) if bit < 31 else -(1 << 31)
            digest = slot_checksums(pool=flipped, slots=slot)[0]
            assert digest != base and digest == reference_checksum(flipped[2]), (index, bit)


def test_checksum_refuses_slots_that_are_not_contiguous():
    """A pool whose slots are strided views cannot be digested as words: the error names the fix."""
    pool = torch.zeros(4, 6, 8)[:, :, :4]
    with pytest.raises(ValueError, match="pool\\[s\\] .* must be contiguous"):
        slot_checksums(pool=pool, slots=torch.tensor([0]))


@pytest.mark.parametrize("recurrent", [True, False])
def test_copy_slots_equals_reference(recurrent):
    """Clone / restore of shuffled pairs in one launch: conv, rec (unless restore_rec=off) and pending rows."""
    check_copy_slots(device="cpu", recurrent=recurrent, **SMALL_STATE)


@pytest.mark.parametrize("recurrent", [True, False])
def test_a_witnessed_copy_copies_the_state_and_digests_both_ends(recurrent):
    """A restore / clone of a ledger run on a GPU: one launch copies the state (rec too unless restore_rec=off) and
    digests the source as read and the destination as left, against the reference digests before and after (63 rows
    in the GPU test: here each program instance costs the interpreter ~1 ms a block)."""
    check_state_copy(device="cpu", recurrent=recurrent, copies=[(4, 1, 128), (2, 6, 69), (6, 2, 69)], **SMALL_STATE)


def test_a_witnessed_copy_spans_chunks():
    """States whose rec and rows are several programs' chunks are copied and digested whole."""
    check_state_copy(device="cpu", copies=[(4, 1, 66)], n_slots=7, layers=2, conv=(5, 3), rec=(2, 70, 64), width=8300)


def test_a_witnessed_copy_refuses_one_slot():
    from mini_engine.ops.checksum.state_triton import copy_state_lanes

    pools = [torch.zeros(3, 2, 4), torch.zeros(3, 2, 4), torch.zeros(3, 2, 63, 4)]
    with pytest.raises(ValueError, match="two slots; got dst = src = 1"):
        copy_state_lanes(conv=pools[0], rec=pools[1], pending=pools[2], dst=1, src=1, length=5)


def test_copy_slots_spans_chunks_and_dtypes():
    """Slots bigger than one program's chunk and 16-bit pools are copied whole, other slots untouched."""
    gen = torch.Generator().manual_seed(6)
    pools = [random_pool(5, 3, 7000, dtype=torch.float32, gen=gen), random_pool(5, 30, dtype=torch.float16, gen=gen)]
    before = [p.clone() for p in pools]
    copy_slots(pools=pools, dst=torch.tensor([4, 0]), src=torch.tensor([1, 3]))
    for got, old in zip(pools, before):
        old[[4, 0]] = old[[1, 3]]
        assert torch.equal(got, old)


def test_copy_slots_needs_rows_with_pending():
    """Pending rows without their per-pair row counts is an error, not a guess."""
    pending = torch.zeros(3, 2, 63, 4)
    with pytest.raises(ValueError, match="pending and rows together"):
        copy_slots(pools=[], dst=torch.tensor([1]), src=torch.tensor([2]), pending=pending)


@pytest.mark.parametrize("width", [1, 259, 8192, 8193, 3 * 8192 + 5])
def test_row_digests_are_the_reference_digests_of_each_row(width):
    check_row_digests(device="cpu", width=width)


def test_row_digests_take_32_bit_rows():
    from mini_engine.ops.checksum.triton import row_digests

    with pytest.raises(ValueError, match="32-bit elements"):
        row_digests(torch.zeros(2, 4, dtype=torch.float16))
