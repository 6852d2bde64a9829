"""Triton slot checksum: the digests of many slots of a pool in one launch, bit-identical to ``reference.py``.

Each program hashes one chunk of one slot's words in uint32 arithmetic (a product mod 2^32 is
what the reference's ``& 0xFFFFFFFF`` keeps), sums each lane in wrapping uint32 (the sum mod 2^32
is order-free, so chunks may finish in any order) and adds it atomically into the slot's int64
lane totals. ``digests`` reduces those mod 2^32 and joins the two halves on the host.

A digest covers a word sequence; lanes of consecutive segments add up, each segment's words indexed
from the number of words before it (``state_triton`` digests an engine state that way: conv | rec |
pending rows). ``row_digests`` finishes each row's digest on the device (the logits check).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.ops.checksum.reference import _LANE_OFFSETS, _MIX, join_lane_rows
from mini_engine.ops.launch import Launcher
from mini_engine.ops.slot_layout import pool_words

__all__ = ["checksum_lanes", "digests", "row_digests", "slot_checksum", "slot_checksums"]

BLOCK = 1024  # words per step
CHUNK = 8 * BLOCK  # words per program


@triton.jit
def _hash32(x, MIX: tl.constexpr):
    x = (x ^ (x >> 16)) * MIX
    x = (x ^ (x >> 16)) * MIX
    return x ^ (x >> 16)


@triton.jit
def _chunk_lanes(base, begin, n_words, first_index, MIX: tl.constexpr, LANE0: tl.constexpr, LANE1: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """The two lane sums (int64, not reduced) of words [begin, begin + CHUNK) of the n_words at ``base``, whose
    first is word ``first_index`` of the digested sequence."""
    lane0 = tl.zeros([BLOCK], dtype=tl.uint32)
    lane1 = tl.zeros([BLOCK], dtype=tl.uint32)
    for step in range(0, CHUNK, BLOCK):
        j = begin + step + tl.arange(0, BLOCK)
        ok = j < n_words
        word = tl.load(base + j, mask=ok, other=0).to(tl.uint32, bitcast=True)
        index = (first_index + j).to(tl.uint32)  # only index mod 2^32 reaches the digest
        lane0 += tl.where(ok, _hash32(word + index * LANE0, MIX), 0)
        lane1 += tl.where(ok, _hash32(word + index * LANE1, MIX), 0)
    return tl.sum(lane0.to(tl.int64), 0), tl.sum(lane1.to(tl.int64), 0)


@triton.jit
def _checksum_kernel(words_ptr, slots_ptr, rows_ptr, lanes_ptr, slot_stride, outer_stride, rows_max,
                     row_words, chunks, HAS_ROWS: tl.constexpr, MIX: tl.constexpr, LANE0: tl.constexpr,
                     LANE1: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Chunk ``c`` of block ``o`` of the i-th listed slot: its two lane sums, added into lanes[i]."""
    block_id, i = tl.program_id(0), tl.program_id(1)
    o, c = block_id // chunks, block_id % chunks
    n_rows = tl.cast(rows_max, tl.int64)  # tl.cast: an int argument equal to 1 arrives as a constexpr
    if HAS_ROWS:
        n_rows = tl.load(rows_ptr + i).to(tl.int64)
    block_words = n_rows * row_words
    begin = c.to(tl.int64) * CHUNK
    if begin >= block_words:
        return
    base = words_ptr + tl.load(slots_ptr + i).to(tl.int64) * slot_stride + o.to(tl.int64) * outer_stride
    first_index = o.to(tl.int64) * block_words  # the word index of this block's first word
    lane0, lane1 = _chunk_lanes(base, begin, block_words, first_index, MIX, LANE0, LANE1, CHUNK, BLOCK)
    tl.atomic_add(lanes_ptr + 2 * i, lane0)
    tl.atomic_add(lanes_ptr + 2 * i + 1, lane1)


