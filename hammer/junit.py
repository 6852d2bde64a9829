"""JUnit XML, the one format every CI shows: a suite of cases, each passed or failed with a message.

``Case(classname, name, failure, text, seconds)``: ``failure`` None passes; otherwise it is the
failure's message and ``text`` its body. Used by the soak (a case per pattern x probe family) and
by the fault matrix (a case per cell).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

__all__ = ["Case", "write_suite"]


@dataclass(frozen=True)
class Case:
    classname: str
    name: str
    failure: str | None = None
    text: str = ""
    seconds: float | None = None


def write_suite(name: str, cases: Iterable[Case], path: str | Path) -> Path:
    cases = list(cases)
    failures = sum(c.failure is not None for c in cases)
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuite name={quoteattr(name)} tests="{len(cases)}" failures="{failures}">']
    for case in cases:
        time = "" if case.seconds is None else f' time="{case.seconds}"'
        lines.append(f'  <testcase classname={quoteattr(case.classname)} name={quoteattr(case.name)}{time}>')
        if case.failure is not None:
            lines.append(f"    <failure message={quoteattr(case.failure)}>{escape(case.text)}</failure>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
