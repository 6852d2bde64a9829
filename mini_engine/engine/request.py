"""A request and its sampling parameters, validated on construction; its cache bookkeeping."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from enum import Enum

from mini_engine.cache.radix import RadixNode

__all__ = ["Commit", "Request", "SamplingParams", "Status", "prefix_digest"]


def prefix_digest(extra_key: str, tokens: list[int]) -> str:
    """What the cache is keyed by for a prefix: a digest of (extra key, tokens). The result's
    ``cache_key`` is this digest of the whole prompt; ledger rows name prefixes by it."""
    return hashlib.blake2b(repr((extra_key, list(tokens))).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    seed: int = 0  # seeded sampling: token i of a request is drawn with a generator seeded (seed, position)
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings: generation ends once the text contains one (it is cut off)

    def __post_init__(self) -> None:
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings; got {self.stop!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {self.max_tokens}")
        if not 0 <= self.temperature < math.inf:  # (NaN fails it too)
            raise ValueError(f"temperature must be finite and >= 0; got {self.temperature}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32); got {self.seed}")


class Status(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Commit:
    """A track snapshot written by a forward: the state at ``position`` (a 64-multiple) in ``slot``."""

    position: int
    slot: int


@dataclass(eq=False)
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    extra_key: str = ""  # the cache key's extra part (media digest, model id): what the tree is asked with
    arrival_step: int = 0
    media: tuple[bytes, ...] = ()  # one item per media placeholder of the prompt, in order
    media_digest: str | None = None
    status: Status = Status.QUEUED
    outputs: list[int] = field(default_factory=list)
    logit_checks: list[int] = field(default_factory=list)  # per output token (runner.results)
    finish_reason: str | None = None
    # cache bookkeeping (host side)
    match_node: RadixNode | None = None
    cached_len: int = 0
    restore_slot: int | None = None
    restore_pending: bool = False  # admitted on a hit; the restore is queued with the first forward
    live_slot: int = 0
    pingpong: list[int] = field(default_factory=list)
    next_pingpong: int = 0
    pages: list[int] = field(default_factory=list)
    scheduled_len: int = 0  # tokens whose forward has been *built* (ahead of results under overlap)
    scheduled_samples: int = 0
    last_commit: Commit | None = None
    in_flight: int = 0  # batches built but not yet processed that include this request
    # n > 1: the first choice computes the prompt; its siblings fork from its state at ``fork_at``
    children: list[Request] = field(default_factory=list)
    fork_at: int | None = None

    media_positions: tuple[int, ...] = ()  # prompt positions of the media placeholders

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"request {self.rid!r}: the prompt must hold at least one token")
        if len(self.media_positions) != len(self.media):
            raise ValueError(f"request {self.rid!r}: the prompt has {len(self.media_positions)} media "
                             f"placeholder(s) but {len(self.media)} media item(s) were given")

    def media_in(self, start: int, end: int) -> tuple[tuple[int, bytes], ...]:
        """``(offset from start, item)`` for every media placeholder at prompt positions [start, end)."""
        return tuple((p - start, item) for p, item in zip(self.media_positions, self.media) if start <= p < end)

    @property
    def done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    @property
    def total_len(self) -> int:
        """Prompt plus the tokens generated so far."""
        return len(self.prompt) + len(self.outputs)

    def tokens(self) -> list[int]:
        return self.prompt + self.outputs
