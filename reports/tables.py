"""Tidy tables of a run's requests and their corruption rates (DESIGN.md §7).

``load_runs`` reads stored run directories (partial ones too) into one DataFrame with a row per
request choice: who ran it (run, target, faults, seeds), what it asked (pattern, probe family, arm),
what came back (hit, cached tokens, outcome, latency, TTFT), what surrounded it (requests in
flight when it was sent, an abandoned stream of its group in flight) and every oracle's verdict.
``rates`` aggregates corruption by any of those columns with intervals. Everything is a pure
function of files: nothing here runs a model or a target.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from forensics import RunDir, fold_history
from probes.verdicts import check_fold
from reports.stats import clopper_pearson, wilson

__all__ = ["RATE_COLUMNS", "export", "load_run", "load_runs", "rates"]

RATE_COLUMNS = ("requests", "corrupted", "rate", "wilson_low", "wilson_high", "cp_low", "cp_high")


def load_runs(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One row per request choice of every run directory in ``paths`` (in that order)."""
    frames = [load_run(path) for path in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_run(path: str | os.PathLike) -> pd.DataFrame:
    """One row per request choice of one run directory: verdict columns plus run and timing context."""
    run = RunDir.open(path)
    events = run.history()
    fold = fold_history(events)
    analysis = check_fold(fold, exact=run.meta.exact)  # an inexact engine's differences are reported, not counted
    timing = _timing(fold.records)
    rows = []
    for verdict in analysis.rows:
        row = verdict.as_dict()
        row.update(timing.get(verdict.request, {}))
        rows.append(row)
    frame = pd.DataFrame(rows)
    for column, value in reversed(_run_columns(Path(path), run).items()):
        frame.insert(0, column, value)
    return _context(frame)


def _run_columns(path: Path, run: RunDir) -> dict[str, object]:
    meta = run.meta
    return {"run": path.resolve().name, "target": meta.target.get("kind", ""),
            "faults": ",".join(sorted(meta.faults)) or "none",
            "seeds": ",".join(f"{k}={v}" for k, v in sorted(meta.seeds.items()))}


def _timing(records) -> dict[str, dict[str, object]]:
    out = {}
    for rid, record in records.items():
        end = record.end or {}
        out[rid] = {"invoked_at": record.invoke.get("time") if record.invoke else None,
                    "ended_at": end.get("time"), "latency": end.get("latency"), "ttft": end.get("ttft")}
    return out


def _context(frame: pd.DataFrame) -> pd.DataFrame:
    """``in_flight``: other requests sent and not ended when this one was sent; ``abandoned_neighbour``:
    an abandoned stream of the same group was in flight then (the first seed's trigger)."""
    if frame.empty:
        return frame.assign(in_flight=[], abandoned_neighbour=[])
    sent = frame["invoked_at"].astype(float)
    ended = frame["ended_at"].astype(float).fillna(float("inf"))
    in_flight, neighbour = [], []
    for i in range(len(frame)):
        overlap = (sent < sent.iloc[i]) & (ended > sent.iloc[i])
        in_flight.append(int(overlap.sum()))
        same_group = frame["group"].notna() & (frame["group"] == frame["group"].iloc[i])
        neighbour.append(bool((overlap & same_group & frame["abandoned"].astype(bool)).any()))
    return frame.assign(in_flight=in_flight, abandoned_neighbour=neighbour)


def rates(frame: pd.DataFrame, by: Sequence[str] = ("faults", "pattern", "hit"), *,
          confidence: float = 0.95, hammer_only: bool = True) -> pd.DataFrame:
    """Corruption among completed requests, grouped ``by``, with Wilson and Clopper-Pearson intervals.

    Abandoned, failed and pending requests are never counted (they have no complete answer), and
    neither are controls unless ``hammer_only`` is False."""
    if frame.empty:
        return pd.DataFrame(columns=[*by, *RATE_COLUMNS])
    counted = frame[frame["outcome"] == "ok"]
    if hammer_only:
        counted = counted[counted["arm"] == "hammer"]
    if counted.empty:
        return pd.DataFrame(columns=[*by, *RATE_COLUMNS])
    grouped = counted.groupby(list(by), dropna=False)["corrupted"].agg(["size", "sum"]).reset_index()
    rows = []
    for _, group in grouped.iterrows():
        n, k = int(group["size"]), int(group["sum"])
        w, cp = wilson(k, n, confidence), clopper_pearson(k, n, confidence)
        rows.append({**{c: group[c] for c in by}, "requests": n, "corrupted": k, "rate": k / n,
                     "wilson_low": w.lower, "wilson_high": w.upper, "cp_low": cp.lower, "cp_high": cp.upper})
    return pd.DataFrame(rows)


def export(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``frame`` by the path's suffix: ``.csv``, or ``.parquet`` (typed columns; list and dict
    cells become JSON text so every column has one Arrow type). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        _json_cells(frame).to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        raise ValueError(f"export writes .csv or .parquet; got {path.name!r}")
    return path


def _json_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose object columns holding lists, tuples or dicts are JSON strings."""
    out = frame.copy()
    for column in out.columns[out.dtypes == object]:
        if out[column].map(lambda v: isinstance(v, (list, tuple, dict))).any():
            out[column] = out[column].map(lambda v: v if v is None else json.dumps(v, sort_keys=True, default=str))
    return out
