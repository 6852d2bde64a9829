"""The ledger's state digests on a GPU: many slots' conv | rec | pending rows in one launch, with or without the memo.

A slot's state is three segments of the checksum's word sequence (``mini_engine.model.state.state_bytes``):
conv from word 0, rec from word ``conv_words``, then the pending rows in token order, row j of layer o at
word ``conv_words + rec_words + (j * layers + o) * row_words``. Each program hashes one chunk of one segment
(a chunk of conv or rec, or one chunk of one layer's row: the rows of a layer lie back to back in the pool,
one per token) and adds its lane sums into the slot's.

With a memo (``memo.StateMemo``) a second launch finishes each digest: the lanes of rec and of the rows the
memo covers come from the memo, the first launch having skipped them, and the memo takes the new state. Both
launches read the memo's length of the slot the same way (``_known_rows``), so they agree on what was skipped.

A ``StateDigester`` is ``state_lanes`` bound to one set of pools (a ``StateStorage``'s): its launches go through the
compiled kernels from the second on (``ops.launch.Launcher``), the index and output pointers that vary between
calls being left unspecialised (``do_not_specialize_on_alignment``: a slot is one load a program, the memo's pass a
few words, so nothing is lost by not assuming them aligned).

``copy_state_lanes`` is a ledger's restore or clone in one launch: each program digests one chunk of the source,
copies it and digests the destination's chunk as the copy left it, both digests summed like ``state_lanes``'.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.ops.checksum.memo import StateMemo
from mini_engine.ops.checksum.reference import _LANE_OFFSETS, _MIX
from mini_engine.ops.checksum.triton import BLOCK, CHUNK, _chunk_lanes
from mini_engine.ops.launch import Launcher
from mini_engine.ops.slot_layout import PoolWords, pool_words

__all__ = ["StateCopier", "StateDigester", "copy_state_lanes", "state_lanes"]


@triton.jit
def _known_rows(memo_lengths, slot, length, ALIGN: tl.constexpr):
    """``memo.known_rows`` on the device: the rows (with rec) the slot's memo covers, or -1 (read them all)."""
    known = tl.load(memo_lengths + slot).to(tl.int64)
    same_chunk = (known >= 0) & (known <= length) & (known // ALIGN == length // ALIGN)
    return tl.where(same_chunk, known % ALIGN, -1)


@triton.jit
def _segment(b, slot, conv_ptr, rec_ptr, pending_ptr, conv_stride, conv_words, rec_stride, rec_words, pending_stride,
             outer_stride, row_words, layers, conv_chunks, rec_chunks, row_chunks, CHUNK: tl.constexpr):
    """Where chunk b of ``slot``'s state lies, b counting conv's chunks, then rec's, then for each row j < 63 and
    layer o the row's chunks: (base, begin, n_words, first, segment, j): words [begin, begin + CHUNK) of the n_words
    at base, the first of them word ``first`` of the checksum's sequence; segment 0 conv, 1 rec, 2 row j."""
    conv_words, rec_words = tl.cast(conv_words, tl.int64), tl.cast(rec_words, tl.int64)  # (1 arrives as a constexpr)
    row_words, layers = tl.cast(row_words, tl.int64), tl.cast(layers, tl.int64)
    segment, j = b * 0, b * 0
    if b < conv_chunks:
        base, begin, n_words, first = conv_ptr + slot * conv_stride, b * CHUNK, conv_words, conv_words * 0
    elif b < conv_chunks + rec_chunks:
        base, begin, n_words, first = rec_ptr + slot * rec_stride, (b - conv_chunks) * CHUNK, rec_words, conv_words
        segment += 1
    else:
        row = (b - conv_chunks - rec_chunks) // row_chunks  # j * layers + o
        j, o, c = row // layers, row % layers, (b - conv_chunks - rec_chunks) % row_chunks
        base = pending_ptr + slot * pending_stride + o * outer_stride + j * row_words
        begin, n_words, first = c * CHUNK, row_words, conv_words + rec_words + row * row_words
        segment += 2
    return base, begin, n_words, first, segment, j


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "lengths_ptr", "memo_lengths", "parts_ptr"])
def _state_kernel(conv_ptr, rec_ptr, pending_ptr, slots_ptr, lengths_ptr, memo_lengths, parts_ptr, conv_stride,
                  conv_words, rec_stride, rec_words, pending_stride, outer_stride, row_words, layers, conv_chunks,
                  rec_chunks, row_chunks, MEMO: tl.constexpr, ALIGN: tl.constexpr, MIX: tl.constexpr,
                  LANE0: tl.constexpr, LANE1: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (b, i): chunk b (``_segment``) of the i-th listed slot's state. Its lane sums go to parts[i, 0] (with
    MEMO: conv to parts[i, 0], the rest to parts[i, 1]); a chunk the state does not have (a row past its length) or
    the memo covers adds nothing."""
    b, i = tl.program_id(0).to(tl.int64), tl.program_id(1)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    length = tl.load(lengths_ptr + i).to(tl.int64)
    known = length * 0 - 1
    if MEMO:
        known = _known_rows(memo_lengths, slot, length, ALIGN)
    base, begin, n_words, first, segment, j = _segment(
        b, slot, conv_ptr, rec_ptr, pending_ptr, conv_stride, conv_words, rec_stride, rec_words, pending_stride,
        outer_stride, row_words, layers, conv_chunks, rec_chunks, row_chunks, CHUNK)
    if (segment == 1) & (known >= 0):
        return
    if (segment == 2) & ((j < known) | (j >= length % ALIGN)):
        return
    lane0, lane1 = _chunk_lanes(base, begin, n_words, first, MIX, LANE0, LANE1, CHUNK, BLOCK)
    out = parts_ptr + (i * (2 if MEMO else 1) + (tl.minimum(segment, 1) if MEMO else 0)) * 2
    tl.atomic_add(out, lane0)
    tl.atomic_add(out + 1, lane1)


@triton.jit(do_not_specialize=["dst", "src"])  # one compile for every pair of slots
def _copy_kernel(conv_ptr, rec_ptr, pending_ptr, dst, src, parts_ptr, run_rows_ptr, memo_lengths, conv_stride,
                 conv_words, rec_stride, rec_words, pending_stride, outer_stride, row_words, layers, conv_chunks,
                 rec_chunks, row_chunks, RUN_WORDS: tl.constexpr, RUN_BLOCK: tl.constexpr, MEMO: tl.constexpr,
                 RECURRENT: tl.constexpr, MIX: tl.constexpr, LANE0: tl.constexpr, LANE1: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program b: chunk b (``_segment``) of the state; the grid stops at the state's last row. Digests src's words
    into parts[0], copies them to dst's (rec only if RECURRENT), then digests dst's words as they now are (read
    back after a barrier: what the copy left, not what it meant to write) into parts[1]. Program 0 also forgets
    dst's memos: its RUN_WORDS running-copy row counts (if any) and with MEMO its digest memo's length, set to -1."""
    b = tl.program_id(0).to(tl.int64)
    dst, src = tl.cast(dst, tl.int64), tl.cast(src, tl.int64)
    if b == 0:
        if RUN_WORDS > 0:
            k = tl.arange(0, RUN_BLOCK)
            tl.store(run_rows_ptr + dst * RUN_WORDS + k, tl.full(k.shape, -1, tl.int32), mask=k < RUN_WORDS)
        if MEMO:
            tl.store(memo_lengths + dst, tl.full((), -1, tl.int32))
    src_base, begin, n_words, first, segment, _ = _segment(
        b, src, conv_ptr, rec_ptr, pending_ptr, conv_stride, conv_words, rec_stride, rec_words, pending_stride,
        outer_stride, row_words, layers, conv_chunks, rec_chunks, row_chunks, CHUNK)
    dst_base, _, _, _, _, _ = _segment(
        b, dst, conv_ptr, rec_ptr, pending_ptr, conv_stride, conv_words, rec_stride, rec_words, pending_stride,
        outer_stride, row_words, layers, conv_chunks, rec_chunks, row_chunks, CHUNK)
    lane0, lane1 = _chunk_lanes(src_base, begin, n_words, first, MIX, LANE0, LANE1, CHUNK, BLOCK)
    tl.atomic_add(parts_ptr, lane0)
    tl.atomic_add(parts_ptr + 1, lane1)
    if (segment != 1) | RECURRENT:  # restore_rec=off: rec stays as it was
        for step in range(0, CHUNK, BLOCK):
            k = begin + step + tl.arange(0, BLOCK)
            ok = k < n_words
            tl.store(dst_base + k, tl.load(src_base + k, mask=ok), mask=ok)
    tl.debug_barrier()
    lane0, lane1 = _chunk_lanes(dst_base, begin, n_words, first, MIX, LANE0, LANE1, CHUNK, BLOCK)
    tl.atomic_add(parts_ptr + 2, lane0)
    tl.atomic_add(parts_ptr + 3, lane1)


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["parts_ptr", "lanes_ptr", "slots_ptr",
                                                                  "lengths_ptr", "n"])
