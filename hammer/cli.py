"""``hammer``: the harness's command line (DESIGN.md §5), the top floor: it may import everything.

    hammer soak [--requests N | --duration 10m] [--pattern P ...]     rounds of patterns, verdicts, summary
    hammer run PATTERN [--count N] [--set key=value ...]               one round of one pattern
    hammer probe FAMILY [--count N]                                    probes of one family, cold then hit
    hammer analyze RUN_DIR                                             re-judge a stored (even killed) run
    hammer replay RUN_DIR [--request ID]                               re-execute an embedded run, compare tokens

Every running command takes ``--target embedded`` (the in-process engine, default) or
``--target http://HOST:PORT`` (any OpenAI-compatible server); nothing else changes with it.
Exit codes everywhere: 0 clean, 1 corrupted hits above --max-rate (or any corrupted cold request),
2 harness error (bad option, unreachable target, crash).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from hammer import __version__
from hammer.cli_options import (
    DEFAULT_PATTERNS,
    DEVICE_OPTION,
    DEVICE_SEED_OPTION,
    DTYPE_OPTION,
    MODEL_OPTION,
    REPORT_OPTION,
    check_device,
    check_model,
    duration,
    parse_settings,
    run_options,
    split_options,
)

__all__ = ["main"]

class _Commands(click.Group):
    """The group, plus ``report / compare / plan`` from reports.cli, imported only when asked for
    (they pull pandas, scipy and matplotlib; ``hammer soak --help`` should not wait for them)."""

    REPORTS = ("compare", "plan", "report")

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.REPORTS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.REPORTS and name not in self.commands:
            from reports.cli import COMMANDS

            for command in COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hammer")
def main() -> None:
    """Hammer an inference engine's prefix cache and attribute every wrong answer on a hit.

    Runs write a run directory (runs/<time>-<id>, runs/last): meta.json, history.jsonl, ledger.jsonl
    (embedded), summary.json and attribution.json.
    """


@main.command()
@run_options
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Stop after this many hammer requests.")
@click.option("--duration", callback=duration, default=None, help="Or stop after this long (e.g. 90s, 10m, 2h).")
@click.option("--pattern", "patterns", multiple=True, metavar="NAME",
              help="Pattern(s), round robin (repeatable; default: seven, follow-up among them).")
@click.option("--round-size", type=click.IntRange(min=1), default=24, show_default=True, help="Hammer ops per round.")
@click.option("--set", "settings", multiple=True, callback=parse_settings, metavar="KEY=VALUE",
              help="A pattern setting, given to every pattern of the soak (repeatable).")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Continue a stored soak (same seeds and plan, next round).")
def soak(patterns, requests, duration, round_size, settings, resume, **options):
    """Rounds of load patterns with their cold controls until --requests or --duration; then verdicts."""
    if requests is None and duration is None:
        requests = 240
    _execute(options, patterns or DEFAULT_PATTERNS, requests, duration, round_size, settings, resume)


@main.command("run")
@run_options
@click.argument("pattern")
@click.option("--count", type=click.IntRange(min=1), default=24, show_default=True, help="Hammer requests.")
@click.option("--set", "settings", multiple=True, callback=parse_settings, metavar="KEY=VALUE",
              help="A setting of the pattern (repeatable), e.g. --set abandon_after=3.")
def run_pattern(pattern, count, settings, **options):
    """One round of one PATTERN (and its controls)."""
    _execute(options, (pattern,), count, None, count, settings, None)


@main.command()
@run_options
@click.argument("family")
@click.option("--count", type=click.IntRange(min=1), default=16, show_default=True,
              help="Hammer requests (each probe asked twice: cold, then a hit).")
def probe(family, count, **options):
    """Probes of one FAMILY (arithmetic, needle, recall, media) through the target."""
    _execute(options, (f"probe:{family}",), count, None, count, (), None)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--max-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--ledger-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="[http] The server's slot ledger (its log's LEDGER lines, or JSON rows: *.jsonl), attached to the "
                   "run first (rows renamed by the request ids the server echoed).")
@click.option("--control-ledger-log", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="[http] The control server's, likewise (with --ledger-log).")
@REPORT_OPTION
def analyze(run_dir, max_rate, junit, ledger_log, control_ledger_log, report):
    """Re-run the checkers and the attribution on a stored (possibly partial) run directory.

    An HTTP run gets its attribution from the server's own ledger: --ledger-log (and --control-ledger-log)."""
    from hammer.soak import judge, write_junit

    if control_ledger_log is not None and ledger_log is None:
        raise click.BadParameter("give the hammer server's ledger too (--ledger-log)", param_hint="--control-ledger-log")
    if ledger_log is not None:
        from hammer.ledger_logs import attach_ledger_logs

        try:
            counts = attach_ledger_logs(run_dir, ledger_log, control_ledger_log)
        except ValueError as err:  # a SchemaError too: it names the line
            raise click.BadParameter(str(err), param_hint="--ledger-log") from None
        click.echo("ledger attached: " + ", ".join(f"{k} {v}" for k, v in counts.items()))

    analysis, summary, code = judge(run_dir, max_rate=max_rate)
    if junit:
        write_junit(analysis, junit)
    _print_summary(summary)
    if report:
        _write_report(run_dir)
    sys.exit(code)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--request", default=None, metavar="ID", help="Replay only this request's round; compare only it.")
