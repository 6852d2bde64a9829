"""A probe: a question whose right answer is known, so a wrong answer on a cache hit is visible."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probes.extract import EXTRACTORS, extract
from probes.text import MEDIA_MARKER, Message, render_chat

__all__ = ["Probe"]


@dataclass(frozen=True)
class Probe:
    """Exactly one of ``prompt`` (completion) or ``messages`` (chat) is set.

    ``group``: probes of one group share a long prefix (the preamble, the haystack, the earlier
    turns); ``media``: one item per ``<|media|>`` marker in the text, in order; ``extract``: the
    name of the extractor (``probes.extract.EXTRACTORS``) that turns an output into an answer.
    """

    id: str
    family: str
    expected: str
    extract: str
    group: str
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    media: tuple[bytes, ...] = ()
    max_tokens: int = 16

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"probe {self.id!r}: set exactly one of prompt or messages")
        if self.extract not in EXTRACTORS:
            raise ValueError(f"probe {self.id!r}: extract must be one of {list(EXTRACTORS)}; got {self.extract!r}")
        if not self.expected:
            raise ValueError(f"probe {self.id!r}: expected must be a non-empty answer")
        if self.max_tokens < 1:
            raise ValueError(f"probe {self.id!r}: max_tokens must be >= 1; got {self.max_tokens}")
        markers = self.text.count(MEDIA_MARKER)
        if markers != len(self.media):
            raise ValueError(f"probe {self.id!r}: {markers} {MEDIA_MARKER} marker(s) but {len(self.media)} "
                             "media item(s); put one marker where each item goes")

    @property
    def text(self) -> str:
        """The prompt as the engine sees it (chat messages rendered with the ChatML template)."""
        return self.prompt if self.prompt is not None else render_chat(self.messages)

    def answer(self, output: str | None) -> str | None:
        return extract(self.extract, output)

    def is_correct(self, output: str | None) -> bool:
        return self.answer(output) == self.expected

    def summary(self) -> dict[str, Any]:
        """What a history's invoke event records of the probe (the prompt is recorded with the op)."""
        return {"id": self.id, "family": self.family, "expected": self.expected, "extract": self.extract,
                "group": self.group, "max_tokens": self.max_tokens}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "prompt": self.prompt,
                "messages": None if self.messages is None else [m.as_dict() for m in self.messages],
                "media": [base64.b64encode(m).decode("ascii") for m in self.media]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Probe:
        messages = data.get("messages")
        return cls(id=data["id"], family=data["family"], expected=data["expected"], extract=data["extract"],
                   group=data["group"], prompt=data.get("prompt"), max_tokens=data.get("max_tokens", 16),
                   messages=None if messages is None else tuple(Message(**m) for m in messages),
                   media=tuple(base64.b64decode(m) for m in data.get("media", ())))
