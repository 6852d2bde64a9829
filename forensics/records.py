"""Fold a history into one record per request: what was asked, what streamed, how it ended.

A pure function of the events. Protocol breaks (an event for a request never invoked, a second
ending, a token after the end) do not raise: they are kept as ``anomalies`` so that a checker can
report them and the rest of the history still counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forensics.schema import choice_request_id, split_choice

__all__ = ["Fold", "RequestRecord", "TokenDelta", "fold_history"]

ENDINGS = ("ok", "fail", "info")


@dataclass(frozen=True)
class TokenDelta:
    position: int
    text: str
    token_id: int | None
    time: float


@dataclass(frozen=True)
class RequestRecord:
    """One request (one choice of an ``n > 1`` request) folded from its events.

    ``invoke``: the invoke event as written (for a choice > 0: its parent's); ``end``: the ok / fail
    / info event, or None when none arrived (still running, or the run was killed).
    """

    request: str
    parent: str
    choice: int
    invoke: Mapping[str, Any]
    tokens: tuple[TokenDelta, ...] = ()
    end: Mapping[str, Any] | None = None
    faults: tuple[Mapping[str, Any], ...] = ()

    @property
    def outcome(self) -> str | None:
        """"ok" | "fail" | "info", or None when the request never ended in this history."""
        return None if self.end is None else self.end["type"]

    @property
    def arm(self) -> str:
        return self.invoke["arm"]

    @property
    def key(self) -> str:
        return self.invoke["key"]

    @property
    def probe(self) -> Mapping[str, Any] | None:
        return self.invoke.get("probe")

    @property
    def abandoned(self) -> bool:
        return self.outcome == "info" and self.end["reason"] == "abandoned"

    @property
    def text(self) -> str:
        """The completed output, or the deltas received so far."""
        if self.outcome == "ok":
            return self.end["text"]
        return "".join(t.text for t in self.tokens)

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """Output token ids when the target reported them (on ``ok`` or on every delta), else None."""
        if self.outcome == "ok" and self.end.get("token_ids") is not None:
            return tuple(self.end["token_ids"])
        if self.tokens and all(t.token_id is not None for t in self.tokens):
            return tuple(t.token_id for t in self.tokens)
        return None

    @property
    def cached_tokens(self) -> int | None:
        return None if self.end is None else self.end.get("cached_tokens")

    @property
    def logit_checks(self) -> tuple[int, ...] | None:
        """The check of the logits each output token was sampled from, when the target reported them
        (``forensic.logit_checks``: the embedded engine's), else None."""
        checks = ((self.end or {}).get("forensic") or {}).get("logit_checks")
        return None if checks is None else tuple(checks)

    def server_ids(self, sent_prefix: str | None = None) -> tuple[str, ...]:
        """The ids a server may know this choice by, most specific first: the one it echoed for the choice
        (``forensic.request_id``), and for a request's first choice the id its response carried (``server_id``)
        and the ``X-Request-Id`` it was sent with (``<sent_prefix>-<request>``: an HTTP run's meta.target
        ``request_ids``). A later choice shares its request's response and header: only its echo is its own."""
        end = self.end or {}
        ids = [(end.get("forensic") or {}).get("request_id")]
        if self.choice == 0:
            ids += [end.get("server_id"), f"{sent_prefix}-{self.parent}" if sent_prefix else None]
        return tuple(dict.fromkeys(str(i) for i in ids if i is not None))

    @property
    def hit(self) -> bool | None:
        """cached_tokens > 0; None when the target did not report cached_tokens."""
        cached = self.cached_tokens
        return None if cached is None else cached > 0


@dataclass(frozen=True)
class Fold:
    records: Mapping[str, RequestRecord]  # by request id, in invoke order; choices follow their parent
    faults: tuple[Mapping[str, Any], ...] = ()
    anomalies: tuple[str, ...] = ()


@dataclass
class _Draft:
    invoke: Mapping[str, Any]
    tokens: list[TokenDelta] = field(default_factory=list)
    end: Mapping[str, Any] | None = None
    faults: list[Mapping[str, Any]] = field(default_factory=list)


def fold_history(events: Iterable[Mapping[str, Any]]) -> Fold:
    """Per-request records of ``events`` (already validated, in index order)."""
    drafts: dict[str, _Draft] = {}
    faults: list[Mapping[str, Any]] = []
    anomalies: list[str] = []
    for event in events:
        kind, request = event["type"], event["request"]
        if kind == "invoke":
            _open(drafts, event, anomalies)
        elif kind == "fault":
            faults.append(event)
            if request in drafts:
                drafts[request].faults.append(event)
        elif request not in drafts:
            anomalies.append(f"event {event['index']}: {kind} for {request!r}, which was never invoked")
        elif drafts[request].end is not None:
            anomalies.append(f"event {event['index']}: {kind} for {request!r} after it ended "
                             f"({drafts[request].end['type']} at event {drafts[request].end['index']})")
        elif kind == "token":
            drafts[request].tokens.append(TokenDelta(event["position"], event["text"], event.get("token_id"),
                                                     event["time"]))
        else:
            drafts[request].end = event
    records = {rid: _freeze(rid, d) for rid, d in drafts.items()}
    return Fold(records, tuple(faults), tuple(anomalies))


def _open(drafts: dict[str, _Draft], event: Mapping[str, Any], anomalies: list[str]) -> None:
    """Start the drafts of an invoke: one per choice, so a choice that never streamed shows as pending."""
    request = event["request"]
    if request in drafts:
        anomalies.append(f"event {event['index']}: a second invoke of {request!r} (ignored)")
        return
    for choice in range(int(event.get("n") or 1)):
        drafts[choice_request_id(request, choice)] = _Draft(event)


def _freeze(request_id: str, draft: _Draft) -> RequestRecord:
    parent, choice = split_choice(request_id)
    if choice and parent != draft.invoke["request"]:  # a '#' that is part of an invoked id, not a choice
        parent, choice = request_id, 0
    return RequestRecord(request_id, parent, choice, draft.invoke, tuple(draft.tokens), draft.end,
                         tuple(draft.faults))
