"""reports.cli: report / compare / plan print and write the right verdicts and numbers, with the promised exit codes."""

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from reports.cli import compare_command, plan_command, report_command
from reports.planning import clean_trials_to_show_fix, fisher_power, requests_to_distinguish
from reports.stats import compare
from tests.harness.test_report_render import counted_run

# (before k/n, after k/n, one-sided Fisher p, verdict): the seeds' own figures (tests/unit/test_stats.py).
SEED_FIGURES = [((3, 30), (0, 60), 0.0346, "fixed"),
                ((2, 24), (0, 48), 0.108, "not shown fixed"),
                ((2, 20), (0, 20), 0.24, "not shown fixed")]


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize(("before", "after", "p", "verdict"), SEED_FIGURES)
def test_compare_on_the_seeds_figures(tmp_path, before, after, p, verdict):
    """Runs with the seeds' before/after corrupted-hit counts get the verdict, p-value and exit code they support."""
    before_dir = counted_run(tmp_path, "before", hits=before[1], corrupted=before[0], faults=("donate=transfer",))
    after_dir = counted_run(tmp_path, "after", hits=after[1], corrupted=after[0])
    result = invoke(compare_command, before_dir, after_dir, "--out", tmp_path / "cmp")
    assert result.exit_code == (0 if verdict == "fixed" else 1), result.output
    assert result.output.splitlines()[-2] == f"verdict: {verdict}"
    assert f"corrupted hits {before[0]}/{before[1]} before, {after[0]}/{after[1]} after" in result.output
    assert f"one-sided Fisher p = {p:.3g}" in result.output
    assert result.output.startswith(verdict.upper())
    assert (tmp_path / "cmp" / "report.md").read_text().splitlines()[2].startswith(f"**{verdict.upper()}")


def test_compare_says_regressed_when_after_is_worse(tmp_path):
    """0/20 before and 8/20 after is a regression: verdict "regressed", exit 1, report written under AFTER_DIR."""
    before_dir = counted_run(tmp_path, "before", hits=20, corrupted=0)
    after_dir = counted_run(tmp_path, "after", hits=20, corrupted=8)
    result = invoke(compare_command, before_dir, after_dir)
    assert result.exit_code == 1 and "verdict: regressed" in result.output
    assert (after_dir / "report" / "compare" / "report.html").exists()


def test_compare_bad_input_exits_2_naming_it(tmp_path):
    """A folder that is not a run, or a confidence out of range, is a usage error (exit 2) that names the culprit."""
    run = counted_run(tmp_path, "run", hits=2, corrupted=0)
    (tmp_path / "empty").mkdir()
    not_a_run = invoke(compare_command, run, tmp_path / "empty")
    assert not_a_run.exit_code == 2 and "AFTER_DIR" in not_a_run.output and "not a run directory" in not_a_run.output
    bad_confidence = invoke(compare_command, run, run, "--confidence", 1.5)
    assert bad_confidence.exit_code == 2 and "--confidence" in bad_confidence.output


def test_report_writes_every_format_into_run_dir_report(tmp_path):
    """`report RUN_DIR` writes md, html, both CSVs and the PNGs into RUN_DIR/report/ and prints the verdict."""
    run = counted_run(tmp_path, "run", hits=12, corrupted=2, faults=("track_writer=off",))
    result = invoke(report_command, run)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("run: CORRUPTED: 2 of 12 hits")
    names = {p.name for p in (run / "report").iterdir()}
    assert {"report.md", "report.html", "requests.csv", "rates.csv", "rates.png", "timeline.png"} <= names


def test_report_options_are_checked(tmp_path):
    """--format takes only md,html,csv (md alone writes no HTML or CSV); several runs need --out."""
    run = counted_run(tmp_path, "run", hits=3, corrupted=0)
    bad = invoke(report_command, run, "--format", "pdf")
    assert bad.exit_code == 2 and "--format" in bad.output
    assert invoke(report_command, run, "--format", "md", "--out", tmp_path / "md").exit_code == 0
    assert not {"report.html", "requests.csv"} & {p.name for p in (tmp_path / "md").iterdir()}
    several = invoke(report_command, run, run)
    assert several.exit_code == 2 and "--out" in several.output


@pytest.mark.parametrize(("rate", "confidence", "n"), [(0.1, 0.95, 29), (0.1, 0.99, 44), (0.03, 0.95, 99)])
def test_plan_prints_the_clean_trials_needed(rate, confidence, n):
    """`plan` prints n = ceil(ln alpha / ln(1 - p)) clean trials to claim a fix, and the same n to detect."""
    assert n == math.ceil(math.log(1 - confidence) / math.log(1 - rate))
    result = invoke(plan_command, "--base-rate", rate, "--confidence", confidence)
    assert result.exit_code == 0
    assert f"clean trials to claim a fix: {n} " in result.output
    assert f"requests to detect the fault: {n} " in result.output


def test_plan_rejects_a_rate_outside_0_1():
    """A base rate of 0 or above 1 is a click error naming --base-rate."""
    for rate in (0, 1.5):
        result = invoke(plan_command, "--base-rate", rate)
        assert result.exit_code == 2 and "--base-rate" in result.output


def test_telling_two_rates_apart_and_clean_trials_after_a_measured_rate():
    """n per arm to tell 10% from 3% reaches 80% exact power where n - 1 does not; 0/68 after 2/20 is the first fix."""
    n = requests_to_distinguish(0.10, 0.03)
    assert fisher_power(0.10, 0.03, n) >= 0.8 > fisher_power(0.10, 0.03, n - 1)
    assert f"requests per arm to tell 0.1 from 0.03: {n} " in invoke(
        plan_command, "--base-rate", 0.1, "--after-rate", 0.03).output
    needed = clean_trials_to_show_fix(2, 20)
    assert compare(2, 20, 0, needed).verdict == "fixed" and compare(2, 20, 0, needed - 1).verdict == "not shown fixed"


def test_the_seeds_statistics_page_quotes_the_code():
    """Every before/after row of docs/seeds-statistics.md is what compare() and clean_trials_to_show_fix() give."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "seeds-statistics.md").read_text()
    for (bk, bn), (ak, an) in [((3, 30), (0, 60)), ((2, 24), (0, 48)), ((2, 20), (0, 20)), ((16, 288), (0, 288))]:
        c = compare(bk, bn, ak, an)
        p_values = (c.fisher_p_lower, c.fisher_p_two_sided, c.barnard_p_lower, c.boschloo_p_lower)
        row = (f"| {bk}/{bn} | {ak}/{an} | " + " | ".join(f"{p:.3g}" for p in p_values)
               + f" | {c.verdict} | {clean_trials_to_show_fix(bk, bn)} |")
        assert row in page
