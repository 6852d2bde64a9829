"""The sentences a report opens with: what a run or a comparison shows, and what it was computed from.

A run is CORRUPTED when any completed hammer request is corrupted, CLEAN when none is and some were
hits, NO HITS when nothing was corrupted but nothing hit the cache either (then the hit path was
never exercised, and nothing is claimed). Every sentence carries k, n, the method and the confidence.
"""

from __future__ import annotations

import pandas as pd

from probes.oracles import ORACLES
from reports.document import Headline
from reports.stats import Comparison, Rate, clopper_pearson, cluster_rate, wilson

__all__ = ["comparison_headline", "counted", "hit_counts", "interval_text", "percent", "run_headline", "run_notes"]

UNDECIDED_LABELS = ("no-control", "error")  # the oracle labels that mean "could not decide"


def percent(x: float) -> str:
    """A proportion as a percentage: two significant digits below 1% (0.14%), else one decimal."""
    if pd.isna(x):
        return "n/a"
    return f"{100 * x:.2g}%" if 0 < x < 0.01 else f"{100 * x:.1f}%"


def interval_text(rate: Rate) -> str:
    """"95% Wilson CI 6.6–12.1%" or "95% Clopper-Pearson upper bound 0.14%"."""
    level = f"{100 * rate.confidence:g}% {rate.method}"
    if rate.sided == "upper":
        return f"{level} upper bound {percent(rate.upper)}"
    return f"{level} CI {percent(rate.lower).rstrip('%')}–{percent(rate.upper)}"


def counted(frame: pd.DataFrame) -> pd.DataFrame:
    """The requests a rate counts: completed (outcome ok) requests of the hammer arm."""
    if frame.empty:
        return frame
    return frame[(frame["outcome"] == "ok") & (frame["arm"] == "hammer")]


def hit_counts(frame: pd.DataFrame) -> tuple[int, int]:
    """(corrupted hits, completed hits) of the hammer arm."""
    hits = counted(frame)
    hits = hits[hits["hit"].fillna(False).astype(bool)] if not hits.empty else hits
    return (int(hits["corrupted"].sum()), len(hits)) if not hits.empty else (0, 0)


