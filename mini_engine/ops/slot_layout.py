"""How the slot kernels (checksum, slot copy) see a pool: 32-bit words, each slot ``outer`` blocks of rows.

A pool is [n_slots, ...] of any dtype whose rows are whole 32-bit words. For each slot a kernel
visits ``outer`` blocks; block ``o`` holds ``rows`` rows of ``row_words`` words, contiguous, and
starts ``o * outer_stride`` words after the slot's first word::

    pool [n_slots, outer, rows_max, *row]       slot s:  block 0 | gap | block 1 | gap | ...
                                                          <- outer_stride ->
    block o of slot s: rows 0 .. rows[s] - 1, row_words words each, back to back

A whole-slot view (``partial=False``) is one block of one row: all of ``pool[s]``, which must be
contiguous. A partial view (``partial=True``) lets a caller cut each slot's rows short: it covers
``pool[s, :, :rows[s]]`` (the engine's pending rows), in row-major order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["PoolWords", "pool_words"]


class PoolWords(NamedTuple):
    words: torch.Tensor  # the pool's bytes as int32
    slot_stride: int  # words between slot s and slot s + 1
    outer: int
    outer_stride: int  # words between block o and block o + 1 of a slot
    rows_max: int
    row_words: int


def pool_words(pool: torch.Tensor, *, partial: bool) -> PoolWords:
    """The word view of ``pool`` (see the module docstring); pure; raises ValueError naming what to fix."""
    if pool.dim() < (3 if partial else 2) or pool.shape[0] < 1:
        need = "[n_slots, outer, rows, ...]" if partial else "[n_slots, ...]"
        raise ValueError(f"a pool must be {need} with n_slots >= 1; got {tuple(pool.shape)}")
    block = pool[0, 0] if partial else pool[0]
    if not block.is_contiguous():
        what = "pool[s, o] (one block of rows)" if partial else "pool[s] (one slot)"
        raise ValueError(f"{what} must be contiguous; got strides {pool.stride()} for shape {tuple(pool.shape)}")
    lead = pool.shape[:3] if partial else pool.shape[:1]
    rows = pool.view(*lead, -1)  # [n_slots, (outer, rows_max,) row elements]
    word_strides = all(stride * pool.element_size() % 4 == 0 for stride in rows.stride()[:-1])
    if not word_strides or rows.shape[-1] * pool.element_size() % 4:
        raise ValueError(f"a pool's {'rows' if partial else 'slots'} must be whole 32-bit words at word strides; got "
                         f"shape {tuple(pool.shape)}, strides {pool.stride()}, {pool.dtype}")
    words = rows.view(torch.int32)
    if not partial:
        return PoolWords(words, words.stride(0), 1, 0, 1, words.shape[1])
    return PoolWords(words, words.stride(0), words.shape[1], words.stride(1), words.shape[2], words.shape[3])