def checksum_lanes(*, pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Lane sums [n, 2] int64 (not yet reduced mod 2^32) of ``pool[slots[i]]``, one launch; no sync.

    ``rows`` (None: whole slots): [n] ints, slot i then covers ``pool[slots[i], :, :rows[i]]`` of a
    pool [n_slots, outer, rows_max, ...] (``mini_engine.ops.slot_layout``).
    """
    layout = pool_words(pool, partial=rows is not None)
    n = slots.numel()
    if slots.shape != (n,) or (rows is not None and rows.shape != (n,)):
        raise ValueError(f"slots and rows must be 1-D of one length; got {tuple(slots.shape)} and "
                         f"{None if rows is None else tuple(rows.shape)}")
    lanes = torch.zeros((n, 2), dtype=torch.int64, device=pool.device)
    chunks = triton.cdiv(layout.rows_max * layout.row_words, CHUNK)
    if n and chunks:
        slots = slots.to(pool.device)
        rows = slots if rows is None else rows.to(pool.device)  # unread when there are no rows
        _checksum_kernel[(layout.outer * chunks, n)](
            layout.words, slots, rows, lanes, layout.slot_stride, layout.outer_stride, layout.rows_max,
            layout.row_words, chunks, HAS_ROWS=rows is not slots, MIX=_MIX, LANE0=_LANE_OFFSETS[0],
            LANE1=_LANE_OFFSETS[1], CHUNK=CHUNK, BLOCK=BLOCK)
    return lanes


@triton.jit
def _join(lane0, lane1, DROP_SIGN: tl.constexpr):
    """The 64-bit digest of two lane sums as an int64 bit pattern; with DROP_SIGN its top bit cleared."""
    digest = ((lane0 & 0xFFFFFFFF) << 32) | (lane1 & 0xFFFFFFFF)
    if DROP_SIGN:
        digest = digest & 0x7FFFFFFFFFFFFFFF
    return digest


@triton.jit
def _row_digest_kernel(words_ptr, parts_ptr, out_ptr, n_words, row_stride, chunks, MIX: tl.constexpr,
                       LANE0: tl.constexpr, LANE1: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                       ONE_CHUNK: tl.constexpr, DROP_SIGN: tl.constexpr):
    """Chunk ``c`` of row ``r``: a row of one chunk is digested here (``out[r]``); else the chunk's lane sums go
    to ``parts[r, c]`` for ``_join_parts_kernel``."""
    c, r = tl.program_id(0), tl.program_id(1).to(tl.int64)
    lane0, lane1 = _chunk_lanes(words_ptr + r * row_stride, c.to(tl.int64) * CHUNK, n_words, 0, MIX, LANE0, LANE1,
                                CHUNK, BLOCK)
    if ONE_CHUNK:
        tl.store(out_ptr + r, _join(lane0, lane1, DROP_SIGN))
    else:
        tl.store(parts_ptr + (r * chunks + c) * 2, lane0)
        tl.store(parts_ptr + (r * chunks + c) * 2 + 1, lane1)


@triton.jit
def _join_parts_kernel(parts_ptr, out_ptr, chunks, DROP_SIGN: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``r``'s digest from its chunks' lane sums (a sum mod 2^32 does not depend on their order)."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    lane0 = tl.zeros([BLOCK], dtype=tl.int64)
    lane1 = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, chunks, BLOCK):
        ok = start + c < chunks
        lane0 += tl.load(parts_ptr + (r * chunks + start + c) * 2, mask=ok, other=0)
        lane1 += tl.load(parts_ptr + (r * chunks + start + c) * 2 + 1, mask=ok, other=0)
    tl.store(out_ptr + r, _join(tl.sum(lane0, 0), tl.sum(lane1, 0), DROP_SIGN))


def row_digests(table: torch.Tensor, *, drop_sign: bool = False) -> torch.Tensor:
    """The digest (``reference.slot_checksum``) of each row of a device ``table`` [B, width] of 32-bit elements,
    as int64 device values (the 64-bit digest's bit pattern; with ``drop_sign`` its top bit cleared, a 63-bit
    check): one launch for rows of at most ``CHUNK`` words, two for longer rows; no sync. The kernels are launched
    compiled once a shape has been (``ops.launch.Launcher``, keyed by all they specialise on: the rows' dtype, device
    and 16-byte alignment and the ints' values; the outputs are fresh, so aligned): the ledger checks the logits of
    every prefill that samples."""
    if table.dim() != 2 or table.element_size() != 4:
        raise ValueError(f"row_digests takes a [B, width] table of 32-bit elements; got {table.dtype} "
                         f"{tuple(table.shape)}")
    rows = table.detach().contiguous()
    n_rows, n_words = rows.shape
    out = torch.empty(n_rows, dtype=torch.int64, device=rows.device)
    chunks = max(1, triton.cdiv(n_words, CHUNK))
    if not n_rows:
        return out
    parts = out if chunks == 1 else torch.empty(n_rows, chunks, 2, dtype=torch.int64, device=rows.device)
    key = (rows.dtype, rows.device, rows.data_ptr() % 16 == 0, n_words, chunks, drop_sign)
    _ROW_DIGESTS((chunks, n_rows), key, (rows, parts, out, n_words, max(n_words, 1), chunks),
                 {"MIX": _MIX, "LANE0": _LANE_OFFSETS[0], "LANE1": _LANE_OFFSETS[1], "CHUNK": CHUNK, "BLOCK": BLOCK,
                  "ONE_CHUNK": chunks == 1, "DROP_SIGN": drop_sign})
    if chunks > 1:
        _JOIN_PARTS((n_rows,), (rows.device, chunks, drop_sign), (parts, out, chunks),
                    {"DROP_SIGN": drop_sign, "BLOCK": min(1024, triton.next_power_of_2(chunks))})
    return out


_ROW_DIGESTS, _JOIN_PARTS = Launcher(_row_digest_kernel), Launcher(_join_parts_kernel)


def digests(lanes: torch.Tensor) -> list[int]:
    """64-bit digests (Python ints in [0, 2^64)) from lane sums [n, 2]; synchronises with the device."""
    return join_lane_rows(lanes.detach().cpu().numpy())


def slot_checksums(*, pool: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor | None = None) -> list[int]:
    """``[reference.slot_checksum(pool[s]) for s in slots]`` (with ``rows``: of ``pool[s, :, :rows[i]]``)."""
    return digests(checksum_lanes(pool=pool, slots=slots, rows=rows))


def slot_checksum(tensor: torch.Tensor) -> int:
    """``reference.slot_checksum`` for a tensor that is a whole number of 32-bit words (one launch, then a sync)."""
    if (tensor.numel() * tensor.element_size()) % 4:
        raise ValueError(f"{tensor.numel()} x {tensor.element_size()} bytes is not a whole number of 32-bit "
                         "words; use mini_engine.ops.checksum.reference.slot_checksum (it zero-pads)")
    pool = tensor.detach().contiguous().reshape(1, -1)
    return slot_checksums(pool=pool, slots=torch.zeros(1, dtype=torch.int32, device=tensor.device))[0]
