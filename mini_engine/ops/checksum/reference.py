"""64-bit checksum of a tensor's exact bytes: the forensic ledger's fingerprint of a slot.

The bytes are read as little-endian 32-bit words (zero-padded to a multiple of 4). Each word is
mixed with its index by a bijective 32-bit integer hash (Thomas Mueller's ``hash32``), in two
lanes with different index offsets; each lane's sum modulo 2^32 is one half of the digest.
Because the mix is a bijection for a fixed index, changing any single word changes both halves:
a one-bit difference anywhere in the slot is always detected. Positions matter (a permutation of
words changes the digest); only byte content and order do — dtype and shape do not.

All arithmetic stays below 2^63 in int64, so the same formula is exact in a GPU kernel.
"""

from __future__ import annotations

import torch

__all__ = ["slot_checksum", "checksum_words"]

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B
_LANE_OFFSETS = (0x9E3779B1, 0x85EBCA77)


def _hash32_(x: torch.Tensor) -> torch.Tensor:
    """``hash32`` of 32-bit values held in int64, in place: x = ((x ^ x >> 16) * MIX) mod 2^32, twice, then
    x ^ x >> 16."""
    for _ in range(2):
        x ^= x >> 16
        x *= _MIX
        x &= _MASK32
    x ^= x >> 16
    return x


_LANE_STEPS: dict[torch.device, torch.Tensor] = {}  # per device: [2, n] of (index * lane offset) mod 2^32
_KEPT_WORDS = 1 << 20  # the longest kept (16 MiB a device); longer inputs compute theirs each time


def _lane_steps(n: int, device: torch.device) -> torch.Tensor:
    """(index * offset) mod 2^32 for indices 0..n-1 and both lane offsets, [2, n]: kept per device and grown
    by doubling up to ``_KEPT_WORDS``, since the ledger digests every slot of a pool at the same few lengths."""
    steps = _LANE_STEPS.get(device)
    if steps is None or steps.shape[1] < n:
        width = min(max(n, 2 * (0 if steps is None else steps.shape[1])), _KEPT_WORDS)
        index = torch.arange(max(n, width), dtype=torch.int64, device=device)
        steps = torch.stack([(index * offset) & _MASK32 for offset in _LANE_OFFSETS])
        if n <= _KEPT_WORDS:
            _LANE_STEPS[device] = steps
    return steps[:, :n]


def checksum_words(words: torch.Tensor) -> int:
    """Digest of a 1-D int64 tensor of 32-bit words (each in [0, 2^32)): per lane, the sum mod 2^32 of
    hash32((word + index * lane offset) mod 2^32); the two lanes' sums are the digest's halves."""
    mixed = _lane_steps(words.numel(), words.device) + words  # [2, n]: both lanes in one pass
    mixed &= _MASK32
    high, low = (_hash32_(mixed).sum(dim=1) & _MASK32).tolist()
    return (high << 32) | low


def slot_checksum(tensor: torch.Tensor) -> int:
    """64-bit digest (a Python int in [0, 2^64)) of ``tensor``'s bytes in row-major order."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32).to(torch.int64) & _MASK32
    return checksum_words(words)
