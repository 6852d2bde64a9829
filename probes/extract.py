"""Extractors: pure functions from a model's output text to its answer, or None when it gave none.

Each returns the answer in the canonical form a probe's ``expected`` is written in, so grading is
one string comparison. Empty output, whitespace and junk give None, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["EXTRACTORS", "after_answer_marker", "exact_word", "extract", "first_number"]

_NUMBER = re.compile(r"-?\d+", re.ASCII)
_WORD = re.compile(r"[A-Za-z]+")
_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)


def first_number(text: str | None) -> str | None:
    """The first integer, without leading zeros or '+': ``"is 0433."`` -> ``"433"``, ``"-5"`` -> ``"-5"``.

    ASCII digits only; thousands separators are not joined (``"1,234"`` -> ``"1"``).
    """
    match = _NUMBER.search(text or "")
    return None if match is None else str(int(match.group()))


def after_answer_marker(text: str | None) -> str | None:
    """What follows the last ``Answer:`` on its line (or, with no marker, the first non-empty line),
    stripped of spaces and a trailing period; None when that is empty."""
    text = text or ""
    markers = list(_MARKER.finditer(text))
    tail = text[markers[-1].end():] if markers else text.lstrip()
    answer = tail.strip(" \t").split("\n", 1)[0].strip().rstrip(".").strip()
    return answer or None


def exact_word(text: str | None) -> str | None:
    """The first run of ASCII letters, lower-cased: ``" Red."`` -> ``"red"``; None when there is none."""
    match = _WORD.search(text or "")
    return None if match is None else match.group().lower()


EXTRACTORS: dict[str, Callable[[str | None], str | None]] = {
    "first_number": first_number,
    "after_answer_marker": after_answer_marker,
    "exact_word": exact_word,
}


def extract(name: str, text: str | None) -> str | None:
    """Apply the extractor called ``name``; raises KeyError naming the known extractors."""
    if name not in EXTRACTORS:
        raise KeyError(f"unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
    return EXTRACTORS[name](text)
