"""Slot checksum: a 64-bit digest of a tensor's exact bytes."""

from mini_engine.ops.checksum.reference import (
    checksum_bytes,
    checksum_ints,
    checksum_words,
    row_checksums,
    slot_checksum,
)

__all__ = ["checksum_bytes", "checksum_ints", "checksum_words", "row_checksums", "slot_checksum"]
