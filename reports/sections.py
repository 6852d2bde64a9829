"""The tables of a run report: rates as read by a person, the corrupted requests, the attribution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from forensics.attribute import unlanded_note
from reports.document import Heading, Paragraph, Table
from reports.plots import hit_label
from reports.summary import counted, percent

__all__ = ["ATTRIBUTION", "CORRUPTED_LIMIT", "attribution_blocks", "corrupted_requests", "rate_rows"]

ATTRIBUTION = "attribution.json"  # written into the run directory by the forensics analysis
CORRUPTED_LIMIT = 200  # rows shown; requests.csv has them all


def _interval(low: float, high: float) -> str:
    return f"{percent(low).rstrip('%')}–{percent(high)}"


def rate_rows(table: pd.DataFrame) -> pd.DataFrame:
    """``reports.tables.rates`` output with k/n, the rate and both intervals as text."""
    if table.empty:
        return pd.DataFrame()
    labels = [c for c in table.columns if c not in ("requests", "corrupted", "rate", "wilson_low", "wilson_high",
                                                      "cp_low", "cp_high")]
    shown = table[labels].copy()
    if "hit" in shown:
        shown["hit"] = shown["hit"].map(hit_label)
    shown["k/n"] = [f"{k:,}/{n:,}" for k, n in zip(table["corrupted"], table["requests"])]
    shown["rate"] = table["rate"].map(percent)
    shown["Wilson CI"] = [_interval(lo, hi) for lo, hi in zip(table["wilson_low"], table["wilson_high"])]
    shown["Clopper-Pearson CI"] = [_interval(lo, hi) for lo, hi in zip(table["cp_low"], table["cp_high"])]
    return shown.reset_index(drop=True)


def _first_detail(details: Any, fired: list[str], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` in the details of the oracles that fired (then of any oracle)."""
    if not isinstance(details, dict):
        return ""
    for name in [*fired, *details]:
        for key in keys:
            value = details.get(name, {}).get(key)
            if value is not None:
                return str(value)
    return ""


def corrupted_requests(frame: pd.DataFrame) -> Table:
    """One row per corrupted request: where it ran, the oracles that fired, what came back and what was expected."""
    rows = counted(frame)
    rows = rows[rows["corrupted"]] if not rows.empty else rows
    caption = (f"{len(rows):,} corrupted requests (completed, hammer arm)"
               + (f"; the first {CORRUPTED_LIMIT} shown, all in requests.csv" if len(rows) > CORRUPTED_LIMIT else ""))
    if rows.empty:
        return Table(pd.DataFrame(), caption)
    shown = pd.DataFrame({
        "request": rows["request"], "run": rows["run"], "pattern": rows["pattern"], "group": rows["group"],
        "family": rows["family"], "hit": rows["hit"].map(hit_label),
        "cached tokens": rows["cached_tokens"].map(lambda v: "" if pd.isna(v) else f"{int(v):,}"),
        "oracles fired": rows["fired"].map(", ".join),
        "output": [_first_detail(d, f, ("output", "answer", "text")) for d, f in zip(rows["details"], rows["fired"])],
        "expected (cold control)": [_first_detail(d, f, ("control_output", "expected"))
                                    for d, f in zip(rows["details"], rows["fired"])],
    })
    if shown["run"].nunique() == 1:
        shown = shown.drop(columns="run")
    return Table(shown.head(CORRUPTED_LIMIT).reset_index(drop=True), caption)


def _rows_table(rows: Any, caption: str) -> Table:
    """A list of dicts as a table; nested values as compact JSON."""
    items = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    frame = pd.DataFrame([{k: v if isinstance(v, (str, int, float, bool)) or v is None
                           else json.dumps(v, sort_keys=True) for k, v in item.items()} for item in items])
    return Table(frame, caption)


def attribution_blocks(run_path: Path, *, titled: bool = False) -> list:
    """What ``attribution.json`` of the run says (hypotheses, per-request verdicts, sticky windows),
    or that it is not analysed yet."""
    title = [Heading(f"Run {run_path.name}", 3)] if titled else []
    source = Path(run_path) / ATTRIBUTION
    if not source.exists():
        return [*title, Paragraph(f"Not analysed yet: {ATTRIBUTION} is not in the run directory. Attribution "
                                  "(which cause the slot ledger proves for each corrupted hit) appears here once "
                                  "the forensics analysis has written it.")]
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [*title, Paragraph(f"{ATTRIBUTION} could not be read ({type(error).__name__}: {error}).")]
    if not isinstance(data, dict):
        data = {"rows": data}
    blocks = [*title, Paragraph(f"From {ATTRIBUTION} in the run directory.")]
    if data.get("ledger_unlanded"):
        blocks.append(Paragraph(f"Ledger: {unlanded_note(data['ledger_unlanded'])}."))
    names = {"hypotheses": "Hypotheses: confirmed / falsified / untested by the ledger",
             "verdicts": "Per corrupted request: the verdict and the hypotheses its evidence could test",
             "windows": "Sticky windows: failures per donation (branch) they restored from",
             "parted": "Each corrupted request against its cold control: the first difference of the two ledgers "
                       "(its live state at a position, or with every state equal its logits at a token), if any"}
    for key, rows in data.items():
        if isinstance(rows, list):
            blocks.append(Table(_rows_table(rows, "").frame, names.get(key, key)))
    return blocks
