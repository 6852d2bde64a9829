"""The ledger's state digests without re-reading what a decode step did not write.

A state's checksum reads conv, rec, then its pending rows in token order, each row all layers
(``mini_engine.model.state.state_bytes``): row j of layer o is word ``conv + rec + (j * layers + o) * row``
of the sequence. In that order a token's row appends, and since a digest's lanes are sums over words
(each mixed with its index), the lanes of rec and of the rows before a new one do not move.

``StateMemo`` keeps, per slot, the state length it last digested (-1: none) and the lanes of its rec
and rows then. A digest of the slot at ``length`` in the same 64-token chunk as the memo's, at or
after it, reads conv and the rows since; any other reads the whole state. That is exact because of
who writes a slot: a decode step rewrites conv, appends its row and rewrites rec only when its token
completes a chunk (the next digest is then in a new chunk and reads rec), and every other write of a
slot (a restore, a clone, a fork, a prefill's write-back, a cold start) goes through
``engine.storage.StateStorage``, which forgets the slot's memo with it -- unless, on the host, it has
compared the bytes the memo covers and found the write leaves them as they were (the reference
decode writes a whole state back every step: the same rec and rows, and one row more).

What a memo cannot see is a write that bypasses the storage (a kernel writing a slot it does not
own): in rec or in rows already digested it shows at the slot's next chunk, not at its next step.
Likewise a write that races a step of the same slot on another stream (a safeguard switched off, as
``admission_barrier=off``): if the step's memo update lands after the write's forget, the memo keeps
the step's view until the next chunk. The ledger's evidence of such races is read back regardless:
a restore's and a clone's checksums (``restore_read``, ``clone_written``) never go through a memo.
The read-back digests (``EngineConfig.state_digests="readback"``) read every byte every time, for
the hunt that needs that; a decode step then reads 16.6x more, over a chunk (the 0.8B shape: a
19 MB rec and up to 63 rows of 0.45 MB, against 1.3 MB of conv and one row, rec once a chunk).

Here: the memo's tensors and the host computation (the sim's; the same arithmetic as
``reference.slot_checksum``). On a GPU ``state_triton.state_lanes`` reads and updates the same
tensors on the device, inside a step's CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.ops.checksum.reference import join_lanes, word_lanes

__all__ = ["DigestCache", "StateMemo", "known_rows"]

_MASK32 = 0xFFFFFFFF


def known_rows(known: int, length: int) -> int:
    """How many of a state's pending rows a memo taken at length ``known`` has digested, with its rec: -1 when
    the digest of a state of ``length`` tokens must read the whole state (no memo, or another chunk)."""
    same_chunk = 0 <= known <= length and known // SNAPSHOT_ALIGN == length // SNAPSHOT_ALIGN
    return known % SNAPSHOT_ALIGN if same_chunk else -1


class StateMemo:
    """Per slot of a pool of ``n_slots``: ``lengths`` [n_slots] int32 (-1: forgotten) and ``lanes`` [n_slots, 2]
    int64 (rec and rows, each lane mod 2^32), on the pools' device; ``hashed`` [1] int64: the bytes the device
    digests have read (the host adds its own to ``host_hashed``)."""

    def __init__(self, n_slots: int, device: torch.device) -> None:
        self.lengths = torch.full((n_slots,), -1, dtype=torch.int32, device=device)
        self.lanes = torch.zeros((n_slots, 2), dtype=torch.int64, device=device)
        self.hashed = torch.zeros(1, dtype=torch.int64, device=device)
        self.host_hashed = 0

    def forget(self, slot: int) -> None:
        """The slot was written by something other than a decode step (call it inside the device op). A fill
        launch: ``lengths[slot] = -1`` would copy the scalar from the host, and on a GPU wait for the stream's
        queue (250 us a call, measured in a ledger run on the H100)."""
        self.lengths.narrow(0, slot, 1).fill_(-1)

    def hashed_bytes(self) -> int:
        """The bytes the memo's digests have read, on the host and by the kernels (on a GPU a sync)."""
        return self.host_hashed + int(self.hashed.item())

    def host_digest(self, conv: torch.Tensor, rec: torch.Tensor, pending: torch.Tensor, slot: int,
                    length: int) -> int:
        """The checksum of the state of ``length`` tokens whose conv [L, ...], rec [L, ...] and pending buffer
        [L, 63, width] are slot ``slot``'s (CPU tensors), reading what the memo does not cover; the memo then
        holds this state."""
        words = [part.reshape(-1).view(torch.int32) for part in (conv, rec)]
        known = known_rows(int(self.lengths[slot]), length)
        layers, width = pending.shape[0], pending.shape[2]
        first = max(known, 0)
        rows = pending[:, first: length % SNAPSHOT_ALIGN].transpose(0, 1).reshape(-1).view(torch.int32)
        tail = word_lanes(rows, words[0].numel() + words[1].numel() + first * layers * width)
        if known < 0:
            base = word_lanes(words[1], words[0].numel())
        else:
            base = tuple(self.lanes[slot].tolist())
        tail = tuple((a + b) & _MASK32 for a, b in zip(base, tail))
        self.lengths[slot], self.lanes[slot] = length, torch.tensor(tail)
        self.host_hashed += 4 * (words[0].numel() + (words[1].numel() if known < 0 else 0) + rows.numel())
        conv_lanes = word_lanes(words[0])
        return join_lanes((conv_lanes[0] + tail[0], conv_lanes[1] + tail[1]))


class DigestCache:
    """Host digests kept by key, at most ``limit`` of them (then all forgotten at once: the keys in use come back at
    their next use). The ledger digests the same host values again and again: a sequence's staged page table (it
    changes once a page, not once a step), a staged metadata shard (double buffering stages it into each buffer)."""

    __slots__ = ("_digests", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1; got {limit}")
        self.limit, self._digests = limit, {}

    def get(self, key: Hashable, digest: Callable[[Any], int], value: Any) -> int:
        """The digest kept for ``key``, else ``digest(value)`` (the value ``key`` stands for), kept."""
        known = self._digests.get(key)
        if known is None:
            if len(self._digests) >= self.limit:
                self._digests.clear()
            known = self._digests[key] = digest(value)
        return known
