"""``hammer``: the harness's command line (DESIGN.md §5), the top floor: it may import everything.

    hammer soak [--requests N | --duration 10m] [--pattern P ...] [--fault F ...]   rounds, verdicts, summary
    hammer run PATTERN [--count N]                                                   one round of one pattern
    hammer analyze RUN_DIR                                                           re-judge a stored run
    hammer replay RUN_DIR                                                            re-execute, compare tokens

Exit codes everywhere: 0 clean, 1 corrupted hits above --max-rate, 2 harness error.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from hammer import __version__

__all__ = ["main"]

DEFAULT_PATTERNS = ("alternate-abandon", "saturate", "branch-fanout", "chunk-boundary", "multi-turn", "media-ab")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hammer")
def main() -> None:
    """Hammer an inference engine's prefix cache and attribute every wrong answer on a hit."""


def _duration(_ctx, _param, value: str | None) -> float | None:
    if value is None:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", value.strip())
    if not match:
        raise click.BadParameter("use a number of seconds, or e.g. 90s, 10m, 2h")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def _seed(_ctx, _param, value: str) -> int | str:
    if value == "last":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter("an integer, or 'last' to reuse the seed of runs/last") from None


def engine_target_options(command):
    from mini_engine.faults import FAULTS

    options = [
        click.option("--target", default="embedded", show_default=True, metavar="embedded",
                     help="Where the requests go. Only the embedded engine for now (an HTTP target is issue 5's "
                          "remaining work)."),
        click.option("--seed", default="0", callback=_seed, show_default=True, help="Schedule seed, or 'last'."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
                     help="Root folder of run directories."),
        click.option("--fault", "faults", multiple=True, type=click.Choice(list(FAULTS)), metavar="NAME",
                     help=f"Switch one engine safeguard off (repeatable): {', '.join(FAULTS)}."),
        click.option("--overlap", is_flag=True, help="Overlap scheduling in the engine under test."),
        click.option("--device-seed", type=int, default=0, show_default=True, help="Seed of the simulated device."),
        click.option("--max-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True,
                     help="Corrupted-hit rate above which the exit code is 1."),
        click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Also write JUnit XML here."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@main.command()
@engine_target_options
@click.option("--requests", type=click.IntRange(min=1), default=None, help="Stop after this many hammer requests.")
@click.option("--duration", callback=_duration, default=None, help="Or stop after this long (e.g. 10m).")
@click.option("--pattern", "patterns", multiple=True, metavar="NAME", help="Pattern(s), round robin (default: six).")
@click.option("--round-size", type=click.IntRange(min=1), default=24, show_default=True, help="Hammer ops per round.")
@click.option("--resume", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Continue a stored soak (same seeds, next round).")
def soak(target, seed, out, faults, overlap, device_seed, max_rate, junit, requests, duration, patterns, round_size,
         resume):
    """Rounds of load patterns with their cold controls until --requests or --duration; then verdicts."""
    if requests is None and duration is None:
        requests = 240
    _execute(target, seed, out, faults, overlap, device_seed, max_rate, junit, patterns or DEFAULT_PATTERNS,
             requests, duration, round_size, resume)


@main.command("run")
@engine_target_options
@click.argument("pattern")
@click.option("--count", type=click.IntRange(min=1), default=24, show_default=True, help="Hammer requests.")
def run_pattern(target, seed, out, faults, overlap, device_seed, max_rate, junit, pattern, count):
    """One round of one PATTERN (and its controls)."""
    _execute(target, seed, out, faults, overlap, device_seed, max_rate, junit, (pattern,), count, None, count, None)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--max-rate", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), default=None)
def analyze(run_dir, max_rate, junit):
    """Re-run the checkers and the attribution on a stored (possibly partial) run directory."""
    from hammer.soak import judge, write_junit

    analysis, summary, code = judge(run_dir, max_rate=max_rate)
    if junit:
        write_junit(analysis, junit)
    _print_summary(summary)
    sys.exit(code)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
def replay(run_dir):
    """Re-execute an embedded run from its meta.json and check every streamed token is identical."""
    from hammer.replay import replay_run

    first_difference = replay_run(run_dir)
    if first_difference is None:
        click.echo(f"replay of {run_dir}: every token identical")
        sys.exit(0)
    click.echo(f"replay of {run_dir} differs: {first_difference}")
    sys.exit(1)


def _execute(target, seed, out, faults, overlap, device_seed, max_rate, junit, patterns, requests, duration,
             round_size, resume):
    from hammer.runs import execute

    if target != "embedded":
        raise click.BadParameter("only 'embedded' is supported yet", param_hint="--target")
    try:
        run_dir, code, summary = execute(seed=seed, out=out, faults=faults, overlap=overlap, device_seed=device_seed,
                                         max_rate=max_rate, junit=junit, patterns=patterns, requests=requests,
                                         duration=duration, round_size=round_size, resume=resume,
                                         command=tuple(sys.argv), echo=click.echo)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    _print_summary(summary)
    sys.exit(code)


def _print_summary(summary: dict) -> None:
    from reports.stats import wilson

    c = summary["counts"]
    hits, bad = c.get("hits", 0), c.get("corrupted_hits", 0)
    upper = wilson(bad, hits).upper if hits else 1.0
    rows = [("requests", c.get("requests", 0)), ("hammer / control", f"{c.get('hammer', 0)} / {c.get('controls', 0)}"),
            ("completed", c.get("completed", 0)), ("hits", hits),
            ("hit rate", f"{hits / max(1, c.get('completed', 0)):.1%}"), ("abandoned", c.get("abandoned", 0)),
            ("corrupted", c.get("corrupted", 0)), ("corrupted hits", bad),
            ("corrupted-hit rate", f"{summary['corrupted_hit_rate']:.2%} (95% Wilson upper {upper:.2%})"),
            ("attribution", ", ".join(f"{k}: {v}" for k, v in summary["attribution"].items()) or "-"),
            ("verdict", {0: "CLEAN", 1: "CORRUPTED", 2: "HARNESS ERROR"}[summary["exit_code"]])]
    width = max(len(k) for k, _ in rows)
    click.echo("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    click.echo(f"run directory: {summary['run']}")