def replay(run_dir, request):
    """Re-execute an embedded run from its meta.json and check every streamed token is identical.

    Tokens are also checked against the logits they were sampled from, where the engine reports them; a
    difference names the request, the token and where its live state parted from the stored run's."""
    from hammer.replay import replay_run

    try:
        first_difference = replay_run(run_dir, request=request)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    what = f"request {request} of {run_dir}" if request else str(run_dir)
    if first_difference is None:
        click.echo(f"replay of {what}: every token identical")
        sys.exit(0)
    click.echo(f"replay of {what} differs: {first_difference}")
    sys.exit(1)


@main.command()
@click.argument("first_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("second_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--request", default=None, metavar="ID", help="Compare only this request (and its choices).")
def diff(first_dir, second_dir, request):
    """Did two runs of one schedule stream the same tokens? (The same engine on the sim and on a GPU, two builds.)

    Runs of one schedule share their patterns, seed and rounds (``--seed``); their targets may differ. Exit 0
    when every request both finished streamed the same tokens (and logits, where both report them), else 1
    naming the first that differs and where its live state parted (both runs with a ledger)."""
    from hammer.replay import diff_runs

    try:
        first_difference = diff_runs(first_dir, second_dir, request=request)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if first_difference is None:
        click.echo(f"{first_dir} and {second_dir}: every token identical")
        sys.exit(0)
    click.echo(f"{first_dir} and {second_dir} differ: {first_difference}")
    sys.exit(1)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the case goes (default RUN_DIR/shrunk).")
@click.option("--verdict", default=None, metavar="VERDICT", help="Shrink the first failure with this verdict.")
@click.option("--max-trials", type=click.IntRange(min=1), default=300, show_default=True,
              help="Candidate schedules to run at most.")
@click.option("--budget", callback=duration, default="10m", show_default=True, help="Time to search at most.")
def shrink(run_dir, out, verdict, max_trials, budget):
    """Delta-debug an embedded run's failing round to a minimal schedule that fails the same way.

    Writes case.json, a runnable pytest file (it fails while the bug is there) and the case's own run
    directory."""
    from hammer.shrink import shrink_run, write_case

    try:
        result = shrink_run(run_dir, verdict=verdict, max_trials=max_trials, budget=budget,
                            log=lambda line: click.echo(f"  {line}", err=True))
    except (ValueError, FileNotFoundError) as err:
        raise click.UsageError(str(err)) from None
    written = write_case(result, out or Path(run_dir) / "shrunk")
    click.echo(f"shrunk {result.original} -> {len(result.case.ops)} request(s) failing with {result.case.verdict} "
               f"in {result.trials} trials ({result.seconds:.0f} s)")
    for step in result.steps:
        click.echo(f"  {step}")
    for name in ("test", "case", "run"):
        click.echo(f"{name}: {written[name]}")


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--max-rows", type=click.IntRange(min=1), default=60, show_default=True,
              help="Ledger rows per slot life story.")
