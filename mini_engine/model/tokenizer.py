"""Byte-level tokenizer with a few special tokens and a ChatML chat template.

Ids 0-255 are raw bytes; special tokens follow. Nothing is downloaded, every string round-trips,
and the same text always gives the same ids, which the harness's prefix sharing relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["ByteTokenizer", "SPECIAL_TOKENS", "MEDIA_TOKEN"]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MEDIA_TOKEN = "<|media|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MEDIA_TOKEN)
ROLES = ("system", "user", "assistant")


UNKNOWN_POLICIES = ("raise", "replace")  # ByteTokenizer(unknown=...): ids past the tokenizer's vocabulary


class ByteTokenizer:
    """UTF-8 bytes plus ``SPECIAL_TOKENS``; ``vocab_size`` = 256 + number of specials.

    ``unknown``: what ``decode`` does with an id past the vocabulary: "raise" (the default: an error, not
    silent garbage), or "replace" (render U+FFFD, as invalid UTF-8 is rendered), for an engine whose model has
    a larger vocabulary than this tokenizer (a random-weight model with a real model's vocabulary), where
    such ids are the model's output rather than bad input. Negative ids always raise."""

    def __init__(self, *, unknown: str = "raise") -> None:
        if unknown not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES}; got {unknown!r}")
        self.unknown = unknown
        self.special_ids = {text: 256 + i for i, text in enumerate(SPECIAL_TOKENS)}
        self.special_texts = {i: text for text, i in self.special_ids.items()}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")

    @property
    def vocab_size(self) -> int:
        return 256 + len(SPECIAL_TOKENS)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Tokens that end a generation: end of text and end of a chat turn."""
        return (self.special_ids[ENDOFTEXT], self.special_ids[IM_END])

    @property
    def media_token_id(self) -> int:
        return self.special_ids[MEDIA_TOKEN]

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Bytes of ``text``; special-token strings become their ids unless ``allow_special`` is False."""
        if not allow_special:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 is replaced, specials are rendered unless ``skip_special``, ids past the
        vocabulary follow ``unknown``."""
        out: list[str] = []
        pending = bytearray()
        for token in ids:
            if 0 <= token < 256:
                pending.append(token)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            if token not in self.special_texts:
                if self.unknown == "replace" and token >= self.vocab_size:
                    out.append("\ufffd")
                    continue
                raise ValueError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")
            if not skip_special:
                out.append(self.special_texts[token])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True) -> str:
        """ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then the assistant header."""
        if not messages:
            raise ValueError("messages must hold at least one message")
        parts = []
        for i, message in enumerate(messages):
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise ValueError(f"messages[{i}].role must be one of {ROLES}; got {role!r}")
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string; got {type(content).__name__}")
            parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts)
