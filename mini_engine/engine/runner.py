"""The model runner: turns a batch plan into one device op that gathers, computes and scatters.

Everything the forward reads — slots, pages, the token a decode step feeds — is read when the op
*runs* on the device, not when it was built: under overlap scheduling a batch built before a
donation still names the slot ids it was built with, exactly as a real engine's would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.device import Device, Event, Stream, upload
from mini_engine.engine.fences import SlotFences
from mini_engine.engine.landing import DigestArena, Landing, lands_in_rows
from mini_engine.engine.metadata import ResidentDecodeMetadata, gather_shards
from mini_engine.engine.request import Commit, Request, SamplingParams
from mini_engine.engine.step_ledger import decode_step_rows, live_write, logits_checks, metadata_read, step_digests
from mini_engine.engine.storage import KVStorage, StateStorage
from mini_engine.instrument import Instrumentation
from mini_engine.model import HybridModel, SequenceState
from mini_engine.model.decode import DecodeGraphs, DecodeModel, Pools, decode_step, step_inputs
from mini_engine.model.hybrid import MediaRows
from mini_engine.model.media import media_features
from mini_engine.model.state import Snapshot
from mini_engine.ops import pdl
from mini_engine.ops.checksum import checksum_ints
from mini_engine.ops.checksum.deferred import DeviceDigests, DigestRows
from mini_engine.ops.checksum.memo import DigestCache

__all__ = ["Batch", "BatchItem", "ModelRunner"]


@dataclass(frozen=True)
class BatchItem:
    request: Request
    start: int  # absolute position of the first token fed
    length: int  # tokens fed
    tokens: torch.Tensor | None  # prompt tokens (host); None: feed next_token[live_slot] (decode)
    live_slot: int
    pages: tuple[int, ...]  # page table at build time
    sample: bool  # sample a token after the last position
    track: Commit | None  # where this forward writes the deepest 64-boundary snapshot
    media: tuple[tuple[int, bytes], ...] = ()  # (offset in this forward, media item) per placeholder fed


@dataclass
class Batch:
    index: int
    items: list[BatchItem]
    sampled: torch.Tensor  # device [len(items), 2] long where item.sample: the token, the logits' check
    host_sampled: torch.Tensor  # host copy of ``sampled``, landed once ``done`` is complete
    done: Event
    metadata_buffer: int = 0
    # the ledger's digests of the forward on CUDA: rows of the same results tensors after ``sampled``'s, landing
    # with them (``ModelRunner.launch``); None elsewhere
    digests: DigestRows | None = None
    results: torch.Tensor | None = None  # the whole device results tensor: ``sampled``'s rows, then ``digests``'


class ModelRunner:
    """Launches forwards. Decode steps read their page mappings from the resident decode metadata
    (uploaded only when they change, fenced by a verified readback); prefills carry their own."""

    def __init__(self, model: HybridModel, states: StateStorage, kv: KVStorage, device: Device,
                 stream: Stream, metadata: ResidentDecodeMetadata, fences: SlotFences, *,
                 instrumentation: Instrumentation, track_writer: bool = True, decode_path: str = "reference",
                 prefill_path: str = "reference", cuda_graphs: bool = False, decode_gemm: str = "cublas",
                 decode_gdn: str = "split", decode_pdl: bool | None = None, decode_gemm_table: dict | None = None,
                 decode_split_sums: str = "norm", decode_swiglu: str = "gemm") -> None:
        self.model, self.states, self.kv, self.device, self.stream = model, states, kv, device, stream
        self.metadata, self.fences, self.events = metadata, fences, instrumentation
        self.track_writer = track_writer  # False: the fault track_writer=off (the op never writes snapshots)
        if decode_path not in ("reference", "triton"):
            raise ValueError(f"decode_path must be 'reference' or 'triton'; got {decode_path!r}")
        self.decode_path = decode_path  # "triton": decode items go through model.decode.decode_step
        self.prefill_path = prefill_path  # HybridModel.forward's kernels
        self.pools = Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows)
        refused = pdl.supported(device.torch_device)
        if decode_pdl and refused:
            raise ValueError(f"EngineConfig.decode_pdl=True: {refused}")
        if decode_pdl is None:  # where the device can: the same bits, a shorter step
            decode_pdl = decode_path == "triton" and refused is None
        self.decode_model = (DecodeModel(model, gemm=decode_gemm, gdn=decode_gdn, pdl=decode_pdl,
                                         gemm_table=decode_gemm_table, split_sums=decode_split_sums,
                                         swiglu=decode_swiglu)
                             if decode_path == "triton" else None)
        # with a sink, each graph also replays the ledger's digests of its step (``step_digests``): no launch of
        # theirs from the host per step
        after = (lambda inputs, table, logits: step_digests(states, inputs, table, logits)) \
            if instrumentation.enabled else None
        self.graphs = (DecodeGraphs(self.decode_model, self.pools, states.next_token, after=after)
                       if cuda_graphs and decode_path == "triton" and device.torch_device.type == "cuda" else None)
        self._batches = 0
        self.waited = 0.0  # seconds the host blocked in ``results`` (its device's shadow)
        # the checksums of staged page tables (a sequence's change once a page, not once a step)
        self._staged_digests = DigestCache(_STAGED_DIGESTS)
        # the ledger's digests on CUDA land with the batches' results (``DigestRows``): the next batch's landing,
        # and the rows of the work queued before its forward (``early_rows``)
        self._digest_rows = lands_in_rows(device, instrumentation)
        self._landing: Landing | None = None
        self._early: list[DigestRows] = []
        self._early_arena = DigestArena(device, self.stream)

    def results(self, batch: Batch) -> list[tuple[int, int]]:
        """Block until ``batch`` has run and return (sampled token, logits check) per item (batches launched
        later may still be queued). The check is a 63-bit checksum of the exact logits the token was
        sampled from when the engine is instrumented, else 0: two runs that sampled from different
        logits differ there even when the token came out the same. ``waited`` counts the host time blocked
        here: where it is a small part of a run, the device waited for the host the rest of it."""
        started = time.perf_counter()
        self.device.wait_host(batch.done)
        self.waited += time.perf_counter() - started
        return [tuple(row) for row in batch.host_sampled.tolist()]

    def launch(self, items: list[BatchItem]) -> Batch:
        """Queue the forward of ``items`` on the compute stream; returns once the op is queued."""
        self._batches += 1
        buffer = self._batches % self.metadata.n_buffers
        shards = self.metadata.prepare(buffer, self._decode_table(items)).shards
        pinned = self.device.torch_device.type == "cuda"
        # the results: a row per item (token, logits check), then on CUDA with a sink the rows of the forward's
        # ledger digests, at most four an item: a decode item's state and page table, a snapshot's two ends
        n = len(items)
        rows = n + (4 * n if self._digest_rows else 0)
        results = self.device.zeros((rows, 2), dtype=torch.long, stream=self.stream)  # (``landing``'s docstring)
        host = torch.zeros((rows, 2), dtype=torch.long, pin_memory=pinned)
        batch = Batch(self._batches, items, results[:n], host[:n], Event(0), buffer, results=results)
        landing, self._landing = self._landing or Landing(self.device), None
        if rows > n:
            batch.digests = DigestRows(results[n:], host[n:], landing)
        slots = [it.live_slot for it in items] + [it.track.slot for it in items if it.track is not None]
        self.fences.before(self.stream, slots)
        if not self.track_writer:
            for it in items:
                if it.track is not None:
                    self.events.emit("fault", name="track_writer=off", site="forward", rid=it.request.rid,
                                     slot=it.track.slot, position=it.track.position)
        self.device.launch(self.stream, lambda: self._forward(batch, shards), label=f"forward#{batch.index}")
        # The sampled tokens come back right behind the forward: processing batch N waits for N
        # alone, while N+1 (built under overlap) may still be queued behind it.
        self.device.copy(self.stream, host, results, label=f"tokens#{batch.index}")
        for early in self._early:  # the digests of what was queued before the forward, landing with its results
            self.device.copy(self.stream, early.host, early.device, label=f"early_digests#{batch.index}")
        self._early = []
        batch.done = landing.done = self.fences.after(self.stream, slots)
        self.metadata.mark_dispatched(buffer, batch.done)
        return batch

    def early_rows(self) -> DigestRows | None:
        """Digest rows, two at least left, for ledger work queued on the compute stream before the next forward (a
        hit's restore, ``CacheManager``): read back with that forward's results. None off CUDA or without a sink."""
        if not self._digest_rows:
            return None
        if not self._early or self._early[-1].left < 2:
            if self._landing is None:
                self._landing = Landing(self.device)
            with self.events.timing():
                self._early.append(self._early_arena.block(_EARLY_ROWS, self._landing))
        return self._early[-1]

    def _decode_table(self, items: list[BatchItem]) -> torch.Tensor:
        """Row r: the page table of the r-th decode item (zero-padded); prefill rows stay zero. Filled in numpy: a
        tensor and a torch slice assignment a row were the largest part of a batch-32 step's host time (an H100
        host under cProfile, session 31); at batch 32 on the development VM numpy takes 23 us to torch's 166 alone, 87
        to 201 inside an engine's steps (``benchmarks/decode_table.py``)."""
        table = np.zeros(self.metadata.table_shape, dtype=np.int32)
        for row, it in enumerate(i for i in items if i.tokens is None):
            table[row, : len(it.pages)] = it.pages
        return torch.from_numpy(table)

    def _forward(self, batch: Batch, shards: tuple[torch.Tensor, ...]) -> None:
        items = batch.items
        resident = gather_shards(shards)  # read when the kernel runs: whatever has landed by then
        decode = [i for i, it in enumerate(items) if it.tokens is None]  # decode item r reads resident row r
        row_of = {i: r for r, i in enumerate(decode)}
        fast = decode if self.decode_path == "triton" else []
        rest = [i for i in range(len(items)) if i not in set(fast)]
        if rest:
            self._forward_model(batch, rest, {i: list(items[i].pages) if i not in row_of
                                              else resident[row_of[i]].tolist() for i in rest})
        if fast:
            self._decode_in_place(batch, fast, resident[: len(decode)])

    def _forward_model(self, batch: Batch, indices: list[int], pages: dict[int, list[int]]) -> None:
        """Items ``indices`` of the batch through ``HybridModel.forward``: each state gathered from the pools
        into tensors, advanced, and written back."""
        items = [batch.items[i] for i in indices]
        tokens = [it.tokens if it.tokens is not None else self.states.next_token[it.live_slot].reshape(1).clone()
                  for it in items]
        states = [self._gather(it, pages[i]) for i, it in zip(indices, items)]
        outputs = self.model(tokens, states, media=[_media_rows(it) for it in items], kernels=self.prefill_path,
                             snapshots="last")  # the track snapshot keeps the last boundary's state
        wrote_track = []
        for i, it, out in zip(indices, items, outputs):
            self.states.write(it.live_slot, out.state)
            new = slice(it.start, it.start + it.length)
            self.kv.scatter(pages[i], it.start, out.state.keys[:, new], out.state.values[:, new])
            wrote_track.append(it.track is not None and bool(out.snapshots) and self.track_writer)
            if wrote_track[-1]:
                self.states.write_snapshot(it.track.slot, out.snapshots[-1])
        # the items that end their prompt sample together, on the device (no host round trip for greedy ones)
        sampled = [(i, it, out.logits[-1]) for i, it, out in zip(indices, items, outputs) if it.sample]
        if sampled:
            logits = torch.stack([last for _, _, last in sampled])
            rows, slots = upload(torch.tensor([[i for i, _, _ in sampled], [it.live_slot for _, it, _ in sampled]]),
                                 logits.device)  # one upload, both indices
            tokens = self._pick_tokens(logits, [it for _, it, _ in sampled])
            batch.sampled[:, 0].index_copy_(0, rows, tokens)
            self.states.next_token.index_copy_(0, slots, tokens)
        if not self.events.enabled:
            return
        with self.events.timing():  # the forward's checksums together (each item wrote its own slots)
            if sampled:
                batch.sampled[:, 1].index_copy_(0, rows, logits_checks(logits).to(batch.sampled.device))
            written = self.states.step_checksums([it.live_slot for it in items],
                                                 [it.start + it.length for it in items], into=batch.digests)
            snapshots = iter(self._snapshot_checksums([it for it, wrote in zip(items, wrote_track) if wrote],
                                                      batch.digests))
            for i, it, checksum, wrote in zip(indices, items, written, wrote_track):
                read = None if it.tokens is not None else checksum_ints(pages[i][: len(it.pages)])
                self._report_writes(batch.index, it, checksum, next(snapshots) if wrote else None, read)

    def _decode_in_place(self, batch: Batch, indices: list[int], table: torch.Tensor) -> None:
        """Decode items ``indices`` (one token each, their page tables the resident ``table`` rows) through
        ``decode_step``: the pools advance in place, and greedy tokens are picked on the device."""
        items = [batch.items[i] for i in indices]
        slots = [it.live_slot for it in items]
        positions = [it.start for it in items]
        counts = [len(it.pages) for it in items]  # each table row's pages (the ledger digests the row cut there)
        if self.graphs is not None:
            self._decode_graphed(batch, indices, items, slots, positions, table, counts)
        else:
            slot_ids, rows = upload(torch.tensor([slots, indices]), self.states.next_token.device)  # one upload
            tokens_in = self.states.next_token.index_select(0, slot_ids)
            logits = decode_step(self.decode_model, self.pools, tokens_in, slots, positions, table)
            tokens = self._pick_tokens(logits, items)
            self.states.next_token.index_copy_(0, slot_ids, tokens)
            batch.sampled[:, 0].index_copy_(0, rows, tokens)
            if self.events.enabled:  # the batch's digests together: a few launches or none, not a few per item
                with self.events.timing():
                    self._report_step(batch.index, items, self._decode_digests(batch, rows, items, counts, table,
                                                                                 logits))
        self._decode_snapshots(batch, items)

    def _decode_graphed(self, batch: Batch, indices: list[int], items: list[BatchItem], slots: list[int],
                        positions: list[int], table: torch.Tensor, counts: list[int]) -> None:
        """``_decode_in_place`` through the step's CUDA graph, which also picks the greedy tokens, stores them as
        the slots' next tokens and lays its results out as the batch's results rows (``DecodeGraphs``; with a sink
        the logits' checks and the ledger's digests too, ``step_digests``): a sampled item's token drawn over its
        row, then one copy where the batch reads them (the items the batch's first and no digest rows taken yet,
        as in a batch of decode items alone), or a copy of the rows to their places."""
        n = len(items)
        ledger = self.graphs.after is not None
        logits, out = self.graphs(slots, positions, table, counts if ledger else None)
        if self._draw_sampled(logits, items, out[:n, 0]):  # over the greedy tokens the graph stored
            device = self.states.next_token.device
            self.states.next_token.index_copy_(0, upload(torch.tensor(slots), device), out[:n, 0])
        digests = batch.digests
        if indices == list(range(n)) and (digests is None or digests.taken == 0):
            batch.results[: out.shape[0]].copy_(out)
            first = digests.take(2 * n)[1] if ledger else 0
        else:
            batch.sampled.index_copy_(0, upload(torch.tensor(indices), out.device), out[:n])
            if ledger:
                rows, first = digests.take(2 * n)
                rows.copy_(out[n:])
        if ledger:
            with self.events.timing():
                self.states.count_step([p + 1 for p in positions])
                self._report_step(batch.index, items, digests.all_of(first, 2 * n))

    def _decode_snapshots(self, batch: Batch, items: list[BatchItem]) -> None:
        """The track snapshots of a decode step: a decode token that completes a chunk leaves the slot at a
        64-boundary, so its conv and rec are the snapshot."""
        snapshots = [it for it in items
                     if it.track is not None and (it.start + 1) % SNAPSHOT_ALIGN == 0 and self.track_writer]
        if batch.digests is not None:  # the ledger's, on CUDA: one launch a snapshot copies it and digests both ends
            with self.events.timing():
                for it in snapshots:
                    _, written = self.states.copy_witnessed(it.track.slot, it.live_slot, it.start + 1,
                                                            into=batch.digests)
                    self._report_snapshot(batch.index, it, written)
            return
        for it in snapshots:
            live = it.live_slot
            self.states.write_snapshot(it.track.slot, Snapshot(it.start + 1, self.states.conv[live],
                                                               self.states.rec[live]))
        if self.events.enabled and snapshots:
            with self.events.timing():
                for it, checksum in zip(snapshots, self._snapshot_checksums(snapshots, None)):
                    self._report_snapshot(batch.index, it, checksum)

    def _decode_digests(self, batch: Batch, rows: torch.Tensor, items: list[BatchItem], counts: list[int],
                        table: torch.Tensor, logits: torch.Tensor) -> DeviceDigests | list[int]:
        """The ledger's digests of an eager decode step, 2B of them: the checksums of the states the items' slots
        were left with, then of the page-table rows the step read; the logits' checks go into the batch's results.
        On CUDA one device computation (``step_digests``, what a step's graph replays), its lanes copied into the
        batch's digest rows (they land with its tokens); on the sim host ints."""
        slots, lengths = [it.live_slot for it in items], [it.start + 1 for it in items]
        if not logits.is_cuda:
            batch.sampled[:, 1].index_copy_(0, rows, logits_checks(logits))
            return [*self.states.step_checksums(slots, lengths),
                    *(checksum_ints(row[: len(it.pages)].tolist()) for it, row in zip(items, table))]
        host = step_inputs(slots, [it.start for it in items], counts)
        checks, lanes = step_digests(self.states, upload(host, logits.device), table[: len(items)], logits)
        batch.sampled[:, 1].index_copy_(0, rows, checks)
        self.states.count_step(lengths)
        out, first = batch.digests.take(2 * len(items))
        out.copy_(lanes)
        return batch.digests.all_of(first, 2 * len(items))

    def _report_step(self, batch: int, items: list[BatchItem], digests: DeviceDigests | list[int]) -> None:
        """A decode step's ledger rows, made together once its ``digests`` land (``Instrumentation.emit_rows``):
        per item the ``slot_write`` of the state its slot was left with and the ``decode_metadata`` of the page
        table the step read against the one staged for it (the metadata a kernel really saw), all made then."""
        self.events.emit_rows(2 * len(items), digests, decode_step_rows(batch, items, self._staged_digest))

    def _snapshot_checksums(self, items: list[BatchItem], into: DigestRows | None) -> list:
        """The checksums of the snapshots ``items`` wrote to their track slots, launched together after them (into
        ``into``'s rows when given)."""
        return self.states.checksums([it.track.slot for it in items], [it.track.position for it in items], into=into)

    def _report_snapshot(self, batch: int, it: BatchItem, checksum) -> None:
        """The ledger row of the snapshot ``it`` wrote to its track slot (``_snapshot_checksums``)."""
        self.events.emit("snapshot_write", batch=batch, rid=it.request.rid, slot=it.track.slot,
                         position=it.track.position, checksum=checksum)

    def _report_writes(self, batch: int, it: BatchItem, written, snapshot, read) -> None:
        """Device-side ledger rows: the checksum ``written`` of what this forward left in the live slot, the checksum
        ``snapshot`` of the snapshot it wrote (None: none), and (a decode item) the checksum ``read`` of the page
        table the step read (cut to its pages), matched against the one staged for it (the metadata a kernel really
        saw). On CUDA the state checksums stay on the device until the ledger reads them
        (``ops.checksum.deferred``)."""
        with self.events.timing():
            rid = it.request.rid
            self.events.emit("slot_write", **live_write(batch, rid, it.live_slot, it.start + it.length, written))
            if snapshot is not None:
                self._report_snapshot(batch, it, snapshot)
            if it.tokens is None:
                self.events.emit("decode_metadata", **metadata_read(batch, rid, read, self._staged_digest(it.pages)))

    def _staged_digest(self, pages: tuple[int, ...]) -> int:
        """The checksum of a staged page table (a host computation, kept: ``_staged_digests``)."""
        return self._staged_digests.get(pages, checksum_ints, pages)

    def _gather(self, it: BatchItem, pages: list[int]) -> SequenceState:
        conv, rec, pending = self.states.read(it.live_slot, it.start)
        keys, values = self.kv.gather(pages, it.start)
        return SequenceState(it.start, conv, rec, pending, keys, values)

    def _pick_tokens(self, logits: torch.Tensor, items: list[BatchItem]) -> torch.Tensor:
        """The next token of each item from its logits row (``logits`` [B, vocab]), as a device tensor [B]: greedy
        rows by an argmax on the device (nothing waits for it), sampled rows drawn over them (``_draw_sampled``)."""
        tokens = logits.argmax(-1)
        self._draw_sampled(logits, items, tokens)
        return tokens

    def _draw_sampled(self, logits: torch.Tensor, items: list[BatchItem], tokens: torch.Tensor) -> bool:
        """The tokens of the items that sample (temperature above 0) drawn on the host (``_draw``) and written over
        their rows of ``tokens`` (device [B]), their logits read back in one copy and their tokens written back in
        one (not a wait a row each way); whether there were any."""
        drawn = [r for r, it in enumerate(items) if it.request.params.temperature != 0]
        if not drawn:
            return False
        index = upload(torch.tensor(drawn), logits.device)
        rows = logits.index_select(0, index).float().cpu()
        picked = [_draw(row, items[r].request.params, items[r].start + items[r].length) for r, row in zip(drawn, rows)]
        tokens.index_copy_(0, index, upload(torch.tensor(picked, dtype=tokens.dtype), tokens.device))
        return True


def _draw(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """A token drawn from a host float32 logits row at ``params.temperature``, seeded by the request's seed and the
    position: the same token on any device and in any batch. In float64, shifted to a maximum of 0 before the
    division: a tiny temperature (5e-324 is in the API's range, and 0 in float32) sends the rest to -inf, where
    dividing first made the maximum inf and ``inf - inf`` a NaN that failed the engine."""
    probs = torch.exp((logits.double() - logits.max()) / params.temperature)
    probs = probs / probs.sum()
    gen = torch.Generator().manual_seed(params.seed * 1_000_003 + position)
    return int(torch.multinomial(probs, 1, generator=gen))


_STAGED_DIGESTS = 4096  # staged page tables whose checksums the runner remembers
_EARLY_ROWS = 16  # digest rows opened at a time for the work queued before a forward (eight restores)


def _media_rows(item: BatchItem) -> MediaRows | None:
    if not item.media:
        return None
    rows = torch.tensor([offset for offset, _ in item.media])
    return rows, torch.stack([media_features(data) for _, data in item.media])
