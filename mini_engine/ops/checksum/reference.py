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


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = ((x ^ (x >> 16)) * _MIX) & _MASK32
    x = ((x ^ (x >> 16)) * _MIX) & _MASK32
    return x ^ (x >> 16)


def checksum_words(words: torch.Tensor) -> int:
    """Digest of a 1-D int64 tensor of 32-bit words (each in [0, 2^32))."""
    index = torch.arange(words.numel(), dtype=torch.int64, device=words.device)
    halves = []
    for offset in _LANE_OFFSETS:
        mixed = _hash32((words + index * offset) & _MASK32)
        halves.append(int(mixed.sum()) & _MASK32)
    return (halves[0] << 32) | halves[1]


def slot_checksum(tensor: torch.Tensor) -> int:
    """64-bit digest (a Python int in [0, 2^64)) of ``tensor``'s bytes in row-major order."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32).to(torch.int64) & _MASK32
    return checksum_words(words)
