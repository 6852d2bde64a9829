"""The embedded engine: submit, step, stream, abort — in virtual time.

``step()`` is one scheduler iteration and reads like the design::

    apply the actions scheduled for this step (submissions, aborts)
    admit queued requests            (match, lock, allocate, restore)
    build the next batch             (prefill chunks and decode steps)
    launch it; process the previous  (overlap) -- or launch and process it (no overlap)
    let the device make progress     (sim: a seeded number of queued ops)

Nothing depends on wall time: a run is a function of the submissions, the steps they arrive at and
the device seed.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.device import make_device
from mini_engine.engine.cache_manager import CacheManager
from mini_engine.engine.config import EngineConfig
from mini_engine.engine.fences import SlotFences
from mini_engine.engine.metadata import ResidentDecodeMetadata
from mini_engine.engine.request import Request, SamplingParams, Status, prefix_digest
from mini_engine.engine.runner import Batch, ModelRunner
from mini_engine.engine.scheduler import Scheduler
from mini_engine.engine.storage import KVStorage, StateStorage
from mini_engine.instrument import Instrumentation, Sink
from mini_engine.model import ByteTokenizer, HybridModel, load_model
from mini_engine.model.media import media_features
from mini_engine.model.state import STATE_CHECKSUM_FORMAT, state_bytes
from mini_engine.model.tokenizer import MEDIA_TOKEN
from mini_engine.ops.checksum import slot_checksum

__all__ = ["Engine", "RequestIdInUse", "RequestResult", "media_digest"]


class RequestIdInUse(ValueError):
    """``submit`` was given the id of a request the engine still holds."""


WARM_UP_KEY = "mini-engine:warm-up"  # the cache key of warm_up's prompts: no request's prompt can match them
WARM_UP_TOKENS = 3  # decode steps per warm-up request: the first of a batch size runs eagerly, the second captures
# the most steps between the ledger's flushes while busy: a flush costs its landing checks and one read-back whatever
# it delivers, and rows only wait (once idle, every row is delivered). Sooner where it is free: in the device's
# shadow, when the host is about to block on a batch still running (``Engine._process``)
LEDGER_FLUSH_STEPS = 8


def media_digest(items: Sequence[bytes]) -> str:
    """A stable digest of media items (length-prefixed, so item boundaries count)."""
    h = hashlib.blake2b(digest_size=8)
    for item in items:
        h.update(len(item).to_bytes(8, "little"))
        h.update(item)
    return h.hexdigest()


@dataclass(frozen=True)
class RequestResult:
    rid: str
    prompt_tokens: int
    output_ids: tuple[int, ...]
    finish_reason: str | None  # "stop" | "length" | "abort" | None (still running)
    cached_tokens: int
    cache_key: str  # digest of (extra key, prompt): what the cache was asked for
    restored_slot: int | None
    text: str  # the output decoded, cut before the first stop string
    media_digest: str | None = None  # digest of the media the request carried (None: no media)
    # digest of the exact logits every output token was sampled from (instrumented engines only): a
    # hit whose state was corrupted differs from its cold run here even when no token changed yet
    logits_digest: str | None = None
    logit_checks: tuple[int, ...] = ()  # the digest's parts, one 63-bit check per output token (instrumented only)


class Engine:
    def __init__(self, config: EngineConfig | None = None, *, model: HybridModel | None = None,
                 sink: Sink | None = None) -> None:
        self.config = config = config or EngineConfig()
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = make_device(config.device, seed=config.device_seed)
        model = model if model is not None else load_model(config.model)
        # a model with more ids than the byte tokenizer (random weights, a real model's vocabulary) can sample ids
        # the tokenizer has no text for: they render as U+FFFD rather than fail the request
        bytes_only = model.config.vocab_size <= ByteTokenizer().vocab_size
        self.tokenizer = ByteTokenizer(unknown="raise" if bytes_only else "replace")
        # The weights live where the forwards run, in the configured dtype; a caller's model elsewhere or in
        # another dtype is copied, never changed.
        dtype = getattr(torch, config.dtype)
        self.model = model if (model.device, model.projection_dtype) == (self.device.torch_device, dtype) else (
            copy.deepcopy(model).to(self.device.torch_device).cast_projections(dtype))
        self.compute = self.device.stream("compute")
        self.events = Instrumentation(sink)
        self.events.emit("checksum_format", state=STATE_CHECKSUM_FORMAT)
        self.states = StateStorage(self.model.config, config.num_slots, self.device,
                                   running=config.decode_path == "triton",
                                   tracked=self.events.enabled and config.state_digests == "tracked")
        self.kv = KVStorage(self.model.config, config.num_pages, config.page_size, self.device)
        self.copy = self.device.stream("copy")
        self.fences = SlotFences(self.device)
        self.cache = CacheManager(config, self.states, self.kv, self.device, self.compute, self.copy, self.fences,
                                  self.events)
        if config.reference_states:
            self.cache.reference_checksum = self.reference_checksum
        self.scheduler = Scheduler(config, self.cache)
        pages_per_seq = -(-config.max_context // config.page_size)
        fenced = "metadata_fence=off" not in config.faults
        self.metadata = ResidentDecodeMetadata(
            self.device, self.copy, (config.max_running, pages_per_seq + pages_per_seq % 2),
            fence=fenced, predecessor=fenced, instrumentation=self.events)
        self.runner = ModelRunner(self.model, self.states, self.kv, self.device, self.compute, self.metadata,
                                  self.fences, instrumentation=self.events,
                                  track_writer="track_writer=off" not in config.faults,
                                  decode_path=config.decode_path, prefill_path=config.prefill_path,
                                  cuda_graphs=config.cuda_graphs,
                                  decode_gemm=config.decode_gemm, decode_gdn=config.decode_gdn,
                                  decode_pdl=config.decode_pdl, decode_gemm_table=config.gemm_table(),
                                  decode_split_sums=config.decode_split_sums, decode_swiglu=config.decode_swiglu)
        self.cache.early_rows = self.runner.early_rows  # a restore's ledger digests land with the next forward's
        self.requests: dict[str, Request] = {}
        self.steps = 0
        self._actions: dict[int, list[Callable[[], None]]] = defaultdict(list)
        self._in_flight: Batch | None = None
        self._flushed = 0  # the step of the ledger's last flush
        self.shadow_flushes, self.shadow_flush_seconds = 0, 0.0  # the ledger's flushes in the device's shadow
        # those of them the batch finished during: up to all of their time was on the step's path
        self.shadow_overruns, self.shadow_overrun_seconds = 0, 0.0
        self._ids = itertools.count()
        # the pools' and the metadata's zero fills ran on the default stream, which the engine's streams do not wait
        # for on a GPU: done before any op of theirs reads them (``Device.zeros``)
        self.device.synchronize()

    # -- the embedded API ----------------------------------------------------------------------
    def submit(self, prompt: list[int] | str, params: SamplingParams | None = None, *, rid: str | None = None,
               extra_key: str = "", at_step: int | None = None, n: int = 1, media: Sequence[bytes] = ()) -> str:
        """Queue a request (now, or when step ``at_step`` begins); returns its id. Raises ValueError on bad input.

        ``n > 1`` asks for n choices: the first computes the prompt, the others fork from its state
        before the last prompt token (sharing its pages, copy-on-write) and sample with seeds
        ``seed + i``; ``choices(rid)`` lists their ids. ``media`` holds one byte string per
        ``<|media|>`` placeholder of the prompt (none: placeholders are ordinary tokens); their
        digest joins the cache key.
        """
        if not 1 <= n <= self.config.max_running:
            raise ValueError(f"n must be in [1, max_running={self.config.max_running}]; got {n}")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        media, digest = self._check_media(ids, media)
        rid = rid or f"req-{next(self._ids)}"
        if rid in self.requests:
            raise RequestIdInUse(f"request id {rid!r} is already in use")
        params = params or SamplingParams()
        if len(ids) + params.max_tokens > self.config.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                             f"context of {self.config.max_context}")
        pages = -(-(len(ids) + params.max_tokens) // self.config.page_size) * n
        if pages > self.config.num_pages:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) x n={n} needs "
                             f"{pages} KV pages but the pool has num_pages={self.config.num_pages}: it could never run")
        arrival = self.steps if at_step is None else at_step
        extra_key = self._cache_extra_key(rid, extra_key, digest)
        # Without media a placeholder id is an ordinary token (as when the model generates it).
        positions = tuple(i for i, t in enumerate(ids) if media and t == self.tokenizer.media_token_id)
        members = [Request(rid if i == 0 else f"{rid}#{i}", ids, replace(params, seed=params.seed + i), extra_key,
                           arrival_step=arrival, media=media, media_digest=digest, media_positions=positions)
                   for i in range(n)]
        request, request.children = members[0], members[1:]
        request.fork_at = len(ids) - 1 if n > 1 else None
        for member in (request, *request.children):
            self.requests[member.rid] = member
        self._at(at_step, lambda: self.scheduler.waiting.append(request))
        return rid

    def _check_media(self, ids: list[int], media: Sequence[bytes]) -> tuple[tuple[bytes, ...], str | None]:
        items = tuple(media)
        for i, item in enumerate(items):
            if not isinstance(item, (bytes, bytearray)):
                raise ValueError(f"media[{i}] must be bytes; got {type(item).__name__}")
            if len(item) > self.config.max_media_bytes:
                raise ValueError(f"media[{i}] holds {len(item)} bytes; at most max_media_bytes="
                                 f"{self.config.max_media_bytes} are allowed")
        placeholders = ids.count(self.tokenizer.media_token_id)
        if items and placeholders != len(items):
            raise ValueError(f"the prompt has {placeholders} {MEDIA_TOKEN} placeholder(s) but {len(items)} "
                             "media item(s) were given; put one placeholder where each item goes")
        return tuple(bytes(i) for i in items), (media_digest(items) if items else None)

    def _cache_extra_key(self, rid: str, extra_key: str, digest: str | None) -> str:
        """The extra part of the cache key: the caller's plus the media digest (unless ``media_key=off``)."""
        if digest is None:
            return extra_key
        if "media_key=off" in self.config.faults:
            self.events.emit("fault", name="media_key=off", site="submit", rid=rid, media_digest=digest)
            return extra_key
        return f"{extra_key}|media:{digest}"

    def choices(self, rid: str) -> list[str]:
        """The ids of every choice of the request submitted as ``rid`` (just ``[rid]`` when n == 1)."""
        return [rid, *sorted(r for r in self.requests if r.startswith(f"{rid}#"))]

    def abort(self, rid: str, *, at_step: int | None = None) -> None:
        """Abort a request at any phase (queued, mid-prefill, mid-decode): frees all it holds."""
        if rid not in self.requests:
            raise KeyError(f"unknown request id {rid!r}")
        self._at(at_step, lambda: self._abort_now(self.requests[rid]))

    def step(self) -> None:
        self.events.step = self.steps
        for action in self._actions.pop(self.steps, []):
            action()
        self.scheduler.admit()
        items = self.scheduler.plan()
        launched = self.runner.launch(items) if items else None
        previous = launched
        if self.config.overlap:
            previous, self._in_flight = self._in_flight, launched
        if previous is not None:
            self._process(previous)
        self.device.progress()
        self.steps += 1
        # ledger rows whose device checksums have landed, at least every few steps; all of them once nothing is in
        # flight
        idle = self.idle()
        if idle or self.steps - self._flushed >= LEDGER_FLUSH_STEPS:
            self._flush(wait=idle)
        if self.config.debug:
            self.check_integrity()

    def run(self, max_steps: int = 100_000) -> None:
        """Step until every request is done and nothing is scheduled or in flight."""
        for _ in range(max_steps):
            if self.idle():
                self.check_integrity()  # cheap when idle, and the moment a leak would show
                self._flush(wait=True)
                return
            self.step()
        raise RuntimeError(f"engine still busy after {max_steps} steps")

    def idle(self) -> bool:
        return (not self._actions and not self.scheduler.waiting and not self.scheduler.running
                and self._in_flight is None)

    def warm_up(self, *, seed: int = 0) -> dict:
        """Serve synthetic requests at every batch size from 1 to ``max_running``, then forget them: what a
        server's first requests would otherwise pay. On cuda the first run of each kernel compiles it (seconds
        each on a machine with an empty Triton cache) and each decode batch size captures its CUDA graph on its
        second step. Prompts of 65 tokens cross a 64-boundary (snapshots, donation); three tokens each. Their
        prefixes are cached under a key of their own, so no request can hit them, and eviction reclaims them
        like any other. Needs an idle engine; returns the requests, steps and seconds it took and the CUDA
        graphs the engine holds."""
        if not self.idle():
            raise RuntimeError("warm_up needs an idle engine (nothing queued, running or in flight)")
        started, first_step = time.perf_counter(), self.steps
        rng = random.Random(seed)
        tokens = min(256, self.model.config.vocab_size)  # byte ids, within any model's vocabulary
        length = min(SNAPSHOT_ALIGN + 1, self.config.max_context - WARM_UP_TOKENS)
        rids = []
        for batch in range(1, self.config.max_running + 1):
            rids += [self.submit([rng.randrange(tokens) for _ in range(length)], SamplingParams(max_tokens=WARM_UP_TOKENS),
                                 extra_key=WARM_UP_KEY) for _ in range(batch)]
            self.run()
        for rid in rids:
            self.forget(rid)
        graphs = self.runner.graphs
        return {"requests": len(rids), "steps": self.steps - first_step, "seconds": time.perf_counter() - started,
                "cuda_graphs": 0 if graphs is None else len(graphs.sizes())}

    def tokens(self, rid: str, start: int = 0) -> list[int]:
        """Tokens streamed so far for ``rid`` (from index ``start`` on)."""
        return self.requests[rid].outputs[start:]

    def poll(self, rid: str) -> tuple[int, str | None]:
        """How many tokens ``rid`` has streamed and its finish reason (None while running). Cheap."""
        request = self.requests[rid]
        return len(request.outputs), request.finish_reason

    def forget(self, rid: str) -> None:
        """Drop a finished or aborted request (and its choices) from memory; a long-running server calls this."""
        ids = self.choices(rid)
        if not all(self.requests[i].done for i in ids):
            raise ValueError(f"request {rid!r} is still running; abort it or let it finish before forgetting it")
        for i in ids:
            del self.requests[i]

    def result(self, rid: str) -> RequestResult:
        r = self.requests[rid]
        key = prefix_digest(r.extra_key, r.prompt)
        logits = None
        if self.events.enabled:
            checks = b"".join(c.to_bytes(8, "little") for c in r.logit_checks)
            logits = hashlib.blake2b(checks, digest_size=8).hexdigest()
        return RequestResult(rid, len(r.prompt), tuple(r.outputs), r.finish_reason, r.cached_len, key,
                             r.restore_slot, self._text(r)[0], r.media_digest, logits,
                             tuple(r.logit_checks) if self.events.enabled else ())

    def check_integrity(self) -> None:
        self.cache.check_integrity()

    def reference_checksum(self, tokens: Sequence[int], media: Sequence[bytes] = ()) -> int:
        """Checksum of the linear state ``tokens`` should leave, computed cold and alone on the model
        (the forensic reference for a donated prefix: same bytes as a correct snapshot slot).
        ``media`` holds the items of the placeholders inside ``tokens``, in order."""
        ids = torch.tensor(list(tokens))
        rows = None
        if media:
            positions = (ids == self.tokenizer.media_token_id).nonzero().flatten()
            rows = (positions, torch.stack([media_features(m) for m in media[: len(positions)]]))
        state = self.model([ids], [self.model.new_state()], media=[rows], kernels=self.config.prefill_path)[0].state
        return slot_checksum(state_bytes(state.conv, state.rec, state.pending))

    # -- internals ---------------------------------------------------------------------------
    def _at(self, step: int | None, action: Callable[[], None]) -> None:
        if step is None or step <= self.steps:
            action()
        else:
            self._actions[step].append(action)

    def _flush(self, *, wait: bool = False, until: Callable[[], bool] | None = None) -> bool:
        """``events.flush``; whether it went to the end (one cut short leaves the next periodic flush where it was)."""
        went = self.events.flush(wait=wait, until=until)
        if went:
            self._flushed = self.steps
        return went

    def _process(self, batch: Batch) -> None:
        if self.events.queued and not self.device.is_complete(batch.done):
            # the host is about to block on the device: the ledger's rows that have landed are delivered in its
            # shadow, where their host time costs the run nothing (``shadow_flush_seconds``), a few at a time until
            # the batch has finished (then the host would be making the device wait: the rest go later)
            started = time.perf_counter()
            went = self._flush(until=lambda: self.device.is_complete(batch.done))
            seconds = time.perf_counter() - started
            self.shadow_flushes += 1
            self.shadow_flush_seconds += seconds
            # the device finished first (a flush cut short has just seen it): the host may have made it wait
            if not went or self.device.is_complete(batch.done):
                self.shadow_overruns += 1
                self.shadow_overrun_seconds += seconds
        sampled = self.runner.results(batch)
        for item, (token, check) in zip(batch.items, sampled):
            request = item.request
            request.in_flight -= 1
            if request.done:
                continue  # finished or aborted while this batch was in flight: its work is discarded
            if item.track is not None:
                self.cache.commit(request, item.track)
            if item.sample:
                request.logit_checks.append(check)
                self._accept(request, token)

    def _text(self, request: Request) -> tuple[str, bool]:
        """The decoded output cut before the first stop string, and whether one was found."""
        text = self.tokenizer.decode(request.outputs, skip_special=True)
        cuts = [text.index(s) for s in request.params.stop if s in text]
        return (text[: min(cuts)], True) if cuts else (text, False)

    def _abort_unforked_sibling(self, parent: Request, child: Request) -> None:
        """A sibling that has not forked yet holds what admission gave it, but is in no queue."""
        parent.children.remove(child)
        self.cache.release(child)
        child.status, child.finish_reason = Status.ABORTED, "abort"
        self.events.emit("abort", rid=child.rid, phase="queued")

    def _accept(self, request: Request, token: int) -> None:
        request.outputs.append(token)
        if token in request.params.stop_token_ids or (request.params.stop and self._text(request)[1]):
            self._finish(request, "stop")
        elif len(request.outputs) >= request.params.max_tokens:
            self._finish(request, "length")

    def _finish(self, request: Request, reason: str) -> None:
        request.status, request.finish_reason = Status.FINISHED, reason
        self.cache.finish(request)
        self.scheduler.retire(request)

    def _abort_now(self, request: Request) -> None:
        if request.done:
            return
        parent = self.requests.get(request.rid.split("#")[0])
        if parent is not request and parent is not None and request in parent.children:
            self._abort_unforked_sibling(parent, request)
            return
        phase = "queued" if request.status is Status.QUEUED else (
            "prefill" if request.scheduled_len < len(request.prompt) else "decode")
        if request in self.scheduler.waiting:
            self.scheduler.waiting.remove(request)
        elif request.status is Status.RUNNING:
            self.cache.release(request)
            self.scheduler.retire(request)
        for child in request.children:  # never forked: they cannot start without the parent's state
            self.cache.release(child)
            child.status, child.finish_reason = Status.ABORTED, "abort"
        request.children = []
        request.status, request.finish_reason = Status.ABORTED, "abort"
        self.events.emit("abort", rid=request.rid, phase=phase)