@REPORT_OPTION
def postmortem(run_dir, max_rows, report):
    """Attribution, hypotheses, sticky-window timelines and slot life stories of a run, as text.

    Writes RUN_DIR/postmortem.txt and postmortem.json; the run is analysed again first (as by
    `hammer analyze`), so the post-mortem and summary.json always agree."""
    from forensics.postmortem import write_postmortem
    from hammer.soak import judge

    try:
        analysis, _, _ = judge(run_dir)
        fired = {row.request: row.fired for row in analysis.corrupted}
        text, _ = write_postmortem(run_dir, fired=fired, max_rows=max_rows)
    except (ValueError, FileNotFoundError) as err:
        raise click.UsageError(str(err)) from None
    click.echo(text, nl=False)
    if report:
        _write_report(run_dir)


@main.command()
@click.option("--faults", "names", multiple=True, metavar="CELL",
              help="Cells to run (repeatable or comma-separated): faults of the catalogue, extra faults, 'clean'. "
                   "Default: the catalogue and clean.")
@click.option("--budget", callback=duration, default="30s", show_default=True, help="Time per cell.")
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Bound each cell by hammer requests instead of time (deterministic).")
@click.option("--quick", is_flag=True, help="Each cell its own small request count (the CI-sized matrix).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the cells' run directories and the combined report go (default runs/matrix-<time>).")
@MODEL_OPTION
@DEVICE_OPTION
@DEVICE_SEED_OPTION
@DTYPE_OPTION
@REPORT_OPTION
def faults(names, budget, requests, quick, seed, out, model, device, device_seed, dtype, report):
    """Run every fault (and the clean engine) against the patterns that should expose it; print one table.

    Exit 0 when every fault was detected and attributed correctly and the clean cell found nothing,
    1 otherwise, 2 on bad input."""
    from hammer.matrix import run_matrix, select

    if quick and requests:
        raise click.BadParameter("--quick sets the request counts; give one of --quick and --requests",
                                 param_hint="--quick")
    check_device(device)
    check_model(model)
    try:
        cells = select([n for name in names for n in name.split(",") if n])
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--faults") from None
    out = out or Path("runs") / f"matrix-{time.strftime('%Y%m%dT%H%M%S')}"
    bound = "quick request counts" if quick else f"{requests} requests" if requests else f"{budget:.0f} s"
    click.echo(f"hammer faults: {len(cells)} cell(s), {bound} each, seed {seed} -> {out}")
    try:
        matrix_json = run_matrix(cells, out, seed=seed, budget=None if requests or quick else budget,
                                 requests=requests, quick=quick, model=model, device=device,
                                 device_seed=device_seed, dtype=dtype, echo=click.echo)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    sys.exit(_matrix_report(matrix_json, report))


