"""Reference of the batched slot copy: what a clone, restore or fork does to the state pools.

For every pair i, ``pool[dst[i]] = pool[src[i]]`` in each whole-slot pool (conv, rec) and
``pending[dst[i], :, :rows[i]] = pending[src[i], :, :rows[i]]`` (only the pending rows that mean
something: a state of length n has ``n % 64`` of them). Destinations must be distinct and no
destination may be a source of the same call; other rows of a destination are left as they were.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["copy_slots"]


def copy_slots(*, pools: Sequence[torch.Tensor], dst: torch.Tensor, src: torch.Tensor,
               pending: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> None:
    """Copy slot ``src[i]`` to slot ``dst[i]`` in every pool (and the first ``rows[i]`` pending rows); mutates."""
    dst, src = dst.to(torch.long), src.to(torch.long)
    for pool in pools:
        pool.index_copy_(0, dst.to(pool.device), pool.index_select(0, src.to(pool.device)))
    if (pending is None) != (rows is None):
        raise ValueError("pass pending and rows together (rows[i]: pending rows of pair i), or neither")
    if pending is not None:
        for d, s, n in zip(dst.tolist(), src.tolist(), rows.tolist()):
            pending[d, :, :n] = pending[s, :, :n]
