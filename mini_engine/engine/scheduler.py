"""Continuous batching: admit queued requests, then plan one forward over every running request.

A running request contributes either its next prefill chunk (aligned to absolute 64-token
boundaries, at most ``prefill_chunk`` tokens) or one decode step that feeds the token its previous
forward sampled (read on the device, so a batch can be built before the previous one's results are
known: overlap scheduling). Plain Python: no tensors but the prompt slices handed to the runner.
"""

from __future__ import annotations

from collections import deque

import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.engine.cache_manager import CacheManager
from mini_engine.engine.config import EngineConfig
from mini_engine.engine.request import Request, Status
from mini_engine.engine.runner import BatchItem

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, config: EngineConfig, cache: CacheManager) -> None:
        self.config, self.cache = config, cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def admit(self) -> list[Request]:
        """Move queued requests to running while slots, pages and ``max_running`` allow (FIFO)."""
        admitted = []
        # Unforked siblings join ``running`` at their fork: count them from admission on, or n > 1
        # requests would push the batch past max_running (and the decode metadata's rows).
        while self.waiting and self._seats() + 1 + len(self.waiting[0].children) <= self.config.max_running:
            if not self.cache.try_admit(self.waiting[0]):
                break
            request = self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            admitted.append(request)
        return admitted

    def _seats(self) -> int:
        return sum(1 + len(r.children) for r in self.running)

    def plan(self) -> list[BatchItem]:
        """One forward's items; advances each request's *scheduled* position (results come later)."""
        items = []
        for request in list(self.running):
            if request.children and request.scheduled_len == request.fork_at:
                for child in self.cache.fork(request):  # queued now: after the parent's last forward
                    child.status = Status.RUNNING
                    self.running.append(child)
        for request in self.running:
            item = self._next_item(request)
            if item is not None:
                items.append(item)
        return items

    def _next_item(self, request: Request) -> BatchItem | None:
        start, prompt_len = request.scheduled_len, len(request.prompt)
        if start < prompt_len:
            end = min(prompt_len, start // SNAPSHOT_ALIGN * SNAPSHOT_ALIGN + self.config.prefill_chunk)
            if request.children and start < request.fork_at:
                end = min(end, request.fork_at)  # stop where the siblings fork off
            tokens, sample = torch.tensor(request.prompt[start:end]), end == prompt_len
        elif 0 < request.scheduled_samples < request.params.max_tokens:
            end, tokens, sample = start + 1, None, True
        else:
            return None
        self.cache.restore_before_forward(request)
        self.cache.copy_on_write(request, start, end)
        track = self.cache.track_target(request, start, end - start, prefill=tokens is not None)
        if track is not None:
            self.cache.events.emit("snapshot_track", rid=request.rid, slot=track.slot, position=track.position)
        request.scheduled_len = end
        request.scheduled_samples += int(sample)
        request.in_flight += 1
        media = request.media_in(start, end) if tokens is not None else ()
        return BatchItem(request, start, end - start, tokens, request.live_slot, tuple(request.pages), sample, track,
                         media)

    def retire(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
