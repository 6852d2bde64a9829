"""An operation: one request a pattern asks for, when it arrives, and how the client treats it.

``at`` is an arrival time in abstract ticks: the embedded target maps a tick to an engine step, the
HTTP target to a delay (or to "wait for the previous op"). ``abandon_after`` = k: the client closes
the stream after k tokens. ``arm``: ``hammer`` (sent under load, cache on) or ``control-cold``
(the same request run cold and alone, cache off: the reference the hammered one must equal).

``key`` names what was asked (payload + sampling): a hammered op and its control share it;
``payload`` names what the cache key should cover (the prompt as the engine sees it + the media).

``continues`` = r: the op is the next turn of request r's conversation, and its prompt or messages
are only what it adds. The interpreter sends it once r has completed, as ``op.continued(r, reply)``:
r's prompt, the reply r actually got, then the op's own part (``continued_from`` = r says so in the
history). A reply is text, so the continuation is token-exact only where the reply is valid text:
patterns that continue replies stop them at U+FFFD (``stop``), the first undecodable byte.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from forensics.schema import media_digest
from probes import Message, Probe, count_tokens, render_chat

__all__ = ["ARMS", "CONTROL_ARM", "HAMMER_ARM", "Op", "op_id", "with_controls"]

HAMMER_ARM, CONTROL_ARM = "hammer", "control-cold"
ARMS = (HAMMER_ARM, CONTROL_ARM)


def _digest(value: object) -> str:
    return hashlib.blake2b(json.dumps(value, sort_keys=True).encode("utf-8"), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Op:
    request: str
    pattern: str
    arm: str = HAMMER_ARM
    at: int = 0
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    media: tuple[bytes, ...] = ()
    max_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    n: int = 1
    abandon_after: int | None = None
    probe: Probe | None = None
    group: str | None = None
    stop: tuple[str, ...] = ()  # stop strings (OpenAI ``stop``): the reply ends before the first one
    continues: str | None = None  # the request whose reply this op follows (sent once it completed)
    continued_from: str | None = None  # set on the op as sent: the request it continued

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"op {self.request!r}: set exactly one of prompt or messages")
        if "#" in self.request:
            raise ValueError(f"op {self.request!r}: request ids may not contain '#' (it marks n > 1 choices)")
        if self.arm not in ARMS:
            raise ValueError(f"op {self.request!r}: arm must be one of {ARMS}; got {self.arm!r}")
        if self.at < 0 or self.max_tokens < 1 or self.n < 1 or self.temperature < 0:
            raise ValueError(f"op {self.request!r}: need at >= 0, max_tokens >= 1, n >= 1, temperature >= 0; got "
                             f"at={self.at}, max_tokens={self.max_tokens}, n={self.n}, temperature={self.temperature}")
        if self.abandon_after is not None and not 1 <= self.abandon_after < self.max_tokens:
            raise ValueError(f"op {self.request!r}: abandon_after must be in [1, max_tokens={self.max_tokens}) so "
                             f"that the stream is really cut; got {self.abandon_after}")
        if self.arm == CONTROL_ARM and self.abandon_after is not None:
            raise ValueError(f"op {self.request!r}: a control runs to completion; abandon_after must be None")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"op {self.request!r}: stop strings must be non-empty strings; got {self.stop!r}")
        if self.continues is not None and self.continued_from is not None:
            raise ValueError(f"op {self.request!r}: an op either still continues a request or was continued "
                             "from one, not both")

    @classmethod
    def from_probe(cls, probe: Probe, *, request: str, pattern: str, **fields: Any) -> Op:
        """The op that asks ``probe`` (its prompt or messages, media, max_tokens and group)."""
        asked = {"prompt": probe.prompt, "messages": probe.messages, "media": probe.media,
                 "max_tokens": probe.max_tokens, "group": probe.group}
        return cls(request=request, pattern=pattern, probe=probe, **{**asked, **fields})

    @cached_property
    def text(self) -> str:
        """The prompt as the engine sees it (chat rendered with the ChatML template)."""
        return self.prompt if self.prompt is not None else render_chat(self.messages)

    @property
    def prompt_tokens(self) -> int:
        """Prompt length under the byte-level tokenizer rule (template included for chat)."""
        return count_tokens(self.text)

    @property
    def media_digest(self) -> str | None:
        return media_digest(self.media)

    @cached_property
    def payload(self) -> str:
        return _digest([self.text, self.media_digest])

    @cached_property
    def key(self) -> str:
        asked = [self.payload, self.max_tokens, self.temperature, self.seed, self.n]
        if self.stop:
            asked.append(list(self.stop))
        if self.continues is not None:  # the reply it will follow is not known yet: only the turn's own part
            asked.append({"continues": self.continues})
        return _digest(asked)

    def control(self, request: str, at: int) -> Op:
        """The cold reference of this op: same request, run to completion, alone, cache off."""
        return replace(self, request=request, arm=CONTROL_ARM, at=at, abandon_after=None)

    def continued(self, base: Op, reply: str) -> Op:
        """This op as sent after ``base`` got ``reply``: base's conversation, the reply, then this op's part.

        Chat: base's messages, the reply as an assistant message, then this op's messages (rendered,
        that is ``base.text + reply + "<|im_end|>\n" + render_chat(own messages)``). Completion:
        ``base.text + reply + prompt``. Media: base's, then this op's.
        """
        if (self.messages is None) != (base.messages is None):
            raise ValueError(f"op {self.request!r} and {base.request!r}, which it continues, must both be chat "
                             "or both be completion requests")
        if self.messages is not None:
            text = {"messages": (*base.messages, Message("assistant", reply), *self.messages)}
        else:
            text = {"prompt": base.text + reply + self.prompt}
        return replace(self, **text, media=(*base.media, *self.media), continues=None, continued_from=base.request)

    def invoke_fields(self, *, byte_tokens: bool = True) -> dict[str, Any]:
        """The fields of this op's ``invoke`` event (``HistoryWriter.invoke(op.request, **fields)``).

        ``byte_tokens``: record ``prompt_tokens`` by the byte rule; leave it False for a target whose
        tokenizer is different, or the echo oracle would compare against the wrong count.
        """
        fields = {"arm": self.arm, "key": self.key, "pattern": self.pattern, "group": self.group, "at": self.at,
                  "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": self.temperature,
                  "seed": self.seed, "n": self.n, "abandon_after": self.abandon_after, "payload": self.payload,
                  "media_digest": self.media_digest,
                  "messages": None if self.messages is None else [m.as_dict() for m in self.messages],
                  "media": [base64.b64encode(m).decode("ascii") for m in self.media] or None,
                  "probe": None if self.probe is None else self.probe.summary(),
                  "prompt_tokens": self.prompt_tokens if byte_tokens and self.continues is None else None,
                  "stop": list(self.stop) or None, "continues": self.continues, "continued_from": self.continued_from}
        return {name: value for name, value in fields.items() if value is not None}

    def as_record(self) -> dict[str, Any]:
        """This op as JSON (its invoke fields and id); ``from_invoke`` reads it back."""
        return {"request": self.request, **self.invoke_fields()}

    @classmethod
    def from_invoke(cls, event: Mapping[str, Any]) -> Op:
        """Rebuild the op a history's invoke event recorded (for replay)."""
        messages = event.get("messages")
        fields = {"prompt": event.get("prompt"), "media": tuple(base64.b64decode(m) for m in event.get("media", ())),
                  "messages": None if messages is None else tuple(Message(**m) for m in messages)}
        probe = event.get("probe")
        if probe is not None:
            probe = Probe(**probe, **fields)
        return cls(request=event["request"], pattern=event.get("pattern", ""), arm=event["arm"], at=event.get("at", 0),
                   max_tokens=event.get("max_tokens", 16), temperature=event.get("temperature", 0.0),
                   seed=event.get("seed", 0), n=event.get("n", 1), abandon_after=event.get("abandon_after"),
                   group=event.get("group"), probe=probe, stop=tuple(event.get("stop", ())),
                   continues=event.get("continues"), continued_from=event.get("continued_from"), **fields)


def with_controls(ops: Iterable[Op], prefix: str) -> tuple[Op, ...]:
    """The hammer ops in arrival order, then one control per distinct key, in first-asked order.

    Controls arrive after every hammer op (``at`` only orders them: a target runs each alone).
    Their ids are ``<prefix>-c000``, ``<prefix>-c001``, ...
    """
    hammer = sorted(ops, key=lambda op: op.at)  # stable: equal ticks keep the pattern's order
    last = hammer[-1].at if hammer else -1
    firsts: dict[str, Op] = {}
    for op in hammer:
        firsts.setdefault(op.key, op)
    controls = [op.control(f"{prefix}-c{j:03d}", last + 1 + j) for j, op in enumerate(firsts.values())]
    return (*hammer, *controls)


def op_id(pattern: str, seed: int, index: int) -> str:
    """``<pattern>-<seed>-<index>``: the id of a pattern's index-th hammer op."""
    return f"{pattern}-{seed}-{index:04d}"
