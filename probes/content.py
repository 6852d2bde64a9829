"""Content forensics: what is wrong with an output on its face, without knowing the right answer.

Pure functions of text. Each names one symptom the seeds report on corrupted hits: empty output,
special tokens leaking into the content, garbled bytes, and a decode stuck in a loop.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from probes.text import SPECIAL_TOKENS

__all__ = ["Repetition", "garbage_ratio", "is_empty", "runaway_repetition", "special_token_leaks"]

REPLACEMENT = "\ufffd"  # what invalid UTF-8 decodes to
_BENIGN_CONTROLS = frozenset("\n\t\r")


def is_empty(text: str | None) -> bool:
    """Nothing but whitespace (or no text at all)."""
    return not (text or "").strip()


def special_token_leaks(text: str | None) -> tuple[str, ...]:
    """The special-token strings found in the content, in ``SPECIAL_TOKENS`` order."""
    return tuple(token for token in SPECIAL_TOKENS if token in (text or ""))


def garbage_ratio(text: str | None) -> float:
    """Share of characters that are replacement characters or non-printable (Unicode category C,
    other than newline, tab and carriage return); 0.0 for empty text."""
    text = text or ""
    if not text:
        return 0.0
    bad = sum(1 for ch in text if ch == REPLACEMENT
              or (ch not in _BENIGN_CONTROLS and unicodedata.category(ch).startswith("C")))
    return bad / len(text)


@dataclass(frozen=True)
class Repetition:
    unit: str  # the repeated piece
    repeats: int  # how many times in a row
    start: int  # where the run starts in the text


def runaway_repetition(text: str | None, *, max_unit: int = 16, min_repeats: int = 8,
                       min_span: int = 16) -> Repetition | None:
    """The first run of one piece (1..``max_unit`` characters) repeated back to back at least
    ``min_repeats`` times over at least ``min_span`` characters, or None.

    ``min_span`` keeps short honest runs ("1000000", "...") from counting as a loop.
    """
    pattern = re.compile(r"(.{1,%d}?)\1{%d,}" % (max_unit, min_repeats - 1), re.DOTALL)
    for match in pattern.finditer(text or ""):
        if match.end() - match.start() >= min_span:
            unit = match.group(1)
            return Repetition(unit, (match.end() - match.start()) // len(unit), match.start())
    return None
