"""The run-directory schema (version ``SCHEMA_VERSION``): what a history event may hold.

A run directory is evidence (DESIGN.md §5): ``hammer`` writes it, ``forensics``, ``probes`` and
``reports`` read it. Events follow Jepsen's history (jepsen-io/history): a request is *invoked*,
streams *tokens*, and ends ``ok`` (completed), ``fail`` (definitely did not happen) or ``info``
(indeterminate: abandoned on purpose, or an unknown outcome such as a timeout). Engine faults are
events of their own type. Every event carries ``type``, ``index`` (0, 1, 2, ... across the whole
file, continuing on resume), ``time`` (seconds since the run started) and ``request``.

Fields beyond the required ones are optional; a field the schema does not know is refused, so a
typo never silently lands in the evidence. Free-form data goes under ``extra``.

Choices of an ``n > 1`` request: the target writes one ``invoke`` for the request; the events of
choice ``i > 0`` carry the request id ``choice_request_id(request, i)`` (``"<request>#<i>"``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "COMMON_FIELDS", "EVENT_FIELDS", "EVENT_TYPES", "INFO_REASONS", "SCHEMA_VERSION",
    "SchemaError", "choice_request_id", "media_digest", "split_choice", "validate_event",
]

SCHEMA_VERSION = 1

EVENT_TYPES = ("invoke", "token", "ok", "fail", "info", "fault")

# On every event. ``request`` is None only on a fault that no single request owns.
COMMON_FIELDS = ("type", "index", "time", "request")
# Optional on every event: the engine step (embedded target) and free-form data.
SHARED_OPTIONAL = ("step", "extra")

# type -> (required fields besides COMMON_FIELDS, optional fields)
EVENT_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # The op as sent; ``key`` names what was asked (payload + sampling): a hit and its control share it.
    "invoke": (("arm", "key"),
               ("pattern", "group", "at", "prompt", "messages", "media", "media_digest", "payload",
                "prompt_tokens", "max_tokens", "temperature", "seed", "n", "abandon_after", "probe",
                # stop strings; ``continues``: an unsent next turn of that request's conversation;
                # ``continued_from``: the request whose prompt and actual reply this prompt begins with.
                "stop", "continues", "continued_from")),
    # ``position``: 0-based position of the delta in the output; ``token_id`` when the target knows it.
    "token": (("position", "text"), ("token_id",)),
    # ``server_id``: the id the server gave the request (an HTTP response's ``id``).
    "ok": (("text",),
           ("token_ids", "finish_reason", "cached_tokens", "usage", "forensic", "latency", "ttft", "server_id")),
    "fail": (("error",), ("status", "latency")),
    # ``reason``: one of INFO_REASONS; ``tokens_received``: how many deltas arrived before the end.
    "info": (("reason",), ("tokens_received", "error", "cached_tokens", "latency")),
    # An engine fault event: which fault (``name``), where it acted (``site``), the ids involved.
    "fault": (("name",), ("site", "details")),
}

INFO_REASONS = ("abandoned", "timeout", "unknown")


class SchemaError(ValueError):
    """An event or a meta file that does not follow the schema; the message names the field."""


def validate_event(event: Mapping[str, Any]) -> None:
    """Raise SchemaError unless ``event`` is a well-formed event of this schema version."""
    kind = event.get("type")
    if kind not in EVENT_FIELDS:
        raise SchemaError(f"event type must be one of {EVENT_TYPES}; got {kind!r}")
    required, optional = EVENT_FIELDS[kind]
    missing = [f for f in (*COMMON_FIELDS, *required) if f not in event]
    if missing:
        raise SchemaError(f"{kind} event is missing field(s) {missing}")
    unknown = sorted(set(event) - {*COMMON_FIELDS, *required, *optional, *SHARED_OPTIONAL})
    if unknown:
        raise SchemaError(f"{kind} event has unknown field(s) {unknown}; put free-form data under 'extra'")
    _check_common(event)
    if kind == "info" and event["reason"] not in INFO_REASONS:
        raise SchemaError(f"info.reason must be one of {INFO_REASONS}; got {event['reason']!r}")
    if kind == "token" and (not isinstance(event["position"], int) or event["position"] < 0):
        raise SchemaError(f"token.position must be an int >= 0; got {event['position']!r}")


def _check_common(event: Mapping[str, Any]) -> None:
    index, time, request = event["index"], event["time"], event["request"]
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise SchemaError(f"index must be an int >= 0; got {index!r}")
    if not isinstance(time, (int, float)) or isinstance(time, bool) or not math.isfinite(time) or time < 0:
        raise SchemaError(f"time must be a finite number of seconds >= 0; got {time!r}")
    if request is None and event["type"] != "fault":
        raise SchemaError(f"{event['type']} event needs a request id; only fault events may have none")
    if request is not None and not isinstance(request, str):
        raise SchemaError(f"request must be a string id; got {request!r}")


def choice_request_id(request: str, choice: int) -> str:
    """The request id the events of choice ``choice`` carry (choice 0 is the request itself)."""
    return request if choice == 0 else f"{request}#{choice}"


def split_choice(request_id: str) -> tuple[str, int]:
    """Inverse of ``choice_request_id``: ``"r#2"`` -> ``("r", 2)``, ``"r"`` -> ``("r", 0)``."""
    parent, sep, choice = request_id.rpartition("#")
    if sep and choice.isdigit():
        return parent, int(choice)
    return request_id, 0


def media_digest(items: Sequence[bytes]) -> str | None:
    """The schema's media digest: blake2b-64 over each item as (8-byte little-endian length, bytes).

    None when there is no media. Engines that echo a ``media_digest`` forensic field use this
    definition (mini_engine does), so the harness can check it against what it sent.
    """
    if not items:
        return None
    h = hashlib.blake2b(digest_size=8)
    for item in items:
        h.update(len(item).to_bytes(8, "little"))
        h.update(item)
    return h.hexdigest()
