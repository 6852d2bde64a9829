"""Triton batched slot copy, held to ``reference.py``: every pair and every pool in one launch.

Grid: (chunk of a slot's words, pair, pool). Each program copies up to ``CHUNK`` 32-bit words of
one block of one slot (``mini_engine.ops.slot_layout``); the pending pool, when given, is the last
pool and copies only ``rows[i]`` rows per block. Programs past a pool's size exit at once.
Destinations must be distinct and disjoint from the sources (as in the reference): then no
program reads a word another one writes, and the launch needs no ordering inside.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from mini_engine.device import upload
from mini_engine.ops.slot_layout import pool_words

__all__ = ["copy_slots"]

BLOCK = 1024  # words per step
CHUNK = 8 * BLOCK  # words per program
MAX_POOLS = 4


@triton.jit
def _copy_chunk(words_ptr, dst, src, slot_stride, outer_stride, n_rows, row_words, chunks, chunk_id,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    o, c = chunk_id // chunks, chunk_id % chunks
    block_words = n_rows * row_words
    begin = c.to(tl.int64) * CHUNK
    if begin < block_words:
        block = o.to(tl.int64) * outer_stride
        src_base = words_ptr + src * slot_stride + block
        dst_base = words_ptr + dst * slot_stride + block
        for step in range(0, CHUNK, BLOCK):
            j = begin + step + tl.arange(0, BLOCK)
            ok = j < block_words
            tl.store(dst_base + j, tl.load(src_base + j, mask=ok), mask=ok)


@triton.jit
def _copy_kernel(pools, slot_strides, outer_strides, outers, rows_maxes, row_words, chunks,
                 dst_ptr, src_ptr, rows_ptr, N_POOLS: tl.constexpr, HAS_PENDING: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    chunk_id, i, pool = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    dst = tl.load(dst_ptr + i).to(tl.int64)
    src = tl.load(src_ptr + i).to(tl.int64)
    for p in tl.static_range(N_POOLS):
        if pool == p:
            if chunk_id < outers[p] * chunks[p]:
                n_rows = tl.cast(rows_maxes[p], tl.int64)  # tl.cast: an int argument equal to 1 is a constexpr
                if HAS_PENDING and p == N_POOLS - 1:
                    n_rows = tl.load(rows_ptr + i).to(tl.int64)
                _copy_chunk(pools[p], dst, src, slot_strides[p], outer_strides[p], n_rows, row_words[p], chunks[p],
                            chunk_id, CHUNK, BLOCK)


def copy_slots(*, pools: Sequence[torch.Tensor], dst: torch.Tensor, src: torch.Tensor,
               pending: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> None:
    """Copy slot ``src[i]`` to slot ``dst[i]`` in every pool and the first ``rows[i]`` rows of
    ``pending`` [n_slots, outer, rows_max, ...]; one launch; mutates; no sync.

    Pools: [n_slots, ...] with each slot contiguous, all on one device, at most 4 with pending.
    """
    if (pending is None) != (rows is None):
        raise ValueError("pass pending and rows together (rows[i]: pending rows of pair i), or neither")
    layouts = [pool_words(pool, partial=False) for pool in pools]
    if pending is not None:
        layouts.append(pool_words(pending, partial=True))
    n = dst.numel()
    if dst.shape != (n,) or src.shape != (n,) or (rows is not None and rows.shape != (n,)):
        raise ValueError(f"dst, src (and rows) must be 1-D of one length; got {tuple(dst.shape)}, {tuple(src.shape)}"
                         f"{'' if rows is None else f', {tuple(rows.shape)}'}")
    if not 1 <= len(layouts) <= MAX_POOLS or len({p.words.device for p in layouts}) != 1:
        raise ValueError(f"copy_slots takes 1 to {MAX_POOLS} pools (pending included) on one device; got "
                         f"{[str(p.words.device) for p in layouts]}")
    chunks = [triton.cdiv(p.rows_max * p.row_words, CHUNK) for p in layouts]
    grid = (max(p.outer * c for p, c in zip(layouts, chunks)), n, len(layouts))
    if not n or not grid[0]:
        return
    device = layouts[0].words.device
    dst, src = upload(dst, device), upload(src, device)
    _copy_kernel[grid](
        tuple(p.words for p in layouts), tuple(p.slot_stride for p in layouts),
        tuple(p.outer_stride for p in layouts), tuple(p.outer for p in layouts),
        tuple(p.rows_max for p in layouts), tuple(p.row_words for p in layouts), tuple(chunks),
        dst, src, dst if rows is None else upload(rows, device),
        N_POOLS=len(layouts), HAS_PENDING=pending is not None, CHUNK=CHUNK, BLOCK=BLOCK)