def _split(frame: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """(corrupted, completed) for hits, cold requests and requests whose hit status is unknown."""
    rows = counted(frame)
    if rows.empty:
        return {"hit": (0, 0), "cold": (0, 0), "unknown": (0, 0)}
    kinds = rows["hit"].map(lambda h: "unknown" if pd.isna(h) else ("hit" if h else "cold"))
    return {kind: (int(rows.loc[kinds == kind, "corrupted"].sum()), int((kinds == kind).sum()))
            for kind in ("hit", "cold", "unknown")}


def _share(k: int, n: int, what: str, confidence: float) -> str:
    """E.g. "37 of 412 hits (9.0%, 95% Wilson CI 6.6–12.1%)"."""
    rate = wilson(k, n, confidence)
    return f"{k:,} of {n:,} {what} ({percent(rate.estimate)}, {interval_text(rate)})"


def _corrupted_sentence(split: dict[str, tuple[int, int]], confidence: float) -> str:
    (hit_k, hit_n), (cold_k, cold_n), (unknown_k, unknown_n) = split["hit"], split["cold"], split["unknown"]
    if hit_k and not cold_k:
        text = f"CORRUPTED: {_share(hit_k, hit_n, 'hits', confidence)}, only on hits (cold: 0 of {cold_n:,})"
    elif hit_k:
        text = (f"CORRUPTED: {_share(hit_k, hit_n, 'hits', confidence)}; also "
                f"{_share(cold_k, cold_n, 'cold requests', confidence)}")
    elif cold_k:
        text = f"CORRUPTED: {_share(cold_k, cold_n, 'cold requests', confidence)}, none of {hit_n:,} hits"
    else:
        text = f"CORRUPTED: none of {hit_n:,} hits or {cold_n:,} cold requests"
    if unknown_k:
        text += f"; {unknown_k:,} of {unknown_n:,} requests whose hit status was not reported"
    return text


def run_headline(frame: pd.DataFrame, confidence: float = 0.95) -> Headline:
    """The first line of a run's report."""
    split = _split(frame)
    if any(k for k, _ in split.values()):
        return Headline("CORRUPTED", _corrupted_sentence(split, confidence))
    completed = sum(n for _, n in split.values())
    hit_n = split["hit"][1]
    if not hit_n:
        return Headline("NO HITS", f"NO HITS: 0 corrupted of {completed:,} completed requests, none of them a "
                                   "cache hit: the hit path was not exercised, so nothing is claimed about it")
    bound = clopper_pearson(0, hit_n, confidence, "upper")
    return Headline("CLEAN", f"CLEAN: 0 corrupted of {hit_n:,} completed hits ({interval_text(bound)})")


def _sticky_note(frame: pd.DataFrame, confidence: float) -> str | None:
    """How the corrupted hits cluster by group, with the cluster-robust interval."""
    hits = counted(frame)
    hits = hits[hits["hit"].fillna(False).astype(bool)]
    if hits.empty or not hits["corrupted"].any():
        return None
    per_group = hits.groupby(hits["group"].fillna("(no group)"))["corrupted"].agg(["sum", "size"])
    clusters = cluster_rate(per_group["sum"].astype(int).tolist(), per_group["size"].astype(int).tolist(),
                            confidence)
    pooled = clusters.pooled
    return (f"Sticky: corrupted hits fall in {clusters.clusters.k} of {clusters.clusters.n} groups; treating each "
            f"group as a cluster, the hit rate {pooled.k}/{pooled.n} has a {interval_text(pooled)} "
            f"(design effect {clusters.design_effect:.3g}, worth {clusters.effective_n:.3g} independent requests).")


def _undecided(rows: pd.DataFrame) -> int:
    oracles = [name for name in ORACLES if name in rows]
    return int(rows[oracles].isin(UNDECIDED_LABELS).any(axis=1).sum()) if oracles and not rows.empty else 0


def run_notes(frame: pd.DataFrame, confidence: float = 0.95) -> list[str]:
    """The lines under the headline: what was counted, what was not, how failures cluster."""
    if frame.empty:
        return ["The history holds no requests (a run killed before its first request?)."]
    rows = counted(frame)
    hammer = frame[frame["arm"] == "hammer"]
    notes = [f"Counted: {len(rows):,} completed hammer-arm requests. Not counted: "
             f"{int(hammer['abandoned'].sum()):,} abandoned on purpose, "
             f"{int(((hammer['outcome'] != 'ok') & ~hammer['abandoned'].astype(bool)).sum()):,} failed or pending, "
             f"{int((frame['arm'] != 'hammer').sum()):,} cold controls (the reference)."]
    undecided = _undecided(rows)
    if undecided:
        notes.append(f"Undecided: {undecided:,} counted requests had an oracle that could not decide "
                     "(no control, or an oracle error); they count as not corrupted.")
    sticky = _sticky_note(frame, confidence)
    return notes + ([sticky] if sticky else [])


def comparison_headline(comparison: Comparison) -> Headline:
    """E.g. "FIXED: corrupted hits 3/30 before, 0/60 after (one-sided Fisher p = 0.0346 ≤ α = 0.05)"."""
    before, after, alpha = comparison.before, comparison.after, comparison.alpha
    counts = f"corrupted hits {before.k:,}/{before.n:,} before, {after.k:,}/{after.n:,} after"
    if comparison.verdict == "fixed":
        test = f"one-sided Fisher p = {comparison.fisher_p_lower:.3g} ≤ α = {alpha:g}"
    elif comparison.verdict == "regressed":
        test = f"one-sided Fisher p (after higher) = {comparison.fisher_p_higher:.3g} ≤ α = {alpha:g}"
    else:
        test = (f"one-sided Fisher p = {comparison.fisher_p_lower:.3g} > α = {alpha:g}: "
                "the difference could be chance")
    return Headline(comparison.verdict.upper(), f"{comparison.verdict.upper()}: {counts} ({test})")
