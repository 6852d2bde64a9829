"""64-bit checksum of a tensor's exact bytes: the forensic ledger's fingerprint of a slot.

The bytes are read as little-endian 32-bit words (zero-padded to a multiple of 4). Each word is
mixed with its index by a bijective 32-bit integer hash (Thomas Mueller's ``hash32``), in two
lanes with different index offsets; each lane's sum modulo 2^32 is one half of the digest.
Because the mix is a bijection for a fixed index, changing any single word changes both halves:
a one-bit difference anywhere in the slot is always detected. Positions matter (a permutation of
words changes the digest); only byte content and order do — dtype and shape do not.

The arithmetic is 32-bit: words are held as uint32, sums and products wrap modulo 2^32 (as in a GPU kernel's
uint32), both lanes in one [2, n] pass. The host computes it in numpy, whose small-array operations cost a
microsecond where torch's cost several: 4.6x faster than the same int32 arithmetic in torch for 640 words, 2x
for a 0.8B slot's million words, on the 2-core VM; a staged metadata shard's digest inside a ledger run on the
H100, 119-141 us against 188 us (``benchmarks/ledger_host_time.py``). ``tests/unit/test_checksum.py`` checks it
against the formula written out in plain Python. A device tensor is read back first: the GPU's own
digests are the Triton kernels (``ops.checksum.triton``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["checksum_bytes", "checksum_ints", "checksum_words", "join_lane_rows", "join_lanes", "row_checksums",
           "slot_checksum", "word_lanes"]

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B
_LANE_OFFSETS = (0x9E3779B1, 0x85EBCA77)


_LANE_STEPS: np.ndarray | None = None  # [2, n] uint32 of (index * lane offset) mod 2^32, indices 0..n-1
_KEPT_WORDS = 1 << 20  # the longest kept (8 MiB); longer inputs compute theirs each time


def _lane_steps(n: int) -> np.ndarray:
    """(index * offset) mod 2^32 for indices 0..n-1 and both lane offsets, [2, n] uint32: kept and grown by
    doubling up to ``_KEPT_WORDS``, since the ledger digests every slot of a pool at the same few lengths."""
    global _LANE_STEPS
    steps = _LANE_STEPS
    if steps is None or steps.shape[1] < n:
        width = max(n, min(2 * (0 if steps is None else steps.shape[1]), _KEPT_WORDS))
        index = np.arange(width, dtype=np.uint32)
        steps = np.stack([index * np.uint32(offset) for offset in _LANE_OFFSETS])  # wrapping uint32 products
        if width <= _KEPT_WORDS:
            _LANE_STEPS = steps
    return steps[:, :n]


def word_lanes(words: torch.Tensor, first: int = 0) -> tuple[int, int]:
    """The two lane sums mod 2^32 of a 1-D tensor of 32-bit words (int32 bit patterns, or int64 values in
    [0, 2^32)) whose first is word ``first`` of the digested sequence: per lane, the sum of
    hash32((word + index * lane offset) mod 2^32), where hash32 twice sets x = (x ^ x >> 16) * MIX, then gives
    x ^ x >> 16. Lanes of consecutive segments add up (mod 2^32) to the lanes of their concatenation."""
    array = words.detach().cpu().numpy()
    return _array_lanes(array.astype(np.uint32) if array.dtype == np.int64 else array.view(np.uint32), first)


def _array_lanes(words: np.ndarray, first: int = 0) -> tuple[int, int]:
    """``word_lanes`` of a 1-D uint32 array."""
    x = _lane_steps(words.size) + words  # [2, n]: both lanes in one pass, wrapping
    if first:  # (index + first) * offset = index * offset + first * offset, mod 2^32
        x += np.array([[(first * offset) & _MASK32] for offset in _LANE_OFFSETS], dtype=np.uint32)
    high, low = _hashed_sums(x).tolist()
    return high, low


def row_checksums(rows: torch.Tensor) -> list[int]:
    """``[slot_checksum(row) for row in rows]`` of a tensor [B, ...]: each row's bytes in row-major order, zero-padded
    to whole 32-bit words, all the rows in one pass (a step's logits: one call, not one a row)."""
    if not len(rows):
        return []
    raw = rows.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().reshape(len(rows), -1)  # [B, bytes]
    pad = (-raw.shape[1]) % 4
    if pad:
        raw = np.concatenate([raw, np.zeros((len(rows), pad), dtype=np.uint8)], axis=1)
    words = raw.view(np.uint32)  # [B, n]: little-endian words, as the GPU reads them
    return join_lane_rows(_hashed_sums(_lane_steps(words.shape[1])[None] + words[:, None, :]))  # [B, 2] sums


def _hashed_sums(x: np.ndarray) -> np.ndarray:
    """hash32 of every element of ``x`` (uint32, in place), summed mod 2^32 along the last axis."""
    for _ in range(2):
        x ^= x >> 16
        x *= np.uint32(_MIX)
    x ^= x >> 16
    return x.sum(axis=-1, dtype=np.uint64) & _MASK32


def join_lanes(lanes: tuple[int, int]) -> int:
    """The 64-bit digest of two lane sums (any ints; each is taken mod 2^32)."""
    return ((lanes[0] & _MASK32) << 32) | (lanes[1] & _MASK32)


def join_lane_rows(lanes: np.ndarray) -> list[int]:
    """``[join_lanes(row) for row in lanes]`` of lane sums [n, 2] (any integer dtype), in one pass: a ledger flush
    joins hundreds of digests at once."""
    words = lanes.astype(np.uint64) & np.uint64(_MASK32)  # (a negative int64 wraps mod 2^64: mod 2^32 is the same)
    return ((words[:, 0] << np.uint64(32)) | words[:, 1]).tolist()


def checksum_words(words: torch.Tensor) -> int:
    """Digest of a 1-D tensor of 32-bit words: its two lanes (``word_lanes``) are the digest's halves."""
    return join_lanes(word_lanes(words))


def checksum_bytes(data: bytes) -> int:
    """``slot_checksum`` of a tensor whose bytes are ``data``, read straight from the buffer (no tensor: a third
    of the host time for a staged metadata shard, whose bytes the fence keeps as its key)."""
    pad = (-len(data)) % 4
    return join_lanes(_array_lanes(np.frombuffer(data + bytes(pad) if pad else data, dtype=np.uint32)))


def checksum_ints(values: Sequence[int]) -> int:
    """``slot_checksum(torch.tensor(values, dtype=torch.int32))`` in plain Python, for the short lists the ledger
    digests on the host (a staged page table: a few dozen ids), where an array's fixed cost is all of its cost.
    Measured inside a ledger run on the H100 (``benchmarks/ledger_host_time.py``): 20 us a call this way, 77 us
    through numpy (whose per-call cost inside a run is several times what a loop timing it alone shows). Both lanes
    in one loop: 13.9 us against 17.4 a lane at a time for 12 ids on the 2-core VM."""
    lane0 = lane1 = 0
    offset0, offset1 = _LANE_OFFSETS
    for index, value in enumerate(values):
        if not -(1 << 31) <= value < 1 << 31:
            raise ValueError(f"checksum_ints digests int32 values; got {value} at index {index}")
        x, y = (value + index * offset0) & _MASK32, (value + index * offset1) & _MASK32
        for _ in range(2):
            x, y = ((x ^ (x >> 16)) * _MIX) & _MASK32, ((y ^ (y >> 16)) * _MIX) & _MASK32
        lane0 += x ^ (x >> 16)
        lane1 += y ^ (y >> 16)
    return join_lanes((lane0, lane1))


def slot_checksum(tensor: torch.Tensor) -> int:
    """64-bit digest (a Python int in [0, 2^64)) of ``tensor``'s bytes in row-major order (zero-padded to whole
    32-bit words): the one row of ``row_checksums``."""
    return row_checksums(tensor.reshape(1, -1))[0]
