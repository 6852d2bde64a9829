"""Resident decode metadata: page mappings kept on the device behind a dirty key, with a verified fence.

Per (ping-pong buffer, shard) the slice of the page table a decode kernel reads stays resident on
the device. A step whose shard bytes equal the shard's *clean key* (the bytes known to be on the
device) pays nothing; a dirty shard is staged on the host and uploaded on the copy stream.

An enqueued upload is ordered against nothing the *next* kernel does, so two edges are closed:

- verified readback fence (``fence=True``): read the shard back (blocking: the copy has landed),
  compare bytes with the staged source, mark clean only on a match, re-upload on a mismatch and
  raise ``MetadataFenceError`` after ``max_attempts``, leaving the key dirty;
- per-buffer predecessor (``predecessor=True``): the upload waits for the last dispatch that read
  this buffer (``mark_dispatched``), so it never rewrites mappings a running kernel still reads.

``fence=False`` is the fault ``metadata_fence=off``: the key is marked clean as soon as the copy is
queued, and a kernel on another stream may run before it lands and read the previous mappings.

Shard layout: shard ``r`` holds columns ``[r*w, (r+1)*w)`` of the table, ``w = pages // n_shards``::

    table [max_batch, pages]   | shard 0 (w cols) | shard 1 (w cols) | ... |
"""

from __future__ import annotations

import hashlib
import time
from typing import NamedTuple

import torch

from mini_engine.device.base import Device, Event, Stream
from mini_engine.instrument import Instrumentation, Later
from mini_engine.ops.checksum import checksum_bytes, slot_checksum
from mini_engine.ops.checksum.memo import DigestCache

__all__ = ["MetadataFenceError", "PrepareResult", "ResidentDecodeMetadata", "gather_shards"]


class MetadataFenceError(RuntimeError):
    """The device kept contradicting its own readback: the metadata it holds is unknown."""


class PrepareResult(NamedTuple):
    shards: tuple[torch.Tensor, ...]  # the buffer's device shards, in shard order (what the kernel reads)
    uploaded_shards: tuple[int, ...]  # shards that were dirty and uploaded by this call
    readbacks: int  # fence readbacks issued by this call
    retries: int  # re-uploads after a mismatching readback, by this call


