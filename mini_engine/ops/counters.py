"""Counters for a launch whose programs share a piece of work, the last of them to finish doing it.

A kernel splits a result over programs (a gemm's K parts, a value head's V tiles) and one more step needs all of
them (adding the parts, the head's norm): rather than a second launch, each program stores its piece, then counts
itself in on the piece's counter (an atomic add, acquire-release at GPU scope, after a barrier so that every thread's
stores come first); the program that counts last reads the other pieces back (past the L1: ``.cg``), does the step,
and sets the counter back to zero for the next launch. ``counters`` gives such a launch its zeroed counters.
"""

from __future__ import annotations

import torch

__all__ = ["counters"]

_KEPT: dict[torch.device, list[torch.Tensor]] = {}  # per device, every counter buffer ever made


def counters(n: int, device: torch.device) -> torch.Tensor:
    """A buffer of at least ``n`` int32 counters on ``device``, zero at rest (each launch that counts on it sets its
    counters back). Kept for the process and never freed: a captured CUDA graph holds its address. Launches on one
    stream share it (they run one after another; a dependent launch waits for the one before it before it reads
    anything); two streams running such launches at once would need two."""
    kept = _KEPT.setdefault(torch.device(device), [])
    if not kept or kept[-1].numel() < n:
        kept.append(torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device))
    return kept[-1]