def _memo_kernel(parts_ptr, lanes_ptr, slots_ptr, lengths_ptr, memo_lengths, memo_lanes, hashed_ptr, n, conv_words,
                 rec_words, row_words, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    """Digests i of a block: lanes[i] = conv's lanes + (the memo's + the new rows', or rec's and all rows'), the
    memo set to this state (rec and rows, mod 2^32), and the bytes read added to ``hashed``."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    slot = tl.load(slots_ptr + i, mask=ok, other=0).to(tl.int64)
    length = tl.load(lengths_ptr + i, mask=ok, other=0).to(tl.int64)
    known = _known_rows(memo_lengths, slot, length, ALIGN)
    kept = ok & (known >= 0)
    tail0 = (tl.load(parts_ptr + i * 4 + 2, mask=ok, other=0)
             + tl.load(memo_lanes + slot * 2, mask=kept, other=0)) & 0xFFFFFFFF
    tail1 = (tl.load(parts_ptr + i * 4 + 3, mask=ok, other=0)
             + tl.load(memo_lanes + slot * 2 + 1, mask=kept, other=0)) & 0xFFFFFFFF
    tl.store(memo_lanes + slot * 2, tail0, mask=ok)
    tl.store(memo_lanes + slot * 2 + 1, tail1, mask=ok)
    tl.store(memo_lengths + slot, length.to(tl.int32), mask=ok)
    tl.store(lanes_ptr + i * 2, tl.load(parts_ptr + i * 4, mask=ok, other=0) + tail0, mask=ok)
    tl.store(lanes_ptr + i * 2 + 1, tl.load(parts_ptr + i * 4 + 1, mask=ok, other=0) + tail1, mask=ok)
    words = conv_words + tl.where(known >= 0, 0, rec_words) + (length % ALIGN - tl.maximum(known, 0)) * row_words
    tl.atomic_add(hashed_ptr, tl.sum(tl.where(ok, words * 4, 0), 0))


def state_lanes(*, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor, slots: torch.Tensor,
                lengths: torch.Tensor, layouts: tuple[PoolWords, PoolWords, PoolWords] | None = None,
                memo: StateMemo | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Lane sums [n, 2] int64 of each listed slot's state of ``lengths[i]`` tokens (``StateStorage.slot_bytes``):
    one launch over the three pools, and with ``memo`` a second that finishes the digests from it and updates it
    (the listed slots must then be distinct); no sync, graph-capturable. ``slots``, ``lengths``: [n] ints on the
    pools' device. ``layouts``: the three pools' ``pool_words`` (whole, whole, partial), when the caller keeps
    them. ``out``: [n, 2] int64 rows to return the lane sums in, zeroed (``deferred.DigestRows``). A caller that
    digests the same pools again and again keeps a ``StateDigester``."""
    digester = StateDigester(conv=conv, rec=rec, pending=pending, layouts=layouts, memo=memo)
    return digester(slots, lengths, out=out)


class _BoundPools:
    """What a launch over the three pools needs of them, worked out once for a ``StateDigester`` or ``StateCopier``:
    their word views (``pools``), the layout arguments the kernels take after their pointers (``layout``: strides,
    row words, the pending pool's layers, each segment's chunks), the chunk counts (conv's, rec's, a row's) and the
    words of conv, of rec and of a token's row over all layers (``words``: what the memo's pass counts)."""

    __slots__ = ("chunks", "device", "layout", "pending", "pools", "words")

    def __init__(self, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor,
                 layouts: tuple[PoolWords, PoolWords, PoolWords] | None) -> None:
        if layouts is None:
            layouts = pool_words(conv, partial=False), pool_words(rec, partial=False), pool_words(pending, partial=True)
        conv_layout, rec_layout, pending_layout = layouts
        self.chunks = [triton.cdiv(conv_layout.row_words, CHUNK), triton.cdiv(rec_layout.row_words, CHUNK),
                       triton.cdiv(pending_layout.row_words, CHUNK)]
        self.device, self.pending = conv.device, pending_layout
        self.pools = (conv_layout.words, rec_layout.words, pending_layout.words)
        self.layout = (conv_layout.slot_stride, conv_layout.row_words, rec_layout.slot_stride, rec_layout.row_words,
                       pending_layout.slot_stride, pending_layout.outer_stride, pending_layout.row_words,
                       pending_layout.outer, *self.chunks)
        self.words = (conv_layout.row_words, rec_layout.row_words, pending_layout.outer * pending_layout.row_words)


class StateDigester:
    """``state_lanes`` bound to one set of pools (and memo): what the launches need of them worked out once, and
    from the second launch on the compiled kernels launched directly (``ops.launch.Launcher``: the pools' pointers
    and strides are fixed; the slots, lengths and outputs, which vary, are not specialised on)."""

    def __init__(self, *, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor,
                 layouts: tuple[PoolWords, PoolWords, PoolWords] | None = None, memo: StateMemo | None = None) -> None:
        bound = _BoundPools(conv, rec, pending, layouts)
        pending_layout, chunks = bound.pending, bound.chunks
        if pending_layout.rows_max != SNAPSHOT_ALIGN - 1:
            raise ValueError(f"the pending pool holds {SNAPSHOT_ALIGN - 1} rows a layer; got {pending_layout.rows_max}")
        self.device, self.memo = bound.device, memo
        self._pools, self._layout = bound.pools, bound.layout
        self._programs = chunks[0] + chunks[1] + pending_layout.rows_max * pending_layout.outer * chunks[2]
        self._words = bound.words
        self._state_constexprs = {"MEMO": memo is not None, "ALIGN": SNAPSHOT_ALIGN, "MIX": _MIX,
                                  "LANE0": _LANE_OFFSETS[0], "LANE1": _LANE_OFFSETS[1], "CHUNK": CHUNK, "BLOCK": BLOCK}
        self._state = Launcher(_state_kernel)
        self._memo = Launcher(_memo_kernel)

    def __call__(self, slots: torch.Tensor, lengths: torch.Tensor, *, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """``state_lanes(slots=, lengths=, out=)`` on the bound pools and memo."""
        n, memo = slots.numel(), self.memo
        if slots.shape != (n,) or lengths.shape != (n,):
            raise ValueError(f"slots and lengths must be 1-D of one length; got {tuple(slots.shape)} and "
                             f"{tuple(lengths.shape)}")
        if out is not None and (out.shape != (n, 2) or out.dtype != torch.int64):
            raise ValueError(f"out must be int64 [{n}, 2]; got {out.dtype} {tuple(out.shape)}")
        if memo is None and out is not None:
            parts = out.view(n, 1, 2)  # the kernel adds into it: zeroed by its owner
        else:
            parts = torch.zeros((n, 1 if memo is None else 2, 2), dtype=torch.int64, device=self.device)
        if not n:
            return parts[:, 0]
        memo_lengths = slots if memo is None else memo.lengths  # unread without a memo
        self._state((self._programs, n), None,
                    (*self._pools, slots, lengths, memo_lengths, parts, *self._layout), self._state_constexprs)
        if memo is None:
            return parts[:, 0]
        lanes = torch.empty((n, 2), dtype=torch.int64, device=self.device) if out is None else out
        self._memo((triton.cdiv(n, 128),), None,
                   (parts, lanes, slots, lengths, memo.lengths, memo.lanes, memo.hashed, n, *self._words),
                   {"ALIGN": SNAPSHOT_ALIGN, "BLOCK": 128})
        return lanes


def copy_state_lanes(*, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor, dst: int, src: int, length: int,
                     recurrent: bool = True, layouts: tuple[PoolWords, PoolWords, PoolWords] | None = None,
                     out: torch.Tensor | None = None, run_rows: torch.Tensor | None = None,
                     memo: StateMemo | None = None) -> torch.Tensor:
    """Copy slot ``src``'s state of ``length`` tokens to slot ``dst`` (``StateStorage.copy_slot``: conv, rec unless
    ``recurrent`` is False, the ``length % 64`` pending rows) and digest it on the way, in one launch: lane sums
    [2, 2] int64, row 0 of src's state as the copy read it, row 1 of dst's as the copy left it (read back). No
    upload, no sync. A ledger's restore or clone on a GPU: two digests and the copy were three launches with two
    uploads and two zeroed buffers. ``out``: zeroed [2, 2] int64 rows to add them into (``deferred.DigestRows``).
    ``run_rows`` (the decode kernel's running-copy counts, int32 [S, ...]) and ``memo``: dst's entries set to -1
    in the same launch (``StateStorage.forget_memos``: two fill launches otherwise). A caller that copies between
    the same pools again and again keeps a ``StateCopier``."""
    copier = StateCopier(conv=conv, rec=rec, pending=pending, layouts=layouts, run_rows=run_rows, memo=memo)
    return copier(dst, src, length, recurrent=recurrent, out=out)


class StateCopier:
    """``copy_state_lanes`` bound to one set of pools (and running-copy counts and memo): what the launch needs of
    them worked out once, and from each variant's second launch on the compiled kernel launched directly
    (``ops.launch.Launcher``: the pools' pointers and strides are fixed, a buffer it zeroes or is given is on a
    16-byte boundary): about 10 us of host time a launch of the ~30 it cost (``benchmarks/triton_launch_cost.py``)."""

    def __init__(self, *, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor,
                 layouts: tuple[PoolWords, PoolWords, PoolWords] | None = None, run_rows: torch.Tensor | None = None,
                 memo: StateMemo | None = None) -> None:
        if run_rows is not None and (run_rows.dtype != torch.int32 or not run_rows.is_contiguous()):
            raise ValueError(f"run_rows must be contiguous int32; got {run_rows.dtype}, strides {run_rows.stride()}")
        run_words = 0 if run_rows is None else run_rows[0].numel()
        bound = _BoundPools(conv, rec, pending, layouts)
        self.device, self._pools, self._layout = bound.device, bound.pools, bound.layout
        self._forgets = (run_rows, None if memo is None else memo.lengths)
        self._programs = bound.chunks[0] + bound.chunks[1]  # a state's conv and rec; then its rows'
        self._per_row = bound.pending.outer * bound.chunks[2]
        constexprs = {
            "RUN_WORDS": run_words, "RUN_BLOCK": triton.next_power_of_2(max(run_words, 1)), "MEMO": memo is not None,
            "MIX": _MIX, "LANE0": _LANE_OFFSETS[0], "LANE1": _LANE_OFFSETS[1], "CHUNK": CHUNK, "BLOCK": BLOCK}
        self._constexprs = {recurrent: {**constexprs, "RECURRENT": recurrent} for recurrent in (False, True)}
        self._launch = Launcher(_copy_kernel)

    def __call__(self, dst: int, src: int, length: int, *, recurrent: bool = True,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """``copy_state_lanes(dst=, src=, length=, recurrent=, out=)`` on the bound pools."""
        if dst == src:
            raise ValueError(f"a copy needs two slots; got dst = src = {dst}")
        if out is None:
            parts = torch.zeros((2, 2), dtype=torch.int64, device=self.device)
        elif out.shape != (2, 2) or out.dtype != torch.int64 or out.data_ptr() % 16:
            raise ValueError(f"out must be int64 [2, 2] on a 16-byte boundary; got {out.dtype} {tuple(out.shape)} at "
                             f"{out.data_ptr() % 16} bytes past one")
        else:
            parts = out
        run_rows, memo_lengths = self._forgets
        args = (*self._pools, dst, src, parts, parts if run_rows is None else run_rows,
                parts if memo_lengths is None else memo_lengths, *self._layout)  # (unread if None)
        grid = (self._programs + length % SNAPSHOT_ALIGN * self._per_row,)
        self._launch(grid, recurrent, args, self._constexprs[recurrent])
        return parts
