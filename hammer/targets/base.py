"""What a target is: somewhere ops are sent, and what comes back, in the interpreter's terms.

Two kinds of target, one vocabulary. A *stepped* target (the embedded engine, virtual time) is
driven by the interpreter one engine step at a time: ``lane.submit`` / ``lane.step`` /
``lane.observe`` / ``lane.abort``. A *streaming* target (HTTP) streams one request per call
(``async for update in target.stream(op)``); the interpreter decides when requests start and
closes a stream to abandon it. Either way a request reports the same updates:

    Delta          one streamed token (or text delta) of one choice
    Completion     one choice ended normally: its text, token ids, cached tokens, forensic fields
    Failure        the whole request definitely did not happen (refused, HTTP 4xx, unreachable)
    Indeterminate  the request's fate is unknown (a timeout, a broken stream)

Targets never write the history and never run concurrency of their own: the interpreter does both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from hammer.patterns import Op

__all__ = ["Completion", "Delta", "Failure", "Indeterminate", "Lane", "SteppedTarget", "StreamingTarget",
           "Target", "TargetUnavailable", "Update"]


@dataclass(frozen=True)
class Delta:
    choice: int
    text: str
    token_id: int | None = None


@dataclass(frozen=True)
class Completion:
    """``forensic``: the engine's own account (cache_key, media_digest, prompt_tokens, restored_slot, ...);
    ``server_id``: the id the server gave the request (an OpenAI response's ``id``)."""

    choice: int
    text: str
    token_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    cached_tokens: int | None = None
    usage: Mapping[str, Any] | None = None
    forensic: Mapping[str, Any] | None = None
    server_id: str | None = None


@dataclass(frozen=True)
class Failure:
    error: str
    status: int | None = None


@dataclass(frozen=True)
class Indeterminate:
    reason: str  # "timeout" | "unknown" (schema.INFO_REASONS)
    error: str


Update = Union[Delta, Completion, Failure, Indeterminate]


class TargetUnavailable(RuntimeError):
    """The target cannot be reached (a harness error: the run stops, exit code 2)."""


class Target(ABC):
    """Common to every target: how it is described in ``meta.json`` and what its controls mean."""

    kind: str = "target"
    byte_tokens: bool = True  # its tokenizer is the byte rule: invoke events may record prompt_tokens

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """``meta.target``: the kind plus whatever identifies this target (URL, model, ...)."""

    def engine(self) -> dict[str, Any]:
        """``meta.engine``: the engine configuration, where the target knows it."""
        return {}

    @property
    def faults(self) -> tuple[str, ...]:
        return ()

    @property
    def controls(self) -> str:
        """How this target runs the control arm (recorded in meta: it says what a control proves)."""
        return "cold and alone: cache off, one at a time"

    def check(self) -> None:
        """Raise TargetUnavailable if the target cannot serve (called before a run starts)."""

    def attach(self, run_dir: Any) -> None:
        """The run directory this target writes its own evidence into (the embedded ledger)."""

    def begin_round(self, index: int) -> None:
        """A soak round starts (the embedded target builds fresh engines, seeded for the round)."""

    def close(self) -> None:
        """Release what the target holds (files, engines, connections)."""


class Lane(ABC):
    """One engine of a stepped target, driven step by step (its ledger rows are the target's business)."""

    def __init__(self) -> None:
        self._faults: list[dict[str, Any]] = []

    @abstractmethod
    def submit(self, op: Op) -> Failure | None:
        """Queue ``op`` now; a Failure if the engine refuses it."""

    @abstractmethod
    def step(self) -> None:
        """One engine step."""

    @abstractmethod
    def observe(self, request: str) -> list[Update]:
        """What ``request`` produced since the last call: new deltas, then completions."""

    @abstractmethod
    def abort(self, request: str) -> None:
        """The client is gone: abort ``request`` now."""

    @abstractmethod
    def busy(self) -> bool:
        """Work is queued, running or in flight."""

    def drain_faults(self) -> list[dict[str, Any]]:
        """The engine's fault events since the last call (raw dicts with ``step``, ``name``, ``site``, ...)."""
        drained, self._faults = self._faults, []
        return drained


class SteppedTarget(Target):
    @abstractmethod
    def lane(self, arm: str) -> Lane:
        """The engine that runs ``arm`` ("hammer" or "control-cold")."""


class StreamingTarget(Target):
    @abstractmethod
    def stream(self, op: Op) -> AsyncIterator[Update]:
        """Send ``op`` and yield its updates; closing the iterator early disconnects (abandons) it."""

    async def aclose(self) -> None:
        """Release connections (called on the interpreter's event loop)."""
