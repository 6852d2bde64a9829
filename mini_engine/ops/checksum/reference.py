"""64-bit checksum of a tensor's exact bytes: the forensic ledger's fingerprint of a slot.

The bytes are read as little-endian 32-bit words (zero-padded to a multiple of 4). Each word is
mixed with its index by a bijective 32-bit integer hash (Thomas Mueller's ``hash32``), in two
lanes with different index offsets; each lane's sum modulo 2^32 is one half of the digest.
Because the mix is a bijection for a fixed index, changing any single word changes both halves:
a one-bit difference anywhere in the slot is always detected. Positions matter (a permutation of
words changes the digest); only byte content and order do — dtype and shape do not.

The arithmetic is 32-bit: words are held as int32 bit patterns, sums and products wrap modulo 2^32
(two's complement, on the CPU and in CUDA alike) and the shifts are made logical by masking, so the
reference computes exactly what a GPU kernel computes in uint32, with half the bytes and none of the
masking passes of int64 lanes held below 2^32 (4-5x faster on a CPU at a slot's size;
``tests/unit/test_checksum.py`` checks it against the formula written out in plain Python).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["checksum_ints", "checksum_words", "join_lanes", "slot_checksum", "word_lanes"]

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B
_LANE_OFFSETS = (0x9E3779B1, 0x85EBCA77)


def _hash32_(x: torch.Tensor) -> torch.Tensor:
    """``hash32`` of int32 bit patterns, in place: x = (x ^ x >> 16) * MIX mod 2^32, twice, then x ^ x >> 16
    (``>>`` logical: the sign bits an arithmetic shift brings in are masked off; the product wraps)."""
    for _ in range(2):
        x ^= (x >> 16) & 0xFFFF
        x *= _MIX
    x ^= (x >> 16) & 0xFFFF
    return x


_LANE_STEPS: dict[torch.device, torch.Tensor] = {}  # per device: [2, n] int32 of (index * lane offset) mod 2^32
_KEPT_WORDS = 1 << 20  # the longest kept (8 MiB a device); longer inputs compute theirs each time


def _as_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) as the int32 tensor of the same bit patterns."""
    return torch.where(values >= 1 << 31, values - (1 << 32), values).to(torch.int32)


_LANE_OFFSETS_INT32 = tuple(o - (1 << 32) if o >= 1 << 31 else o for o in _LANE_OFFSETS)  # the same bit patterns


def _lane_steps(n: int, device: torch.device) -> torch.Tensor:
    """(index * offset) mod 2^32 for indices 0..n-1 and both lane offsets, [2, n] int32 bit patterns (a wrapping
    int32 product: only the operands mod 2^32 matter): kept per device and grown by doubling up to
    ``_KEPT_WORDS``, since the ledger digests every slot of a pool at the same few lengths."""
    steps = _LANE_STEPS.get(device)
    if steps is None or steps.shape[1] < n:
        width = min(max(n, 2 * (0 if steps is None else steps.shape[1])), _KEPT_WORDS)
        index = torch.arange(max(n, width), dtype=torch.int32, device=device)
        steps = torch.stack([index * offset for offset in _LANE_OFFSETS_INT32])
        if n <= _KEPT_WORDS:
            _LANE_STEPS[device] = steps
    return steps[:, :n]


def word_lanes(words: torch.Tensor, first: int = 0) -> tuple[int, int]:
    """The two lane sums mod 2^32 of a 1-D tensor of 32-bit words (int32 bit patterns, or int64 values in
    [0, 2^32)) whose first is word ``first`` of the digested sequence: per lane, the sum of
    hash32((word + index * lane offset) mod 2^32). Lanes of consecutive segments add up (mod 2^32) to the
    lanes of their concatenation."""
    if words.dtype == torch.int64:
        words = _as_int32(words)
    steps = _lane_steps(words.numel(), words.device)
    if first:  # (index + first) * offset = index * offset + first * offset, mod 2^32
        shift = torch.tensor([[(first * offset) & _MASK32] for offset in _LANE_OFFSETS], device=words.device)
        steps = steps + _as_int32(shift)
    mixed = steps + words  # [2, n] int32: both lanes in one pass, wrapping
    # a signed word is its unsigned value mod 2^32, so the int64 sum mod 2^32 is the unsigned one's
    high, low = (_hash32_(mixed).sum(dim=1, dtype=torch.int64) & _MASK32).tolist()
    return high, low


def join_lanes(lanes: tuple[int, int]) -> int:
    """The 64-bit digest of two lane sums (any ints; each is taken mod 2^32)."""
    return ((lanes[0] & _MASK32) << 32) | (lanes[1] & _MASK32)


def checksum_words(words: torch.Tensor) -> int:
    """Digest of a 1-D tensor of 32-bit words: its two lanes (``word_lanes``) are the digest's halves."""
    return join_lanes(word_lanes(words))


def checksum_ints(values: Sequence[int]) -> int:
    """``slot_checksum(torch.tensor(values, dtype=torch.int32))`` in plain Python, for the short lists the ledger
    digests on the host (a staged page table: a few dozen ids), where the tensor path's fixed cost is all of its
    cost (15 ids on the 2-core VM: 43 us that way, 14 us this way)."""
    lanes = []
    for offset in _LANE_OFFSETS:
        total = 0
        for index, value in enumerate(values):
            if not -(1 << 31) <= value < 1 << 31:
                raise ValueError(f"checksum_ints digests int32 values; got {value} at index {index}")
            x = (value + index * offset) & _MASK32
            for _ in range(2):
                x = ((x ^ (x >> 16)) * _MIX) & _MASK32
            total += x ^ (x >> 16)
        lanes.append(total)
    return join_lanes((lanes[0], lanes[1]))


def slot_checksum(tensor: torch.Tensor) -> int:
    """64-bit digest (a Python int in [0, 2^64)) of ``tensor``'s bytes in row-major order."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return checksum_words(raw.view(torch.int32))
