"""``device.pinned.PinnedArena``: views cut in order from one allocation, never the same bytes twice (on the CPU with
a plain allocator: the bookkeeping is the same; the GPU test uploads through pinned arenas behind queued work)."""

import pytest
import torch

from mini_engine.device.pinned import PinnedArena


def _arena(nbytes: int = 4096) -> tuple[PinnedArena, list[torch.Tensor]]:
    made = []

    def alloc(n: int) -> torch.Tensor:
        made.append(torch.empty(n, dtype=torch.uint8))
        return made[-1]

    return PinnedArena(nbytes, alloc), made


def test_views_are_disjoint_aligned_and_keep_their_values_across_arenas():
    """150 views of four dtypes and several shapes, each of 64 bytes at most (one 64-byte step of an arena), filled
    as they are cut: each keeps its own values (no two share a byte), starts on a 64-byte boundary of its arena, and
    a 4096-byte arena takes 64 of them before the next is allocated."""
    arena, made = _arena()
    views = []
    for i in range(150):
        dtype = (torch.int32, torch.int64, torch.float32, torch.uint8)[i % 4]
        shape = (i % 2 + 1, (i % 8 + 1) * 4 // dtype.itemsize)
        view = arena.empty(shape, dtype)
        assert view.shape == shape and view.dtype == dtype and view.is_contiguous()
        assert (view.data_ptr() - made[-1].data_ptr()) % 64 == 0
        view.fill_(i)
        views.append(view)
    assert all(bool((v == i).all()) for i, v in enumerate(views))
    assert arena.arenas == len(made) == 3


def test_stage_copies_the_callers_tensor_which_may_then_change():
    arena, _ = _arena()
    host = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    staged = arena.stage(host.t())  # not contiguous: staged as its values, contiguous
    host.zero_()
    assert staged.is_contiguous() and staged.tolist() == torch.arange(12).reshape(3, 4).t().tolist()


def test_large_and_empty_requests_get_allocations_of_their_own():
    """A view over a sixteenth of an arena (or of no bytes) is allocated apart, leaving the arena's next cut where it
    was."""
    arena, made = _arena()
    small = arena.empty((8,), torch.int64)
    big = arena.empty((4096 // 16 // 4 + 1,), torch.int32)
    none = arena.empty((0, 3), torch.int64)
    after = arena.empty((8,), torch.int64)
    assert big.numel() * 4 > 4096 // 16 and none.shape == (0, 3)
    assert arena.arenas == 1 and len(made) == 3
    assert after.data_ptr() - small.data_ptr() == 64  # the next cut in the same arena


def test_an_arena_too_small_to_cut_is_refused():
    with pytest.raises(ValueError, match="an arena holds 1024 bytes at least; got 512"):
        PinnedArena(512)