def gather_shards(shards: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The full ``[max_batch, pages]`` table from its shards; call it inside a kernel, when it runs."""
    return torch.cat(shards, dim=1)


class ResidentDecodeMetadata:
    """Device-resident page-table shards per (buffer, shard), uploaded only when their bytes change.

    Not thread-safe: one host thread (the model runner) calls ``prepare`` / ``mark_dispatched``.
    """

    def __init__(self, device: Device, copy_stream: Stream, table_shape: tuple[int, int], *,
                 n_buffers: int = 2, n_shards: int = 2, fence: bool = True, predecessor: bool = True,
                 max_attempts: int = 3, instrumentation: Instrumentation | None = None) -> None:
        _check_config(table_shape, n_buffers, n_shards, max_attempts)
        self.device, self.copy_stream = device, copy_stream
        self.table_shape = (int(table_shape[0]), int(table_shape[1]))
        self.n_buffers, self.n_shards = n_buffers, n_shards
        self.shard_shape = (self.table_shape[0], self.table_shape[1] // n_shards)
        self.fence, self.predecessor, self.max_attempts = fence, predecessor, max_attempts
        self.instrumentation = instrumentation
        pinned = device.torch_device.type == "cuda"
        self._resident = [tuple(device.zeros(*self.shard_shape, dtype=torch.int32) for _ in range(n_shards))
                          for _ in range(n_buffers)]
        self._staging = [[torch.zeros(self.shard_shape, dtype=torch.int32, pin_memory=pinned)
                          for _ in range(n_shards)] for _ in range(n_buffers)]
        self._clean_keys: list[list[bytes | None]] = [[None] * n_shards for _ in range(n_buffers)]
        self._last_dispatch: list[Event | None] = [None] * n_buffers
        self.uploads = self.readbacks = self.retries = self.clean_skips = 0
        # the ledger's checksums of staged shards by content (the key): double buffering stages each new content
        # into every buffer in turn, and a repeat costs a dict lookup, not a digest
        self._staged_checksums = DigestCache(_STAGED_CHECKSUMS)
        self.readback_seconds = 0.0  # host time blocked in the fence's readbacks (behind the copy stream's queue)

    def prepare(self, buffer: int, table: torch.Tensor) -> PrepareResult:
        """Make ``buffer``'s device shards hold ``table`` for the next kernel; mutates; raises on bad input.

        Clean shards queue no device op. Dirty shards are uploaded (after this buffer's last
        dispatch if ``predecessor``) and, if ``fence``, verified by readback before this returns.
        Raises ``MetadataFenceError`` when a shard never verifies; that shard stays dirty.
        """
        self._check_buffer(buffer)
        self._check_table(table)
        readbacks0, retries0, uploaded = self.readbacks, self.retries, []
        for shard, host_shard in enumerate(table.chunk(self.n_shards, dim=1)):
            key = host_shard.contiguous().numpy().tobytes()
            if self._clean_keys[buffer][shard] == key:
                self.clean_skips += 1
                continue
            self._wait_predecessor(buffer)
            self._upload(buffer, shard, host_shard, key)
            uploaded.append(shard)
        return PrepareResult(self._resident[buffer], tuple(uploaded),
                             self.readbacks - readbacks0, self.retries - retries0)

    def mark_dispatched(self, buffer: int, event: Event) -> None:
        """Remember ``event``, recorded on the compute stream after the kernel that read ``buffer``; mutates."""
        self._check_buffer(buffer)
        self._last_dispatch[buffer] = event

    def invalidate(self) -> None:
        """Forget every clean key: the next ``prepare`` of each shard uploads it; mutates."""
        self._clean_keys = [[None] * self.n_shards for _ in range(self.n_buffers)]

    def is_clean(self, buffer: int, shard: int) -> bool:
        """Whether (buffer, shard) has a clean key, i.e. its device content is known; pure."""
        self._check_buffer(buffer)
        if not isinstance(shard, int) or not 0 <= shard < self.n_shards:
            raise ValueError(f"shard must be an int in [0, {self.n_shards}); got {shard!r}")
        return self._clean_keys[buffer][shard] is not None

    def _wait_predecessor(self, buffer: int) -> None:
        # Once the copy stream waits on an event, every later copy is ordered after it: wait once.
        event = self._last_dispatch[buffer]
        if self.predecessor and event is not None:
            self.device.wait_event(self.copy_stream, event)
            self._last_dispatch[buffer] = None

    def _upload(self, buffer: int, shard: int, host_shard: torch.Tensor, key: bytes) -> None:
        self._clean_keys[buffer][shard] = None  # in flux until proven (or, unfenced, assumed) landed
        self._staging[buffer][shard].copy_(host_shard)
        if not self.fence:
            self._enqueue_copy(buffer, shard, key, attempt=1)
            self._clean_keys[buffer][shard] = key
            self._emit("fault", name="metadata_fence=off", site="metadata_upload", buffer=buffer, shard=shard)
            return
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                self.retries += 1
            self._enqueue_copy(buffer, shard, key, attempt)
            if self._readback_matches(buffer, shard, key):
                self._clean_keys[buffer][shard] = key
                return
        raise MetadataFenceError(
            f"decode metadata buffer={buffer} shard={shard}: readback still differs from the staged "
            f"source after {self.max_attempts} upload attempts; the shard is left dirty and the "
            "device copy path is suspect (check the copy stream and the device)")

    def _enqueue_copy(self, buffer: int, shard: int, key: bytes, attempt: int) -> None:
        self.device.copy(self.copy_stream, self._resident[buffer][shard], self._staging[buffer][shard],
                         label=f"metadata_upload:b{buffer}s{shard}")
        self.uploads += 1
        if self._instrumented():
            with self.instrumentation.timing():  # the ledger's own host time, its digest of the key included
                self._emit("metadata_upload", buffer=buffer, shard=shard, attempt=attempt,
                           key_digest=hashlib.blake2b(key, digest_size=8).hexdigest())

    def _readback_matches(self, buffer: int, shard: int, key: bytes) -> bool:
        staged = self._staging[buffer][shard]
        started = time.perf_counter()
        landed = self.device.readback(self.copy_stream, self._resident[buffer][shard],
                                      label=f"metadata_readback:b{buffer}s{shard}")
        self.readback_seconds += time.perf_counter() - started
        self.readbacks += 1
        match = torch.equal(landed, staged)
        if self._instrumented():
            with self.instrumentation.timing():  # the ledger's own host time, its digests included
                # the staged bytes' digest when the row is flushed (the key: staged's bytes, which stay as they are)
                staged_checksum = Later(self._staged_checksums.get, key, checksum_bytes, key)
                readback_checksum = staged_checksum if match else slot_checksum(landed)  # equal bits: one digest
                self._emit("metadata_readback", buffer=buffer, shard=shard, match=match,
                           readback_checksum=readback_checksum, staged_checksum=staged_checksum)
        return match

    def _instrumented(self) -> bool:
        return self.instrumentation is not None and self.instrumentation.enabled

    def _emit(self, type_: str, **fields: object) -> None:
        if self._instrumented():
            self.instrumentation.emit(type_, stream=self.copy_stream.name, **fields)

    def _check_buffer(self, buffer: int) -> None:
        if not isinstance(buffer, int) or not 0 <= buffer < self.n_buffers:
            raise ValueError(f"buffer must be an int in [0, {self.n_buffers}); got {buffer!r}")

    def _check_table(self, table: torch.Tensor) -> None:
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"table must be a host torch.Tensor; got {type(table).__name__}")
        if table.dtype != torch.int32 or tuple(table.shape) != self.table_shape or table.device.type != "cpu":
            raise ValueError(f"table must be a host int32 tensor of shape {self.table_shape}; got "
                             f"{table.dtype} {tuple(table.shape)} on {table.device}")


_STAGED_CHECKSUMS = 1024  # staged shard contents whose checksums the ledger remembers


def _check_config(table_shape: tuple[int, int], n_buffers: int, n_shards: int, max_attempts: int) -> None:
    if len(table_shape) != 2 or min(table_shape) < 1:
        raise ValueError(f"table_shape must be (max_batch, pages), both >= 1; got {table_shape!r}")
    for name, value in (("n_buffers", n_buffers), ("n_shards", n_shards), ("max_attempts", max_attempts)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value!r}")
    if table_shape[1] % n_shards:
        raise ValueError(f"table_shape[1] (pages = {table_shape[1]}) must be divisible by "
                         f"n_shards = {n_shards}; pick a page count that is a multiple of n_shards")
