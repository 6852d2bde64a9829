"""Incremental text of one streamed choice: never a broken UTF-8 sequence, never a possible stop string.

The engine yields tokens (bytes, for the byte tokenizer); a client wants text deltas whose
concatenation is exactly the final ``RequestResult.text``. Two things are held back until the next
token decides them:

    ids:  ... 0x48 0x69 0xE2 0x82 | (0xAC)      an incomplete multi-byte sequence at the end
    text: "... so the ans"        | "we"?         a suffix that may begin a stop string ("answer:")
"""

from __future__ import annotations

import logging

from mini_engine.engine import RequestResult
from mini_engine.model import ByteTokenizer

__all__ = ["TextStream", "incomplete_utf8_tail", "stop_prefix_len"]

log = logging.getLogger(__name__)


class TextStream:
    def __init__(self, tokenizer: ByteTokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, stop
        self.ids: list[int] = []
        self.sent = ""  # text emitted so far

    def push(self, tokens: tuple[int, ...], result: RequestResult | None = None) -> str:
        """The delta that is safe to emit after ``tokens``; with the final ``result``, all the rest."""
        self.ids.extend(tokens)
        if result is not None:
            return self._emit_final(result.text)
        stable = self.ids[: len(self.ids) - incomplete_utf8_tail(self.ids)]
        text = self.tokenizer.decode(stable, skip_special=True)
        return self._emit(text[: len(text) - stop_prefix_len(text, self.stop)])

    def _emit(self, text: str) -> str:
        if len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _emit_final(self, text: str) -> str:
        if not text.startswith(self.sent):  # cannot happen for the byte tokenizer; never emit twice
            log.error("streamed text %r is not a prefix of the final text %r", self.sent, text)
            return ""
        return self._emit(text)


def incomplete_utf8_tail(ids: list[int]) -> int:
    """How many trailing byte tokens begin a UTF-8 sequence that more bytes could still complete."""
    for back in range(1, min(4, len(ids)) + 1):
        byte = ids[-back]
        if not 0 <= byte < 256:
            return 0  # a special token ends any pending sequence
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


def stop_prefix_len(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:k]):
                longest = k
                break
    return longest
