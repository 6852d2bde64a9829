"""``report``, ``compare`` and ``plan``: click commands for the ``hammer`` CLI to mount
(``main.add_command(report_command)``); ``python -m reports`` runs them standalone.

Exit codes: ``compare`` exits 0 when the fix is shown, 1 when it is not shown or the rate rose,
2 on bad input (click's usage-error code). ``report`` and ``plan`` exit 0 unless the input is bad.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from forensics import RunDir, SchemaError
from reports.planning import fisher_power, requests_to_distinguish
from reports.render import FORMATS, comparison_table, p_value_table, write_comparison_report, write_run_report
from reports.stats import detection_probability, requests_to_detect, trials_to_claim_fix
from reports.summary import comparison_headline, run_headline
from reports.tables import load_run

__all__ = ["COMMANDS", "compare_command", "plan_command", "report_command"]

EXIT_FIXED, EXIT_NOT_FIXED = 0, 1
RunPath = click.Path(exists=True, file_okay=False, path_type=Path)
OutPath = click.Path(file_okay=False, path_type=Path)
Confidence = click.FloatRange(0.5, 1.0, max_open=True)


def _open_run(path: Path, name: str) -> RunDir:
    """The run directory at ``path``, or a click error naming the argument."""
    try:
        return RunDir.open(path.resolve())
    except (FileNotFoundError, SchemaError, ValueError) as error:
        raise click.BadParameter(str(error), param_hint=name) from error


def _formats(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    formats = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise click.BadParameter(f"use a comma-separated subset of {','.join(FORMATS)}; got {value!r}")
    return formats


@click.command("report")
@click.argument("run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=RunPath)
@click.option("--out", type=OutPath, default=None,
              help="Folder for the report (default: RUN_DIR/report/ for one run; required for several).")
@click.option("--format", "formats", default=",".join(FORMATS), show_default=True, callback=_formats,
              help="Comma-separated outputs: md (report.md), html (report.html), csv (requests.csv, rates.csv), "
                   "parquet (requests.parquet, rates.parquet).")
@click.option("--confidence", type=Confidence, default=0.95, show_default=True, help="Interval confidence.")
def report_command(run_dirs: tuple[Path, ...], out: Path | None, formats: tuple[str, ...],
                   confidence: float) -> None:
    """Write the hit-corruption report of one or more run directories: the verdict first, rates with
    intervals, the corrupted requests, plots, attribution and how to reproduce."""
    runs = [_open_run(path, "RUN_DIR") for path in run_dirs]
    if out is None and len(runs) > 1:
        raise click.UsageError("--out is required when reporting more than one RUN_DIR")
    out = out or runs[0].path / "report"
    for run in runs:
        click.echo(f"{run.path.name}: {run_headline(load_run(run.path), confidence).text}")
    written = write_run_report([run.path for run in runs], out, formats=formats, confidence=confidence)
    click.echo(f"wrote {', '.join(sorted(p.name for p in written.values()))} to {out}")


@click.command("compare")
@click.argument("before_dir", type=RunPath)
@click.argument("after_dir", type=RunPath)
@click.option("--confidence", type=Confidence, default=0.95, show_default=True,
              help="1 - alpha of the one-sided Fisher test the verdict follows.")
@click.option("--out", type=OutPath, default=None, help="Folder for the report (default: AFTER_DIR/report/compare/).")
def compare_command(before_dir: Path, after_dir: Path, confidence: float, out: Path | None) -> None:
    """Did the corrupted-hit rate fall from BEFORE_DIR to AFTER_DIR by more than chance?
    Exits 0 for "fixed", 1 for "not shown fixed" or "regressed", 2 on bad input."""
    before, after = _open_run(before_dir, "BEFORE_DIR"), _open_run(after_dir, "AFTER_DIR")
    out = out or after.path / "report" / "compare"
    comparison, written = write_comparison_report(before.path, after.path, out, formats=("md", "html", "csv"),
                                                  confidence=confidence)
    click.echo(comparison_headline(comparison).text)
    click.echo(comparison_table(comparison, [before.path.name, after.path.name]).to_string(index=False))
    click.echo(p_value_table(comparison).to_string(index=False))
    click.echo(f"verdict: {comparison.verdict}")
    click.echo(f"wrote {', '.join(sorted(p.name for p in written.values()))} to {out}")
    raise SystemExit(EXIT_FIXED if comparison.verdict == "fixed" else EXIT_NOT_FIXED)


def plan_lines(base_rate: float, confidence: float, after_rate: float | None, power: float) -> list[str]:
    """What ``plan`` prints: trials to claim a fix, requests to detect, and optionally to tell two rates apart."""
    alpha = 1 - confidence
    n_fix = trials_to_claim_fix(base_rate, confidence)
    n_detect = requests_to_detect(base_rate, confidence)
    ratio = math.log(alpha) / math.log1p(-base_rate) if base_rate < 1 else 1.0
    lines = [
        f"base rate p = {base_rate:g} (taken as known), confidence {confidence:g} (alpha = {alpha:.3g})",
        f"clean trials to claim a fix: {n_fix} (n = ceil(ln alpha / ln(1 - p)) = ceil({ratio:.4g})): "
        f"an engine still broken at p passes {n_fix} trials with probability "
        f"{1 - detection_probability(base_rate, n_fix):.3g} <= {alpha:.3g}",
        f"requests to detect the fault: {n_detect} (at least one corrupted with probability "
        f"{detection_probability(base_rate, n_detect):.3g} >= {confidence:g})",
        "if p was itself measured on a few trials, use `compare` on the two runs instead",
    ]
    if after_rate is not None:
        n_arm = requests_to_distinguish(base_rate, after_rate, alpha, power)
        if n_arm is None:
            lines.append(f"requests per arm to tell {base_rate:g} from {after_rate:g}: none up to 100,000 "
                         "(the after rate must be lower than the base rate)")
        else:
            reached = fisher_power(base_rate, after_rate, n_arm, alpha)
            lines.append(f"requests per arm to tell {base_rate:g} from {after_rate:g}: {n_arm} (exact power of "
                         f"one-sided Fisher at alpha {alpha:.3g}: {reached:.3g} >= {power:g})")
    return lines


@click.command("plan")
@click.option("--base-rate", type=click.FloatRange(0.0, 1.0, min_open=True), required=True,
              help="The fault's corrupted-hit rate, e.g. 0.1 for ~10% of hits.")
@click.option("--confidence", type=Confidence, default=0.95, show_default=True, help="1 - alpha.")
@click.option("--after-rate", type=click.FloatRange(0.0, 1.0, max_open=True), default=None,
              help="Also: requests per arm to tell --base-rate from this lower rate (e.g. a partial fix).")
@click.option("--power", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=0.8,
              show_default=True, help="Power wanted with --after-rate.")
def plan_command(base_rate: float, confidence: float, after_rate: float | None, power: float) -> None:
    """How many clean trials prove a fix at base rate P, and how many requests detect it."""
    for line in plan_lines(base_rate, confidence, after_rate, power):
        click.echo(line)


COMMANDS = (report_command, compare_command, plan_command)
