"""Device-resident state: the linear-state slot pool and the paged KV pool, as tensors.

The allocators (``mini_engine.cache.pools``) decide *which* ids; this module holds *what* the ids
point at and moves it, only ever from inside device ops (so ordering is the device's).

A slot holds one sequence's full Gated DeltaNet state in chunk-exact form (see
``mini_engine.model.state``): the conv inputs at its length, the recurrent state at its last
64-token boundary and the prepared rows since. A snapshot slot at a 64-multiple has no pending rows.
Slot 0 is the padding sink.
"""

from __future__ import annotations

import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.device import Device, upload
from mini_engine.model import ModelConfig, SequenceState
from mini_engine.model.state import Snapshot, pending_width, state_bytes
from mini_engine.ops.checksum import slot_checksum
from mini_engine.ops.checksum.deferred import DeviceDigest, DigestRows
from mini_engine.ops.checksum.memo import StateMemo, known_rows
from mini_engine.ops.slot_layout import pool_words

__all__ = ["KVStorage", "StateStorage"]


class StateStorage:
    """``conv[S, L, C, W-1]``, ``rec[S, L, Hv, K, V]``, ``pending[S, L, 63, width]`` in float32.

    With ``running=True`` (the Triton decode path) also ``run[S, L, Hv, K, V]`` and ``run_rows[S, L, 2]``:
    a memo the decode kernel keeps of the state after the slot's pending rows (their count when its
    step left it there, kept by the count's parity; -1 otherwise), so the next step need not replay
    them. It is derived, never part of a state's bytes: every write here other than a decode step's
    sets ``run_rows`` to -1, and a stale memo costs a replay (``pending_replay_decode_triton``), never
    a wrong state.

    With ``tracked=True`` (``EngineConfig.state_digests="tracked"``) the ledger's digests of the live slots
    a forward wrote go through ``memo`` (``ops.checksum.memo``), which every such write forgets likewise.
    """

    def __init__(self, config: ModelConfig, n_slots: int, device: Device, *, running: bool = False,
                 tracked: bool = True) -> None:
        n_lin = len(config.linear_layers)
        shape = (n_slots + 1, n_lin)
        heads = (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
        self.conv = device.zeros(*shape, config.conv_dim, config.linear_conv_kernel_dim - 1)
        self.rec = device.zeros(*shape, *heads)
        self.pending = device.zeros(*shape, SNAPSHOT_ALIGN - 1, pending_width(config))
        self.next_token = device.zeros(n_slots + 1, dtype=torch.long)  # last sampled token, per live slot
        self.run = device.zeros(*shape, *heads) if running else None
        self.run_rows = device.zeros(*shape, 2, dtype=torch.int32).fill_(-1) if running else None
        # the step digests' memo (``ops.checksum.memo``); None: every digest reads the whole state back
        self.memo = StateMemo(n_slots + 1, self.conv.device) if tracked else None
        self._read_back = 0  # the bytes the read-back checksums have read
        # what ``nbytes`` adds up, and the pools as the checksum kernel reads them (fixed for the pools' life)
        self._slot_bytes = self.conv[0].nbytes + self.rec[0].nbytes
        self._row_bytes = self.pending[0, :, 0].nbytes
        self._layouts = (pool_words(self.conv, partial=False), pool_words(self.rec, partial=False),
                         pool_words(self.pending, partial=True))
        self._copier = None  # ``copy_witnessed``'s on CUDA (``state_triton.StateCopier``), made at its first copy
        self._digesters = {}  # the state digests' on CUDA (``state_triton.StateDigester``), with or without the memo

    def forget_memos(self, slot: int, *, digests: bool = True) -> None:
        """The slot's bytes were written by something other than a decode step: its memos are stale (the decode
        kernel's running copy, and with ``digests`` the step digests')."""
        if self.run_rows is not None:
            self.run_rows[slot].fill_(-1)
        if self.memo is not None and digests:
            self.memo.forget(slot)

    def copy_slot(self, dst: int, src: int, length: int, *, recurrent: bool = True) -> None:
        """Device-side body of a clone, restore or fork of a state of ``length`` tokens: conv, rec and
        the ``length % 64`` pending rows that mean something (the rest of the buffer is never read).
        ``recurrent=False`` leaves ``dst``'s recurrent state as it was (the fault restore_rec=off)."""
        rows = length % SNAPSHOT_ALIGN
        self.conv[dst].copy_(self.conv[src])
        if recurrent:
            self.rec[dst].copy_(self.rec[src])
        self.pending[dst, :, :rows].copy_(self.pending[src, :, :rows])
        self.forget_memos(dst)

    def copy_witnessed(self, dst: int, src: int, length: int, *, recurrent: bool = True, into: DigestRows | None = None
                       ) -> tuple[int | DeviceDigest, int | DeviceDigest]:
        """``copy_slot``, and the checksums of ``src``'s state as the copy read it and of ``dst``'s as the copy left
        it (an instrumented restore, clone or decode snapshot). On CUDA one launch copies, digests both ends and
        forgets dst's memos (``state_triton.StateCopier``), into two of ``into``'s rows when given (a batch's: they
        land with its results; a clone's, ``CacheManager._clone_rows``), else copied to the host on their own;
        elsewhere the source is digested before the copy and the destination after."""
        self.count_hashed([length, length])
        if not self.conv.is_cuda:
            read = slot_checksum(self.slot_bytes(src, length))
            self.copy_slot(dst, src, length, recurrent=recurrent)
            return read, slot_checksum(self.slot_bytes(dst, length))
        if self._copier is None:
            from mini_engine.ops.checksum.state_triton import StateCopier

            self._copier = StateCopier(conv=self.conv, rec=self.rec, pending=self.pending, layouts=self._layouts,
                                       run_rows=self.run_rows, memo=self.memo)  # (dst's memos forgotten in its launch)
        out, first = into.take(2) if into is not None else (None, 0)
        lanes = self._copier(dst, src, length, recurrent=recurrent, out=out)
        read, written = DeviceDigest.each_of(lanes) if into is None else into.each_of(first, 2)
        return read, written

    def clear_slot(self, slot: int) -> None:
        """Device-side body of a cold start: the empty state (no pending rows to clear)."""
        self.conv[slot].zero_()
        self.rec[slot].zero_()
        self.forget_memos(slot)

    def slot_bytes(self, slot: int, length: int) -> torch.Tensor:
        """The exact bytes that define a state of ``length`` tokens in ``slot``, in checksum order (``state_bytes``)."""
        return state_bytes(self.conv[slot], self.rec[slot], self.pending[slot, :, : length % SNAPSHOT_ALIGN])

    def nbytes(self, length: int) -> int:
        """The size of ``slot_bytes`` for a state of ``length`` tokens (what a copy of it moves)."""
        return self._slot_bytes + (length % SNAPSHOT_ALIGN) * self._row_bytes

    @property
    def hashed_bytes(self) -> int:
        """The bytes the ledger's checksums have read: its device work (on a GPU with the memo, a sync)."""
        return self._read_back + (self.memo.hashed_bytes() if self.memo is not None else 0)

    def checksums(self, slots: list[int], lengths: list[int], *, into: DigestRows | None = None
                  ) -> list[int | DeviceDigest]:
        """The 64-bit checksum of the state of ``lengths[i]`` tokens in ``slots[i]``, read back whole (call it inside
        a device op): ints, or on CUDA ``DeviceDigest``s of the same bytes computed together, one launch for all
        the slots (no copy of a slot, no sync), into ``into``'s rows when given (``copy_witnessed``)."""
        self.count_hashed(lengths)
        if not slots:
            return []
        if not self.conv.is_cuda:
            return [slot_checksum(self.slot_bytes(s, n)) for s, n in zip(slots, lengths)]
        return self._device_digests(slots, lengths, None, into)

    def step_checksums(self, slots: list[int], lengths: list[int], *, into: DigestRows | None = None
                       ) -> list[int | DeviceDigest]:
        """``checksums`` of the live slots a forward has just written (distinct slots), through the memo: what
        the slots' last digests read and nothing has written since is not read again (``ops.checksum.memo``)."""
        if self.memo is None:
            return self.checksums(slots, lengths, into=into)
        if not self.conv.is_cuda:
            return [self.memo.host_digest(self.conv[s], self.rec[s], self.pending[s], s, n)
                    for s, n in zip(slots, lengths)]
        return self._device_digests(slots, lengths, self.memo, into)

    def _device_digests(self, slots: list[int], lengths: list[int], memo: StateMemo | None,
                        into: DigestRows | None) -> list[DeviceDigest]:
        if into is None:
            return DeviceDigest.each_of(self._uploaded_lanes(slots, lengths, memo))
        out, first = into.take(len(slots))
        self._uploaded_lanes(slots, lengths, memo, out)
        return into.each_of(first, len(slots))

    def lanes(self, slots: list[int], lengths: list[int]) -> torch.Tensor:
        """The checksum kernel's lane sums [n, 2] of each (slot, length)'s state bytes read back whole, on the
        pools' device: one upload of the indices, one launch over the three pools (``state_lanes``), no sync."""
        return self._uploaded_lanes(slots, lengths, None)

    def _uploaded_lanes(self, slots: list[int], lengths: list[int], memo: StateMemo | None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        index = upload(torch.tensor([slots, lengths], dtype=torch.int32), self.conv.device)
        return self._lanes(index[0], index[1], memo, out)

    def step_lanes(self, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``step_checksums``' lane sums for distinct slots and state lengths already on the device (int32 [n]
        each): launches alone, so a CUDA graph can replay them (the decode step's ledger digests,
        ``DecodeGraphs(after=)``). The caller counts the bytes of read-back digests (``count_step``)."""
        return self._lanes(slots, lengths, self.memo)

    def _lanes(self, slots: torch.Tensor, lengths: torch.Tensor, memo: StateMemo | None,
               out: torch.Tensor | None = None) -> torch.Tensor:
        digester = self._digesters.get(memo is not None)
        if digester is None:
            from mini_engine.ops.checksum.state_triton import StateDigester

            digester = self._digesters[memo is not None] = StateDigester(
                conv=self.conv, rec=self.rec, pending=self.pending, layouts=self._layouts, memo=memo)
        return digester(slots, lengths, out=out)

    def count_hashed(self, lengths: list[int]) -> None:
        """Add the bytes of states of ``lengths`` tokens read back whole to ``hashed_bytes``."""
        self._read_back += sum(self.nbytes(n) for n in lengths)

    def count_step(self, lengths: list[int]) -> None:
        """Count the bytes of a graph's ``step_lanes``: read back whole without the memo (the memo counts its own)."""
        if self.memo is None:
            self.count_hashed(lengths)

    def read(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv, rec and pending rows of a state of ``length`` tokens in ``slot``, as views of the pools (no
        copy): read them inside the device op, before anything writes the slot (a forward stacks and packs them
        before the runner writes its results back)."""
        return self.conv[slot], self.rec[slot], self.pending[slot, :, : length % SNAPSHOT_ALIGN]

    def write_snapshot(self, slot: int, snapshot: Snapshot) -> None:
        """A snapshot slot at a 64-multiple: conv and rec, no pending rows."""
        self.conv[slot].copy_(snapshot.conv)
        self.rec[slot].copy_(snapshot.rec)
        self.forget_memos(slot)

    def write(self, slot: int, state: SequenceState) -> None:
        """A forward's state written back whole (a prefill's; the reference decode's every step)."""
        digested_kept = self._digested_kept(slot, state)
        self.conv[slot].copy_(state.conv)
        self.rec[slot].copy_(state.rec)
        rows = state.pending.shape[1]
        self.pending[slot, :, :rows].copy_(state.pending)
        self.forget_memos(slot, digests=not digested_kept)

    def _digested_kept(self, slot: int, state: SequenceState) -> bool:
        """Whether writing ``state`` to ``slot`` leaves the bytes its step digests' memo covers (rec and the rows
        it digested) bit for bit as they are, so the memo holds: the reference decode writes a whole state back
        every step, the same rec and rows and one row more. Compared on the host, a cheaper pass than hashing
        them again; on a GPU a compare would cost what the hash does (and a sync), so the memo is forgotten."""
        if self.memo is None or self.conv.is_cuda:
            return False
        known = known_rows(int(self.memo.lengths[slot]), state.length)
        if known < 0 or state.pending.shape[1] < known:
            return False
        return (_same_bits(self.rec[slot], state.rec)
                and _same_bits(self.pending[slot, :, :known], state.pending[:, :known]))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float32 tensors hold the same bytes (-0.0 is not 0.0, a NaN is itself)."""
    return (a.shape == b.shape and a.dtype == b.dtype == torch.float32
            and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)))


class KVStorage:
    """``keys/values[pages, L_full, page_size, Hkv, D]``: attention KV, paged."""

    def __init__(self, config: ModelConfig, n_pages: int, page_size: int, device: Device) -> None:
        shape = (n_pages, len(config.full_layers), page_size, config.num_key_value_heads, config.head_dim)
        self.page_size = page_size
        self.keys = device.zeros(*shape)
        self.values = device.zeros(*shape)

    def copy_page(self, dst: int, src: int) -> None:
        """Device-side body of a page copy-on-write."""
        self.keys[dst].copy_(self.keys[src])
        self.values[dst].copy_(self.values[src])

    def gather(self, pages: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions [0, length) through a page table -> two [L_full, length, Hkv, D] tensors."""
        n = -(-length // self.page_size)
        index = upload(torch.tensor(pages[:n], dtype=torch.long), self.keys.device)  # (a host index would sync)
        out = []
        for t in (self.keys, self.values):
            rows = t[index].transpose(0, 1).reshape(t.shape[1], n * self.page_size, *t.shape[3:])
            out.append(rows[:, :length])
        return out[0], out[1]

    def scatter(self, pages: list[int], start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write [L_full, n, Hkv, D] KV for positions [start, start + n) through a page table."""
        positions = torch.arange(start, start + keys.shape[1])
        host = torch.stack([torch.tensor(pages, dtype=torch.long)[positions // self.page_size],
                            positions % self.page_size])
        page_index, offsets = upload(host, self.keys.device)  # one upload, both indices
        self.keys[page_index, :, offsets] = keys.transpose(0, 1)
        self.values[page_index, :, offsets] = values.transpose(0, 1)
