"""What a prompt looks like to a byte-level ChatML engine: chat rendering, token counts, special tokens.

This mirrors ``mini_engine``'s ``ByteTokenizer`` (tests check that the two agree) without importing
it: patterns and oracles read plain data. One ASCII character is one token; each special token
string is one token; a ``<|media|>`` marker is where one media item goes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MEDIA_MARKER", "Message", "ROLES", "SPECIAL_TOKENS", "count_tokens", "render_chat"]

ENDOFTEXT, IM_START, IM_END, MEDIA_MARKER = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|media|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MEDIA_MARKER)
ROLES = ("system", "user", "assistant")

_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


@dataclass(frozen=True)
class Message:
    """One chat message; ``content`` may hold ``<|media|>`` markers (one per media item, in order)."""

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message.role must be one of {ROLES}; got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"Message.content must be a string; got {type(self.content).__name__}")

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def render_chat(messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
    """ChatML, as the engine renders it: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message,
    then ``<|im_start|>assistant\\n``."""
    if not messages:
        raise ValueError("messages must hold at least one message")
    turns = "".join(f"{IM_START}{m.role}\n{m.content}{IM_END}\n" for m in messages)
    return turns + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def count_tokens(text: str) -> int:
    """Tokens of ``text`` under the byte rule: UTF-8 bytes, each special token string counting one."""
    return sum(1 if piece in SPECIAL_TOKENS else len(piece.encode("utf-8"))
               for piece in _SPECIAL_SPLIT.split(text))
