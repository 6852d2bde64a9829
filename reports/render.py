"""Reports of one or more runs, and of a before/after comparison: Markdown, HTML, CSV and PNGs.

    OUT/
      report.md  report.html     the verdict first, then tables, plots, attribution, how to reproduce
      requests.csv  rates.csv    the per-request table and the grouped rates (format "csv")
      requests.parquet  rates.parquet   the same, typed (format "parquet")
      *.png                      the plots (with "md" or "html"; report.html inlines them)

Everything is a pure function of run directories: nothing here runs a model or a target.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from forensics import RunDir
from reports.document import Code, Document, Heading, Image, Paragraph, Table, to_html, to_markdown
from reports.plots import plot_hit_vs_cold, plot_latency, plot_rates, plot_timeline
from reports.sections import attribution_blocks, corrupted_requests, rate_rows
from reports.stats import Comparison, compare
from reports.summary import comparison_headline, hit_counts, interval_text, percent, run_headline, run_notes
from reports.planning import clean_trials_to_show_fix
from reports.tables import export, load_run, rates

__all__ = ["FORMATS", "RATE_GROUPS", "compare_runs", "comparison_table", "p_value_table",
           "write_comparison_report", "write_run_report"]

FORMATS = ("md", "html", "csv", "parquet")
RATE_GROUPS = ("faults", "pattern", "family", "hit")


def _check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    formats = tuple(formats)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ValueError(f"formats must be some of {', '.join(FORMATS)}; got {', '.join(formats) or 'none'}")
    return formats


def _plots(frame: pd.DataFrame, out: Path, confidence: float) -> list[Image]:
    table = rates(frame, by=["faults", "pattern", "hit"], confidence=confidence)
    return [
        Image(plot_rates(table, out / "rates.png", confidence=confidence),
              f"Corruption rate by fault × pattern, hits and cold apart; bars are {confidence:.0%} Wilson intervals, "
              "labels k/n (corrupted / completed hammer requests)."),
        Image(plot_hit_vs_cold(frame, out / "hit_vs_cold.png", confidence=confidence),
              "Hits vs cold requests per fault setting: the seeds' signature is corruption on hits only."),
        Image(plot_timeline(frame, out / "timeline.png"),
              "Per-branch timeline: one row per group (branch), one mark per hammer request in the order sent; "
              "filled marks are hits, hollow ones cold; red crosses are corrupted."),
        Image(plot_latency(frame, out / "latency.png"), "Latency and TTFT of completed hammer requests (context)."),
    ]


def _reproduce(run: RunDir) -> list:
    meta = run.meta
    seeds = ", ".join(f"{role}={seed}" for role, seed in sorted(meta.seeds.items())) or "none recorded"
    patterns = "; ".join(f"{p['name']} {json.dumps(dict(p.get('settings', {})), sort_keys=True)}"
                         for p in meta.patterns) or "none recorded"
    command = shlex.join(meta.command) if meta.command else "(meta.json records no command)"
    return [Heading(f"Run {run.path.name}", 3),
            Paragraph(f"Target {json.dumps(dict(meta.target), sort_keys=True)}; faults "
                      f"{', '.join(meta.faults) or 'none'}; seeds {seeds}; patterns {patterns}; started "
                      f"{meta.start_time}, ended {meta.end_time or 'not recorded (still running, or killed)'}; "
                      f"tool {meta.tool_version}, schema {meta.schema_version}."),
            Code(f"{command}\n# report it again:\nhammer report {shlex.quote(str(run.path))}")]


def _run_document(runs: Sequence[RunDir], frame: pd.DataFrame, images: list[Image], confidence: float) -> Document:
    blocks: list = []
    for run in runs:
        own = frame[frame["run"] == run.path.resolve().name] if not frame.empty else frame
        headline = run_headline(own, confidence)
        if len(runs) > 1:
            headline = type(headline)(headline.status, f"{headline.text} — run {run.path.name}")
        blocks += [headline, *map(Paragraph, run_notes(own, confidence))]
    blocks += [Heading("Corruption rates"),
               Table(rate_rows(rates(frame, by=RATE_GROUPS, confidence=confidence)),
                     f"k = corrupted, n = completed hammer-arm requests per fault × pattern × probe family × hit; "
                     f"two-sided {confidence:.0%} intervals: Wilson score and Clopper-Pearson exact."),
               Heading("Plots"), *images,
               Heading("Corrupted requests"), corrupted_requests(frame),
               Heading("Attribution and hypotheses")]
    for run in runs:
        blocks += attribution_blocks(run.path, titled=len(runs) > 1)
    blocks.append(Heading("Reproduce"))
    for run in runs:
        blocks += _reproduce(run)
    title = "Hit-corruption report: " + ", ".join(run.path.name for run in runs)
    return Document(title, tuple(blocks))


def _write(document: Document, out: Path, formats: tuple[str, ...]) -> dict[str, Path]:
    written = {}
    if "md" in formats:
        written["md"] = out / "report.md"
        written["md"].write_text(to_markdown(document), encoding="utf-8")
    if "html" in formats:
        written["html"] = out / "report.html"
        written["html"].write_text(to_html(document), encoding="utf-8")
    return written


def write_run_report(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *,
                     formats: Iterable[str] = FORMATS, confidence: float = 0.95) -> dict[str, Path]:
    """Write the report of the runs at ``paths`` into ``out``; returns {kind: path} of what it wrote."""
    formats = _check_formats(formats)
    runs = [RunDir.open(Path(path).resolve()) for path in paths]  # ROOT/last: name the run itself
    frames = [load_run(run.path) for run in runs]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    tables = {"requests": frame, "rates": rates(frame, by=RATE_GROUPS, confidence=confidence)}
    for suffix in {"csv", "parquet"} & set(formats):
        for name, table in tables.items():
            written[f"{name}.{suffix}"] = export(table, out / f"{name}.{suffix}")
    if {"md", "html"} & set(formats):
        images = _plots(frame, out, confidence)
        written.update({image.path.name: image.path for image in images})
        written.update(_write(_run_document(runs, frame, images, confidence), out, formats))
    return written


def compare_runs(before: pd.DataFrame, after: pd.DataFrame, confidence: float = 0.95) -> Comparison:
    """Corrupted hits of two per-request tables compared at alpha = 1 - confidence."""
    return compare(*hit_counts(before), *hit_counts(after), alpha=1 - confidence)


def _p(value: float | None) -> str:
    return "skipped (table too large)" if value is None else f"{value:.3g}"


def comparison_table(comparison: Comparison, names: Sequence[str] = ("before", "after")) -> pd.DataFrame:
    """Both arms' corrupted hits with their Wilson intervals, one row each."""
    rows = []
    for arm, name, rate in zip(("before", "after"), names, (comparison.before, comparison.after)):
        rows.append({"arm": arm, "run": name, "corrupted hits (k)": rate.k, "completed hits (n)": rate.n,
                     "rate": percent(rate.estimate), "interval": interval_text(rate) if rate.n else "no hits"})
    return pd.DataFrame(rows)


