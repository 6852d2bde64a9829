"""The soak: rounds of pattern ops against one target until a request count or a deadline, then verdicts.

A soak reads like this::

    create (or reopen, to resume) the run directory; write meta.json
    for round r = 0, 1, ...:                      until --requests or --duration is reached
        ops = pattern p_r (round robin) with seed stable_seed(soak seed, r)   (pure, replayable;
                                                  a pattern may also be probe:FAMILY, hammer.probing)
        run them, then their controls            (the interpreter writes the history)
    judge the history                            (probes' oracles: a verdict row per request)
    attribute every corrupted hit                (forensics: from the engine's ledger, embedded only)
    write summary.json, attribution.json, JUnit XML; exit 0 clean / 1 corrupted / 2 harness error

Resuming continues after the last round whose controls all ended, with the same seeds, so a
killed soak and its resumed remainder together equal an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics import RunDir, fold_history
from forensics.attribute import unlanded
from forensics.divergence import partings
from forensics.ledger import attribute_streams
from hammer.interpreter import run_ops
from hammer.junit import Case, write_suite
from hammer.patterns import Op, with_controls
from hammer.probing import source_ops
from hammer.targets import Target
from probes import Analysis, check_history
from probes.seeding import stable_seed
from probes.verdicts import check_fold

__all__ = ["SCHEDULE", "SoakPlan", "judge", "next_round", "round_ops", "run_soak", "write_junit"]

EXIT_CLEAN, EXIT_CORRUPTED, EXIT_HARNESS = 0, 1, 2
SCHEDULE = "schedule"  # the pattern name of a plan that runs fixed ops (SoakPlan.schedule)


@dataclass(frozen=True)
class SoakPlan:
    patterns: tuple[str, ...]
    seed: int
    round_size: int = 24  # hammer ops per round (controls come on top)
    requests: int | None = None  # stop once this many hammer ops were sent
    duration: float | None = None  # or after this many seconds
    settings: tuple[tuple[str, Any], ...] = ()  # pattern settings (--set), given to every pattern of the plan
    concurrency: int | None = None  # most requests open at once (the interpreter's limit; replay needs it)
    schedule: tuple[Op, ...] = ()  # fixed hammer ops instead of patterns (a shrunk case): one round of them

    def __post_init__(self) -> None:
        if self.schedule:
            if self.patterns != (SCHEDULE,):
                raise ValueError(f"a plan with a fixed schedule has the one pattern {SCHEDULE!r}")
            return
        if not self.patterns:
            raise ValueError("a soak needs at least one pattern")
        if self.requests is None and self.duration is None:
            raise ValueError("bound the soak: give requests or duration")
        if self.round_size < 1:
            raise ValueError(f"round_size must be >= 1; got {self.round_size}")
        for pattern in self.patterns:  # a bad name or setting fails now, naming itself, not mid-run
            try:
                source_ops(pattern, 0, 1, **dict(self.settings))
            except TypeError as error:
                raise ValueError(f"pattern {pattern}: {error} (check --set)") from None


def round_ops(plan: SoakPlan, index: int):
    """The ops of round ``index``: a pure function of the plan (what replay re-generates)."""
    if plan.schedule:
        return SCHEDULE, with_controls(plan.schedule, SCHEDULE)
    pattern = plan.patterns[index % len(plan.patterns)]
    seed = stable_seed(plan.seed, index) % 2**31
    ops = source_ops(pattern, seed, plan.round_size, **dict(plan.settings))
    return pattern, ops


def run_soak(target: Target, run: RunDir, plan: SoakPlan, *, first_round: int = 0,
             progress: Callable[[int, dict[str, int]], None] | None = None) -> int:
    """Run rounds from ``first_round`` until the plan's bound; returns the number of rounds run.

    ``progress(round, counts)`` hears each round's verdict counts as it ends. Raises
    TargetUnavailable if the target cannot be reached, before the first round or during one.
    """
    target.check()
    started, sent, index = time.monotonic(), first_round * plan.round_size, first_round
    with run.writer() as writer:
        while _within(plan, sent, started):
            target.begin_round(index)
            _, ops = round_ops(plan, index)
            events = run_ops(target, ops, writer, round_index=index, concurrency=plan.concurrency)
            sent += plan.round_size
            index += 1
            if progress is not None:
                progress(index, dict(check_history(events, exact=run.meta.exact).counts))
    return index


def _within(plan: SoakPlan, sent: int, started: float) -> bool:
    if plan.requests is not None and sent >= plan.requests:
        return False
    return plan.duration is None or time.monotonic() - started < plan.duration


def judge(run_dir: str | Path, *, max_rate: float = 0.0) -> tuple[Analysis, dict[str, Any], int]:
    """Check the stored history, attribute corrupted hits from the ledger (and say where each parted from its cold
    control), write summary.json and attribution.json; returns (analysis, summary, exit code). Works on partial
    runs."""
    run = RunDir.open(run_dir)
    fold = fold_history(run.history())
    analysis = check_fold(fold, exact=run.meta.exact)
    counts = dict(analysis.counts)
    hits, corrupted_hits = counts.get("hits", 0), counts.get("corrupted_hits", 0)
    rate = corrupted_hits / hits if hits else 0.0
    corrupted = [row.request for row in analysis.corrupted]
    echo = [row.request for row in analysis.corrupted if "echo" in row.fired]
    ledger = list(run.ledger())
    attribution = attribute_streams(ledger, corrupted, echo_failed=echo)
    control_of = analysis.controls()
    controls = {request: control_of[request] for request in corrupted if request in control_of}
    parted = partings(ledger, controls, logits={request: (fold.records[request].logit_checks or (),
                                                          fold.records[control].logit_checks or ())
                                                for request, control in controls.items()})
    blind = len(unlanded(ledger))  # state digests that never landed (read 0): the instrumentation failing
    (Path(run_dir) / "attribution.json").write_text(json.dumps({**attribution.as_dict(), "parted": parted,
                                                                "ledger_unlanded": blind}, indent=2) + "\n")
    # A corrupted request that is no hit (cold corruption: the reference itself is in doubt) always fails.
    cold_corrupted = len(corrupted) > corrupted_hits
    code = EXIT_CORRUPTED if (corrupted_hits and rate > max_rate) or cold_corrupted else EXIT_CLEAN
    verdicts = {}
    for v in attribution.verdicts:
        verdicts[v.verdict] = verdicts.get(v.verdict, 0) + 1
    summary = {"run": str(Path(run_dir).resolve()), "valid": analysis.valid, "counts": counts,
               "corrupted_hit_rate": rate, "max_rate": max_rate, "exit_code": code,
               "corrupted": corrupted[:200], "attribution": verdicts,
               "hypotheses": {h["hypothesis"]: h["status"] for h in attribution.hypotheses},
               "ledger_unlanded": blind,
               "anomalies": list(analysis.anomalies)[:50]}
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return analysis, summary, code


def write_junit(analysis: Analysis, path: str | Path, *, name: str = "hammer") -> Path:
    """JUnit XML: one testcase per (pattern, probe family); a failure lists its corrupted requests."""
    cases: dict[tuple[str, str], list[str]] = {}
    for row in analysis.rows:
        if row.arm == "hammer":
            cases.setdefault((row.pattern or "-", row.family or "-"), [])
            if row.corrupted:
                cases[(row.pattern or "-", row.family or "-")].append(f"{row.request} ({', '.join(row.fired)})")
    return write_suite(name, [Case(pattern, family, f"{len(bad)} corrupted" if bad else None, "\n".join(bad))
                              for (pattern, family), bad in sorted(cases.items())], path)


def next_round(run: RunDir) -> int:
    """Where a resumed soak starts: after the last round that began (a partial one is not re-run, so
    no request id is invoked twice; its unfinished requests stay pending and are never judged)."""
    rounds = [(e.get("extra") or {}).get("round") for e in run.history() if e["type"] == "invoke"]
    rounds = [r for r in rounds if r is not None]
    return max(rounds) + 1 if rounds else 0