def _matrix_report(matrix_json: Path, report: bool) -> int:
    from hammer.junit import Case, write_suite
    from reports.matrix import matrix_cases, matrix_rows, matrix_verdict, render_matrix
    from reports.render import write_run_report

    rows = matrix_rows(matrix_json)
    code, problems = matrix_verdict(rows)
    (matrix_json.parent / "matrix.md").write_text(render_matrix(rows, markdown=True))
    cases = [Case("faults", cell, failure, run, seconds) for cell, failure, run, seconds in matrix_cases(rows)]
    write_suite("hammer-faults", cases, matrix_json.parent / "junit.xml")
    (matrix_json.parent / "matrix_rows.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    if report:
        write_run_report([row["run"] for row in rows], matrix_json.parent / "report")
    click.echo(render_matrix(rows), nl=False)
    click.echo("\n".join(problems) if problems else "every fault detected and attributed; the clean engine is clean")
    return code


def _execute(options, patterns, requests, duration, round_size, settings, resume):
    from forensics import RunDir, resolve_run
    from hammer.progress import Progress
    from hammer.runs import execute
    from hammer.soak import SoakPlan
    from hammer.targets import TargetUnavailable

    engine, http = split_options(options)
    seed = options["seed"]
    try:
        if seed == "last":
            seed = int(RunDir.open(resolve_run(options["out"], "last")).meta.seeds["pattern"])
        plan = None if resume else SoakPlan(tuple(patterns), int(seed), round_size=round_size, requests=requests,
                                            duration=duration, settings=settings, concurrency=options["concurrency"])
        with Progress(total=requests) as progress:
            run_dir, code, summary = execute(target=options["target"], plan=plan, out=options["out"], engine=engine,
                                             http=http, resume=resume, max_rate=options["max_rate"],
                                             junit=options["junit"], command=tuple(sys.argv), echo=click.echo,
                                             progress=progress)
    except (ValueError, FileNotFoundError) as err:
        raise click.UsageError(str(err)) from None
    except TargetUnavailable as err:
        click.echo(f"Error: --target {options['target']}: {err}", err=True)
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 -- a harness crash is exit 2, whatever it was; the run dir keeps the rest
        click.echo(f"harness error: {type(err).__name__}: {err} (what was written so far stays in the run "
                   "directory: `hammer analyze` it)", err=True)
        sys.exit(2)
    _print_summary(summary)
    if options["report"]:
        _write_report(run_dir)
    sys.exit(code)


def _write_report(run_dir: Path) -> None:
    """RUN_DIR/report/: what ``hammer report RUN_DIR`` writes. A failure here loses no verdict (summary.json
    is already written) and does not change the exit code; it is reported."""
    from reports.render import write_run_report

    try:
        written = write_run_report([run_dir], Path(run_dir) / "report")
    except Exception as err:  # noqa: BLE001 -- the verdicts stand without their report
        click.echo(f"report not written: {type(err).__name__}: {err} (retry with `hammer report {run_dir}`)", err=True)
        return
    click.echo(f"report: {written.get('html', written.get('md'))}")


def _print_summary(summary: dict) -> None:
    from forensics.attribute import unlanded_note
    from reports.stats import wilson

    c = summary["counts"]
    hits, bad = c.get("hits", 0), c.get("corrupted_hits", 0)
    upper = wilson(bad, hits, sided="upper").upper if hits else 1.0
    verdict = {0: "CLEAN", 1: "CORRUPTED", 2: "HARNESS ERROR"}[summary["exit_code"]]
    if summary["valid"] == "unknown" and summary["exit_code"] == 0:
        anomalies = summary.get("anomalies") or []
        why = f"{c.get('unknown', 0)} request(s) not judged, {len(anomalies)} anomalies"
        verdict += f" but unknown: {why}" + (f", e.g. {anomalies[0]}" if anomalies else "")
    unreported = c.get("hits_unreported", 0)
    shown = hits if not unreported else (
        f"{hits}; {unreported} completed request(s) report no cached_tokens, hit or miss unknown (a server "
        "reports it in usage.prompt_tokens_details; vLLM: --enable-prompt-tokens-details)")
    rows = [("requests", c.get("requests", 0)), ("hammer / control", f"{c.get('hammer', 0)} / {c.get('controls', 0)}"),
            ("completed", c.get("completed", 0)), ("hits", shown),
            ("hit rate", f"{hits / max(1, c.get('completed', 0)):.1%}"), ("abandoned", c.get("abandoned", 0)),
            ("corrupted", c.get("corrupted", 0)), ("corrupted hits", bad),
            ("corrupted-hit rate", f"{summary['corrupted_hit_rate']:.2%} (95% Wilson upper bound {upper:.2%})"),
            ("attribution", ", ".join(f"{k}: {v}" for k, v in summary["attribution"].items()) or "-"),
            *([("ledger", unlanded_note(summary["ledger_unlanded"]))] if summary.get("ledger_unlanded") else []),
            ("verdict", verdict)]
    width = max(len(k) for k, _ in rows)
    click.echo("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    click.echo(f"run directory: {summary['run']}")

