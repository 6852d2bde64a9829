"""What a forward adds for the slot ledger on the runner's side: a decode step's device digests (``step_digests``,
which a step's CUDA graph replays), the logits' checks, and the rows a decode step's digests become
(``decode_step_rows``; ``live_write`` and ``metadata_read`` for the rows emitted one at a time)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from mini_engine.engine.storage import StateStorage
from mini_engine.ops.checksum import row_checksums
from mini_engine.ops.checksum.deferred import rows_lanes

if TYPE_CHECKING:
    from mini_engine.engine.runner import BatchItem

__all__ = ["CHECK_MASK", "decode_step_rows", "live_write", "logits_checks", "metadata_read", "step_digests"]

CHECK_MASK = (1 << 63) - 1  # a logits check fits a signed 64-bit tensor element


def decode_step_rows(batch: int, items: Sequence[BatchItem], staged: Callable[[tuple[int, ...]], int]
                     ) -> Callable[[list[int], int, int], list[dict]]:
    """The builder of a decode step's ledger rows for ``Instrumentation.emit_rows``: per decode item (its request's
    rid, its live slot, its position after the step, its page table) a ``slot_write`` and a ``decode_metadata`` row;
    the digests are the B states' then the B page tables' read; ``staged(pages)`` the digest of a staged page table.
    Everything it reads of the items is fixed when they are built (``BatchItem`` is frozen, a request keeps its
    rid), so the rows and the staged digests are made when the digests land: at the flush, in the device's shadow
    where it can (``Engine._process``), not on the step's path. The rows of ``live_write`` and ``metadata_read``,
    written out: one dict a row."""
    n = len(items)

    def rows(digests: list[int], step: int, seq: int) -> list[dict]:
        made = []
        for it, written, read in zip(items, digests[:n], digests[n:]):
            rid, expected = it.request.rid, staged(it.pages)
            made.append({"type": "slot_write", "step": step, "seq": seq, "batch": batch, "rid": rid,
                         "slot": it.live_slot, "role": "live", "position": it.start + 1, "checksum": written})
            made.append({"type": "decode_metadata", "step": step, "seq": seq + 1, "batch": batch, "rid": rid,
                         "read_checksum": read, "staged_checksum": expected, "match": read == expected})
            seq += 2
        return made

    return rows


def live_write(batch: int, rid: str, slot: int, position: int, checksum) -> dict:
    """A ``slot_write`` row's fields: the checksum of the state a forward left in a live slot (both decode paths)."""
    return {"batch": batch, "rid": rid, "slot": slot, "role": "live", "position": position, "checksum": checksum}


def metadata_read(batch: int, rid: str, read: int, staged: int) -> dict:
    """A ``decode_metadata`` row's fields: the page table a decode step read against the one staged for it."""
    return {"batch": batch, "rid": rid, "read_checksum": read, "staged_checksum": staged, "match": read == staged}


def step_digests(states: StateStorage, inputs: torch.Tensor, table: torch.Tensor, logits: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The slot ledger's digests of a decode step on CUDA, device work alone (``DecodeGraphs(after=)`` captures it
    with the step): the logits' checks [B], and lanes [2B, 2] int64: of each sequence's state after the step
    (``StateStorage.step_lanes`` at position + 1), then of the page-table row each read (``table`` row b cut to the
    sequence's page count). ``inputs``: the step's [4, B] long (``step_inputs`` with the page counts)."""
    slots, positions, counts = inputs[0], inputs[1], inputs[3]
    state = states.step_lanes(slots.to(torch.int32), (positions + 1).to(torch.int32))
    read = rows_lanes(table, counts.to(torch.int32))
    return logits_checks(logits), torch.cat([state, read])


def logits_checks(logits: torch.Tensor) -> torch.Tensor:
    """The 63-bit checks [B] (int64) of the exact logits [B, vocab] tokens were sampled from: on CUDA
    computed on the device (one or two launches), into the batch's device results without a host round trip; on the
    CPU the rows' digests in one pass (``row_checksums``)."""
    if logits.is_cuda:
        from mini_engine.ops.checksum.triton import row_digests

        return row_digests(logits, drop_sign=True)
    return torch.tensor([check & CHECK_MASK for check in row_checksums(logits)], dtype=torch.long)
