"""The fault-matrix table: per cell, was the fault caught, how fast, how often, and blamed on the right cause.

Read from ``matrix.json`` (``hammer.matrix.run_matrix``) and each cell's run directory; pure.

    detected          >= 1 corrupted hit (fault cells); the clean cell "passes" with 0 corrupted
    first detection   hammer requests sent up to and including the first corrupted one
    t99               time until a run of this cell catches the fault with 99% probability: the
                      requests ``reports.stats.requests_to_detect(p, 0.99)`` needs at the measured
                      per-request rate p (corrupted hammer requests / hammer requests), times the
                      cell's measured seconds per hammer request. ``t99 (95% low p)`` uses the
                      lower Wilson bound of p instead: the conservative figure
    corrupted / hits  with its 95% Wilson interval (the clean cell: the one-sided upper bound)
    attribution       the commonest verdict among corrupted hits, its share, and whether it is the
                      cell's expected verdict; a fault cell is correct when that share >= 95% (an
                      extra cell without an expected verdict passes on detection alone)
    windows           sticky windows (donations that served >= 1 failure) and failures per window
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reports.stats import requests_to_detect, wilson
from reports.tables import load_run

__all__ = ["MATRIX_COLUMNS", "matrix_cases", "matrix_rows", "matrix_verdict", "render_matrix"]

MATRIX_COLUMNS = ("cell", "detected", "first detection", "t99", "t99 (95% low p)", "corrupted / hits",
                  "attribution", "windows", "seconds")
SHARE = 0.95


def matrix_rows(matrix_json: str | Path) -> list[dict[str, Any]]:
    """One row per cell of a matrix run (see the module docstring for each figure)."""
    record = json.loads(Path(matrix_json).read_text())
    return [_row(cell) for cell in record["cells"]]


def _row(cell: Mapping[str, Any]) -> dict[str, Any]:
    run = Path(cell["run"])
    frame = load_run(run)
    hammer = frame[frame["arm"] == "hammer"].sort_values("invoked_at", kind="stable")
    done = hammer[hammer["outcome"] == "ok"]
    hits = done[done["hit"] == True]  # noqa: E712 -- the column holds None where the target did not say
    bad_hits = int(hits["corrupted"].sum())
    corrupted = int(done["corrupted"].sum())
    n, seconds = len(hammer), float(cell["seconds"])
    first = next((i + 1 for i, bad in enumerate(hammer["corrupted"].fillna(False)) if bad), None)
    attribution = json.loads((run / "attribution.json").read_text())
    hit_ids = set(hits["request"])
    verdicts = Counter(v["verdict"] for v in attribution["verdicts"] if v["request"] in hit_ids)
    top, top_n = verdicts.most_common(1)[0] if verdicts else (None, 0)
    rate = wilson(bad_hits, len(hits)) if len(hits) else None
    p = corrupted / n if n else 0.0
    p_low = wilson(corrupted, n).lower if n else 0.0
    windows = attribution.get("windows", [])
    row = {"cell": cell["name"], "expected": cell["expected"], "run": str(run), "seconds": round(seconds, 1),
           "hammer": n, "hits": len(hits), "corrupted_hits": bad_hits, "corrupted": corrupted,
           "first_detection": first, "rate_low": None if rate is None else rate.lower,
           "rate_high": None if rate is None else rate.upper, "top_verdict": top,
           "top_share": top_n / bad_hits if bad_hits else None, "verdicts": dict(verdicts),
           "windows": len(windows), "failures_per_window": (sum(w["failures"] for w in windows) / len(windows)
                                                            if windows else None)}
    row["t99_s"] = _t99(p, n, seconds)
    row["t99_low_s"] = _t99(p_low, n, seconds)
    row["clean"] = not cell["faults"]
    row["upper_95"] = wilson(bad_hits, len(hits), sided="upper").upper if len(hits) else 1.0
    if row["clean"]:
        row["ok"] = corrupted == 0
    elif cell["expected"] is None:  # a fault outside the catalogue with no verdict of its own: detection alone
        row["ok"] = bool(bad_hits)
    else:
        row["ok"] = bool(bad_hits) and top == cell["expected"] and row["top_share"] >= SHARE
    return row


def _t99(p: float, n: int, seconds: float) -> float | None:
    if p <= 0 or not n:
        return None
    return requests_to_detect(min(p, 1.0), 0.99) * seconds / n


def matrix_verdict(rows: list[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """(exit code, problems): 1 when a fault went undetected or misattributed, or the clean cell corrupted."""
    problems = []
    for row in rows:
        if row["ok"]:
            continue
        if row.get("clean", row["expected"] is None):
            problems.append(f"{row['cell']}: {row['corrupted']} corrupted request(s) on the clean engine")
        elif not row["corrupted_hits"]:
            problems.append(f"{row['cell']}: not detected in {row['hammer']} requests ({row['seconds']} s)")
        else:
            problems.append(f"{row['cell']}: attributed to {row['top_verdict']} ({row['top_share']:.0%}), "
                            f"expected {row['expected']}")
    return (1 if problems else 0), problems


def _cells(row: Mapping[str, Any]) -> list[str]:
    def seconds(value):
        return "-" if value is None else f"{value:.1f} s"

    if row.get("clean", row["expected"] is None):
        detected = "clean" if row["ok"] else "CORRUPTED"
        rate = f"{row['corrupted_hits']}/{row['hits']} (95% upper {row['upper_95']:.2%})"
        verdict = "-" if not row["verdicts"] else ", ".join(f"{k} {v}" for k, v in row["verdicts"].items())
    else:
        detected = "yes" if row["corrupted_hits"] else "NO"
        rate = (f"{row['corrupted_hits']}/{row['hits']} ({row['rate_low']:.0%}-{row['rate_high']:.0%})"
                if row["hits"] else "0/0")
        judged = "no expected verdict" if row["expected"] is None else "correct" if row["ok"] else "WRONG"
        verdict = "-" if row["top_verdict"] is None else f"{row['top_verdict']} {row['top_share']:.0%} ({judged})"
    windows = "-" if not row["windows"] else f"{row['windows']} ({row['failures_per_window']:.1f}/window)"
    return [row["cell"], detected, "-" if row["first_detection"] is None else str(row["first_detection"]),
            seconds(row["t99_s"]), seconds(row["t99_low_s"]), rate, verdict, windows, f"{row['seconds']:.1f}"]


def render_matrix(rows: list[Mapping[str, Any]], *, markdown: bool = False) -> str:
    """The matrix as an aligned text table, or as a Markdown table."""
    cells = [list(MATRIX_COLUMNS), *[_cells(r) for r in rows]]
    if markdown:
        lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(MATRIX_COLUMNS)]
        return "\n".join([*lines, *("| " + " | ".join(c) + " |" for c in cells[1:])]) + "\n"
    widths = [max(len(c[i]) for c in cells) for i in range(len(MATRIX_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def matrix_cases(rows: list[Mapping[str, Any]]) -> list[tuple[str, str | None, str, float]]:
    """(cell, failure message or None, run directory, seconds) per cell: a JUnit case each."""
    _, problems = matrix_verdict(rows)
    by_cell = {p.split(":", 1)[0]: p for p in problems}
    return [(row["cell"], by_cell.get(row["cell"]), row["run"], row["seconds"]) for row in rows]
