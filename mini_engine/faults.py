"""The fault catalogue: each fault switches exactly one safeguard off (DESIGN.md §4). Torch-free.

A fault never writes garbage. It removes a barrier, a copy, a write or a check, and whatever
corruption follows comes out of the engine's real mechanism: ordering on the device, ownership of
slot ids, a snapshot nobody wrote. Every place a fault skips its safeguard emits a ``fault`` event
(``name``, ``site`` and the ids involved), so a ledger shows where the safeguard *would* have acted.

    fault                 safeguard removed                          where it acts
    donate=transfer       copy-on-donate                             cache_manager.commit / finish
    admission_barrier=off the slot fences before a restore / clone   cache_manager._restore / _clone
    track_writer=off      the forward's x64-boundary snapshot write  runner._forward
    metadata_fence=off    readback fence + per-slot predecessor      metadata.ResidentDecodeMetadata
    page_cow=off          copy-on-write of a shared page             cache_manager.copy_on_write
    evict_locked=on       snapshot locks respected by eviction       cache.radix.RadixTree.evict
    media_key=off         the media digest in the cache key          engine.submit

``EXTRA_FAULTS`` are safeguard removals *outside* the catalogue, never named in DESIGN.md: the fault
matrix runs them to check that its patterns catch bugs the harness was not built around.

    restore_rec=off       a restore copies the recurrent state too   cache_manager._copy_reported
    free_unfenced=on      a freed slot's next owner waits for the     cache_manager._free_slot
                          ops still in flight on it
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ALL_FAULTS", "EXTRA_FAULTS", "FAULTS", "parse_faults"]

FAULTS: dict[str, str] = {
    "donate=transfer": "the tree takes the request's snapshot slot id instead of a private clone "
                       "(a batch built before the donation still writes it)",
    "admission_barrier=off": "restores and donation clones no longer wait for the other stream's last op "
                             "on their slots",
    "track_writer=off": "the forward never writes the 64-boundary state into the track snapshot slot "
                        "(the slot keeps its prior content)",
    "metadata_fence=off": "decode page mappings are marked clean as soon as their upload is queued "
                          "(no readback fence, no per-slot predecessor wait)",
    "page_cow=off": "a page shared by two requests is written in place instead of copied first",
    "evict_locked=on": "snapshot eviction ignores snapshot locks (a slot about to be restored is freed "
                       "and reused)",
    "media_key=off": "the media digest is left out of the cache key (different media share a prefix)",
}


EXTRA_FAULTS: dict[str, str] = {
    "restore_rec=off": "a restore copies the conv state and the pending rows but not the recurrent state (the "
                       "live slot keeps its previous owner's)",
    "free_unfenced=on": "a freed slot forgets the ops still in flight on it, so its next owner's first write does "
                        "not wait for them (a donation clone may still be reading it)",
}
ALL_FAULTS = {**FAULTS, **EXTRA_FAULTS}


def parse_faults(names: Iterable[str]) -> frozenset[str]:
    """Validate fault names (``name=value`` as in the catalogue or ``EXTRA_FAULTS``); raises ValueError
    naming the bad one."""
    faults = frozenset(names)
    unknown = sorted(faults - ALL_FAULTS.keys())
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(map(repr, unknown))}; known faults: "
                         f"{', '.join(ALL_FAULTS)}")
    return faults
