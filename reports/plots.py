"""PNG plots of a run's corruption (DESIGN.md §7): rates with intervals, hit vs cold, sticky windows.

Every function takes DataFrames (``reports.tables.load_run`` / ``rates`` output) and a path, writes
one PNG there and returns the path. Figures are built on matplotlib's object API with the Agg
canvas, never ``pyplot``, so nothing global is touched and plots can be drawn from any thread.
An empty input still gives a valid PNG that says there was no data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reports.tables import rates

__all__ = ["plot_hit_vs_cold", "plot_latency", "plot_rates", "plot_timeline"]

COLORS = {"ok": "#9e9e9e", "corrupted": "#d62728", "abandoned": "#ff7f0e", "not completed": "#4a4a4a",
          "hit": "#1f77b4", "cold": "#7f7f7f", "hit unknown": "#bcbd22"}
TIMELINE_GROUPS = 30  # more branches than this and the rows become unreadable: keep the worst ones


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _no_data(path: str | os.PathLike, title: str, why: str) -> Path:
    figure = _figure(6, 2)
    ax = figure.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=11)
    return _save(figure, path)


def hit_label(hit: object) -> str:
    """``True`` / ``False`` / missing as the words the plots and tables use."""
    if pd.isna(hit):
        return "hit unknown"
    return "hit" if bool(hit) else "cold"


def _interval_marks(ax, rows: pd.DataFrame, y: list[float], name: str) -> None:
    """Rates as points with Wilson error bars (in %), each labelled k/n right of its bar."""
    ax.errorbar(100 * rows["rate"], y, xerr=[100 * (rows["rate"] - rows["wilson_low"]),
                                            100 * (rows["wilson_high"] - rows["rate"])],
                fmt="o", capsize=3, color=COLORS.get(name, None), label=name or None)
    for yi, (_, row) in zip(y, rows.iterrows()):
        ax.annotate(f"{row['corrupted']}/{row['requests']}", (100 * row["wilson_high"], yi),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)


def plot_rates(rate_table: pd.DataFrame, path: str | os.PathLike, *,
               label_by: Sequence[str] = ("faults", "pattern"), hue: str | None = "hit",
               confidence: float = 0.95, title: str = "Corruption rate by fault × pattern") -> Path:
    """One row per ``label_by`` combination: the rate with its Wilson interval and k/n beside it.

    ``rate_table`` is ``reports.tables.rates`` output grouped by ``label_by`` (plus ``hue``)."""
    if rate_table.empty:
        return _no_data(path, title, "no completed hammer requests")
    table = rate_table.copy()
    table["label"] = table[list(label_by)].astype(str).agg(" · ".join, axis=1) if label_by else "all"
    table["series"] = table[hue].map(hit_label) if hue == "hit" else (table[hue].astype(str) if hue else "")
    labels = list(dict.fromkeys(table["label"]))
    series = list(dict.fromkeys(table["series"]))
    figure = _figure(9, 1.3 + 0.25 * len(labels) * (1 + len(series)))
    ax = figure.subplots()
    offsets = {name: (i - (len(series) - 1) / 2) * 0.3 for i, name in enumerate(series)}
    for name, rows in table.groupby("series", sort=False):
        _interval_marks(ax, rows, [labels.index(label) + offsets[name] for label in rows["label"]], name)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first label on top
    ax.set_xlim(-2, 112)
    ax.set_xlabel(f"corrupted / completed hammer requests, % (bars: {confidence:.0%} Wilson interval)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    if hue:
        ax.legend(loc="lower right", fontsize=8)
    return _save(figure, path)


def plot_hit_vs_cold(frame: pd.DataFrame, path: str | os.PathLike, *, confidence: float = 0.95) -> Path:
    """Corruption on hits beside corruption on cold requests, per fault setting (the seeds' signature:
    wrong on hits only)."""
    table = rates(frame, by=["faults", "hit"], confidence=confidence)
    return plot_rates(table, path, label_by=["faults"], hue="hit", confidence=confidence,
                      title="Hits vs cold requests")


def _status(frame: pd.DataFrame) -> pd.Series:
    status = pd.Series("not completed", index=frame.index)
    status[frame["outcome"] == "ok"] = "ok"
    status[frame["abandoned"].astype(bool)] = "abandoned"
    status[frame["corrupted"].astype(bool)] = "corrupted"
    return status


def _worst_groups(requests: pd.DataFrame, limit: int) -> list[str]:
    """Groups in order of first request, keeping the ``limit`` with most corruption, then most requests."""
    summary = requests.groupby("group", sort=False).agg(corrupted=("corrupted", "sum"), size=("request", "size"),
                                                        first=("index", "min"))
    kept = summary.sort_values(["corrupted", "size"], ascending=False).head(limit)
    return list(kept.sort_values("first").index)


def _status_marks(ax, shown: pd.DataFrame, groups: list[str], x_column: str) -> None:
    """One mark per request at (x, its group's row): colour by status, filled on hits, hollow on cold."""
    for status in ("ok", "abandoned", "not completed", "corrupted"):
        for hit, face in ((True, COLORS[status]), (False, "none")):
            rows = shown[(shown["status"] == status) & (shown["hit"].fillna(False).astype(bool) == hit)]
            if not rows.empty:
                ax.scatter(rows[x_column], [groups.index(g) for g in rows["group"]],
                           marker="X" if status == "corrupted" else "o", s=46 if status == "corrupted" else 26,
                           facecolors=face, edgecolors=COLORS[status], label=f"{status} ({'hit' if hit else 'cold'})")


def plot_timeline(frame: pd.DataFrame, path: str | os.PathLike, *, x: str = "index") -> Path:
    """Per-branch timeline of sticky windows: one row per group, one mark per hammer request
    (ok / corrupted / abandoned / not completed), filled on hits, hollow on cold requests.

    ``x`` is ``"index"`` (order sent) or ``"time"`` (``invoked_at``, seconds)."""
    if x not in ("index", "time"):
        raise ValueError(f"x must be 'index' or 'time', got {x!r}")
    title = "Per-branch timeline (sticky windows)"
    if frame.empty or "invoked_at" not in frame:
        return _no_data(path, title, "no requests")
    requests = frame[frame["arm"] == "hammer"].sort_values("invoked_at", kind="stable").reset_index(drop=True)
    if requests.empty:
        return _no_data(path, title, "no hammer requests")
    requests = requests.assign(index=range(len(requests)), group=requests["group"].fillna("(no group)").astype(str),
                               status=_status(requests))
    groups = _worst_groups(requests, TIMELINE_GROUPS)
    shown = requests[requests["group"].isin(groups)]
    figure = _figure(11, 1.5 + 0.32 * len(groups))
    ax = figure.subplots()
    _status_marks(ax, shown, groups, "index" if x == "index" else "invoked_at")
    ax.set_yticks(range(len(groups)), [g if len(g) <= 40 else g[:39] + "…" for g in groups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("request index (order sent)" if x == "index" else "time sent (s)")
    hidden = requests["group"].nunique() - len(groups)
    ax.set_title(title + (f" — {hidden} quieter groups not shown" if hidden else ""))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return _save(figure, path)


def plot_latency(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Latency and time-to-first-token distributions of completed hammer requests, hits beside cold."""
    title = "Latency and TTFT (context)"
    completed = frame[(frame["outcome"] == "ok") & (frame["arm"] == "hammer")] if not frame.empty else frame
    if completed.empty or completed[["latency", "ttft"]].isna().all().all():
        return _no_data(path, title, "no latency recorded")
    figure = _figure(10, 3.4)
    for ax, column in zip(figure.subplots(1, 2), ("latency", "ttft")):
        values = completed.assign(kind=completed["hit"].map(hit_label)).dropna(subset=[column])
        bins = np.histogram_bin_edges(1000 * values[column].astype(float), bins=30) if len(values) else 30
        for kind, rows in values.groupby("kind"):
            ax.hist(1000 * rows[column], bins=bins, alpha=0.6, color=COLORS[kind], label=f"{kind} (n={len(rows)})")
        ax.set_xlabel(f"{column} (ms)")
        ax.set_ylabel("requests")
        ax.set_title(column if len(values) else f"{column}: not recorded")
        if len(values):
            ax.legend(fontsize=8)
    figure.suptitle(title)
    return _save(figure, path)