def p_value_table(comparison: Comparison) -> pd.DataFrame:
    """Every test's p-value, and which one the verdict follows."""
    rows = [("Fisher exact", "after lower (one-sided)", _p(comparison.fisher_p_lower), "verdict: fixed"),
            ("Fisher exact", "after higher (one-sided)", _p(comparison.fisher_p_higher), "verdict: regressed"),
            ("Fisher exact", "two-sided", _p(comparison.fisher_p_two_sided), "context"),
            ("Barnard exact", "after lower (one-sided)", _p(comparison.barnard_p_lower), "context, not a fix claim"),
            ("Boschloo exact", "after lower (one-sided)", _p(comparison.boschloo_p_lower), "context, not a fix claim")]
    return pd.DataFrame(rows, columns=["test", "alternative", "p-value", "role"])


def _needed_note(comparison: Comparison) -> str:
    before = comparison.before
    needed = clean_trials_to_show_fix(before.k, before.n, comparison.alpha)
    if needed is None:
        return "Before has no corrupted hit: there is nothing a fix could be shown to remove."
    return (f"With {before.k}/{before.n} corrupted hits before, one-sided Fisher calls a fix at α = "
            f"{comparison.alpha:g} only after at least {needed:,} clean after-hits (0/{needed:,}).")


def _comparison_document(runs: Sequence[RunDir], comparison: Comparison, image: Image | None,
                         confidence: float) -> Document:
    names = [run.path.name for run in runs]
    blocks = [comparison_headline(comparison),
              Paragraph(f"Counted: completed hammer-arm hits of each run; k = corrupted. Rates with two-sided "
                        f"{confidence:.0%} Wilson intervals; the verdict follows one-sided Fisher at α = "
                        f"{comparison.alpha:g}, exact and conservative."),
              Table(comparison_table(comparison, names), "Corrupted hits, before and after"),
              Table(p_value_table(comparison), "p-values (2×2 table: corrupted / clean × before / after)"),
              Paragraph(_needed_note(comparison)), *([image] if image else []), Heading("Reproduce"),
              Code(f"hammer compare {shlex.join(str(run.path) for run in runs)} --confidence {confidence:g}")]
    for run in runs:
        blocks += _reproduce(run)
    return Document(f"Before/after: {names[0]} → {names[1]}", tuple(blocks))


def write_comparison_report(before: str | os.PathLike, after: str | os.PathLike, out: str | os.PathLike, *,
                            formats: Iterable[str] = ("md", "html"),
                            confidence: float = 0.95) -> tuple[Comparison, dict[str, Path]]:
    """Compare two runs' corrupted hits and write the report; returns the comparison and what was written."""
    formats = _check_formats(formats)
    runs = [RunDir.open(Path(path).resolve()) for path in (before, after)]
    frames = [load_run(run.path) for run in runs]
    comparison = compare_runs(*frames, confidence=confidence)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if "csv" in formats:
        table = comparison_table(comparison, [run.path.name for run in runs])
        written["comparison.csv"] = export(table, out / "comparison.csv")
    if {"md", "html"} & set(formats):
        order = {run.path.name: i for i, run in enumerate(runs)}
        both = rates(pd.concat(frames, ignore_index=True), by=["run", "hit"], confidence=confidence)
        both = both.sort_values("run", key=lambda names: names.map(order), kind="stable")
        image = Image(plot_rates(both, out / "compare.png", label_by=["run"], confidence=confidence,
                                 title="Before and after"),
                      f"Corruption on hits and cold requests, before and after; {confidence:.0%} Wilson intervals.")
        written["compare.png"] = image.path
        written.update(_write(_comparison_document(runs, comparison, image, confidence), out, formats))
    return comparison, written
