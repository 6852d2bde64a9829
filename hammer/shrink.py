"""Shrink: delta-debug a failing embedded run down to a minimal schedule that still fails the same way.

A failure is a corrupted cache hit with an attribution verdict (``forensics.attribute``); "the same
way" is a corrupted hit with the same verdict. Shrinking reads like this::

    pick the failure          the first corrupted hit of the run (or the first with --verdict V);
                              its round's ops are a pure function of the plan (soak.round_ops)
    the device seed           try the canonical seed 0 in place of the round's (fewer knobs to explain)
    ddmin over the ops        Zeller's delta debugging: drop halves, then quarters, ... of the hammer
                              ops while the failure stays; an op whose conversation base was dropped
                              goes with it
    simplify each op          no abort, an earlier arrival, fewer tokens: kept when it still fails
    write                     case.json, a runnable pytest file, and the case run as a run directory

Every candidate runs as one round on fresh engines (``SoakPlan.schedule``) and is judged by the
same checkers and attribution as a soak, so a shrunk case fails for the reason the run did.
Candidates are memoised; ``max_trials`` and ``budget`` (seconds) bound the search, which stops
with the smallest failing schedule found so far.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forensics import RunDir, fold_history
from forensics.schema import split_choice
from hammer.patterns import HAMMER_ARM, Op
from hammer.runs import EMBEDDED, execute, plan_of
from hammer.soak import SCHEDULE, SoakPlan, round_ops

__all__ = ["Case", "Outcome", "ShrinkResult", "failure_of", "run_case", "shrink_run", "write_case"]

CASE_VERSION = 1


@dataclass(frozen=True)
class Case:
    """A schedule that fails: hammer ops, the engine options (faults and device seed included) and
    the failure it shows (``verdict``). ``source`` says where it came from."""

    ops: tuple[Op, ...]
    engine: Mapping[str, Any]
    verdict: str
    seed: int = 0
    source: str = ""
    concurrency: int | None = None  # the stored run's limit on open requests (None: none)

    def as_dict(self) -> dict[str, Any]:
        return {"version": CASE_VERSION, "verdict": self.verdict, "seed": self.seed, "source": self.source,
                "concurrency": self.concurrency,
                "engine": {**self.engine, "faults": list(self.engine.get("faults", ()))},
                "ops": [op.as_record() for op in self.ops]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Case:
        data = json.loads(text)
        if data.get("version") != CASE_VERSION:
            raise ValueError(f"case version {data.get('version')!r} is not {CASE_VERSION}; re-run `hammer shrink`")
        return cls(tuple(Op.from_invoke(op) for op in data["ops"]), data["engine"], data["verdict"],
                   int(data.get("seed", 0)), data.get("source", ""), data.get("concurrency"))

    def with_faults(self, faults: Sequence[str]) -> Case:
        return replace(self, engine={**self.engine, "faults": tuple(faults)})


@dataclass(frozen=True)
class Outcome:
    """What one run of a case showed: ``failures`` = (request, verdict) of every corrupted hit."""

    run_dir: Path
    failures: tuple[tuple[str, str], ...]
    summary: Mapping[str, Any]

    def fails_as(self, verdict: str) -> bool:
        return any(v == verdict for _, v in self.failures)

    def explain(self) -> str:
        if not self.failures:
            return f"no corrupted hit ({self.run_dir})"
        shown = ", ".join(f"{rid}: {verdict}" for rid, verdict in self.failures)
        return f"{len(self.failures)} corrupted hit(s): {shown}; `hammer postmortem {self.run_dir}` says why"


def run_case(case: Case, out: str | Path, *, faults: Sequence[str] | None = None) -> Outcome:
    """Run ``case`` (with ``faults`` instead of its own, if given) as a one-round soak under ``out``."""
    if faults is not None:
        case = case.with_faults(faults)
    plan = SoakPlan((SCHEDULE,), case.seed, round_size=len(case.ops), requests=len(case.ops), schedule=case.ops,
                    concurrency=case.concurrency)
    run_dir, _, summary = execute(target=EMBEDDED, plan=plan, out=Path(out), engine=dict(case.engine),
                                  command=("hammer", "shrink", case.source), echo=lambda _line: None)
    return Outcome(run_dir, _hit_failures(run_dir), summary)


def _hit_failures(run_dir: str | Path) -> tuple[tuple[str, str], ...]:
    """(request, verdict) of the corrupted hits: attribution.json's verdicts on the requests that hit."""
    records = fold_history(RunDir.open(run_dir).history()).records
    attribution = json.loads((Path(run_dir) / "attribution.json").read_text())
    return tuple((v["request"], v["verdict"]) for v in attribution["verdicts"]
                 if v["request"] in records and records[v["request"]].hit)


def failure_of(run_dir: str | Path, verdict: str | None = None) -> tuple[str, str, int]:
    """(request, verdict, round) of the failure to shrink: the first corrupted hit of the stored run's
    attribution.json (``hammer analyze`` writes it), or the first with ``verdict``."""
    run = RunDir.open(run_dir)
    path = Path(run_dir) / "attribution.json"
    if run.meta.target.get("kind") != EMBEDDED:
        raise ValueError(f"{run_dir}: only embedded runs shrink (target {run.meta.target.get('kind')!r})")
    if not path.exists():
        raise ValueError(f"{run_dir}: no attribution.json; run `hammer analyze {run_dir}` first")
    failures = list(_hit_failures(run_dir))
    if verdict is not None:
        failures = [f for f in failures if f[1] == verdict]
    if not failures:
        raise ValueError(f"{run_dir}: no corrupted hit{f' with verdict {verdict!r}' if verdict else ''} to shrink")
    request, found = failures[0]
    rounds = {e["request"]: (e.get("extra") or {}).get("round") or 0 for e in run.history() if e["type"] == "invoke"}
    return request, found, rounds[split_choice(request)[0]]


@dataclass
class ShrinkResult:
    case: Case
    original: int  # hammer ops in the failing round
    trials: int
    seconds: float
    steps: list[str] = field(default_factory=list)  # what each accepted reduction did

    def as_dict(self) -> dict[str, Any]:
        return {"original_ops": self.original, "ops": len(self.case.ops), "trials": self.trials,
                "seconds": round(self.seconds, 1), "steps": self.steps, "case": self.case.as_dict()}


class _Oracle:
    """Runs candidates (memoised by their ops and engine options) and says whether they fail the same way."""

    def __init__(self, verdict: str, scratch: Path, max_trials: int, deadline: float,
                 log: Callable[[str], None]) -> None:
        self.verdict, self.scratch, self.log = verdict, scratch, log
        self.max_trials, self.deadline = max_trials, deadline
        self.trials, self._memo = 0, {}

    @property
    def exhausted(self) -> bool:
        return self.trials >= self.max_trials or time.monotonic() >= self.deadline

    def fails(self, case: Case) -> bool:
        key = case.to_json()
        if key not in self._memo:
            if self.exhausted:
                return False
            self.trials += 1
            with tempfile.TemporaryDirectory(dir=self.scratch) as out:
                self._memo[key] = run_case(case, out).fails_as(self.verdict)
            self.log(f"trial {self.trials}: {len(case.ops)} ops -> {'fails' if self._memo[key] else 'passes'}")
        return self._memo[key]


def _closed(ops: Sequence[Op]) -> tuple[Op, ...]:
    """``ops`` without those whose conversation base is missing (transitively, in schedule order)."""
    kept: list[Op] = []
    present: set[str] = set()
    for op in ops:
        if op.continues is None or op.continues in present:
            kept.append(op)
            present.add(op.request)
    return tuple(kept)


def _ddmin(case: Case, oracle: _Oracle, steps: list[str]) -> Case:
    """Zeller's ddmin: try each of n chunks alone, then each complement; refine n when neither fails."""
    ops, n = case.ops, 2
    while len(ops) >= 2 and not oracle.exhausted:
        size = -(-len(ops) // n)
        chunks = [ops[i:i + size] for i in range(0, len(ops), size)]
        complements = [tuple(o for o in ops if o not in chunk) for chunk in chunks]
        reduced = None
        for candidates, next_n in ((chunks, 2), (complements, max(n - 1, 2))):
            for candidate in map(_closed, candidates):
                if candidate and len(candidate) < len(ops) and oracle.fails(replace(case, ops=candidate)):
                    reduced = candidate, next_n
                    break
            if reduced:
                break
        if reduced:
            steps.append(f"ddmin: {len(ops)} -> {len(reduced[0])} ops")
            ops, n = reduced
        elif n >= len(ops):
            break
        else:
            n = min(len(ops), 2 * n)
    return replace(case, ops=ops)


def _simpler(op: Op, earlier: int) -> list[tuple[str, Op]]:
    """Simpler variants of ``op``, simplest first; ``earlier`` = the arrival of the op before it."""
    out = []
    if op.abandon_after is not None:
        out.append((f"{op.request}: no abort", replace(op, abandon_after=None)))
    if op.at > earlier:
        out.append((f"{op.request}: arrives at {earlier} (was {op.at})", replace(op, at=earlier)))
    floor = (op.abandon_after or 0) + 1
    if op.max_tokens // 2 >= floor:
        out.append((f"{op.request}: {op.max_tokens // 2} tokens (was {op.max_tokens})",
                    replace(op, max_tokens=op.max_tokens // 2)))
    return out


def _simplify(case: Case, oracle: _Oracle, steps: list[str]) -> Case:
    changed = True
    while changed and not oracle.exhausted:
        changed = False
        for i in range(len(case.ops)):
            earlier = case.ops[i - 1].at if i else 0
            for what, variant in _simpler(case.ops[i], earlier):
                candidate = replace(case, ops=(*case.ops[:i], variant, *case.ops[i + 1:]))
                if oracle.fails(candidate):
                    steps.append(what)
                    case, changed = candidate, True
                    break
    return case


def shrink_run(run_dir: str | Path, *, verdict: str | None = None, max_trials: int = 300, budget: float = 600.0,
               log: Callable[[str], None] = lambda _line: None) -> ShrinkResult:
    """The smallest schedule found that fails like the stored run's failure (see the module docstring).

    Raises ValueError when the run cannot be shrunk (not embedded, no corrupted hit, not analysed)."""
    started = time.monotonic()
    run = RunDir.open(run_dir)
    request, verdict, index = failure_of(run_dir, verdict)
    plan = plan_of(run.meta)
    hammer = tuple(op for op in round_ops(plan, index)[1] if op.arm == HAMMER_ARM)
    from hammer.targets.embedded import round_device_seed

    engine = {**run.meta.engine, "device_seed": round_device_seed(run.meta.engine, index)}
    case = Case(hammer, engine, verdict, plan.seed, f"{Path(run_dir).resolve()} round {index} ({request})",
                plan.concurrency)
    steps: list[str] = []
    with tempfile.TemporaryDirectory(prefix="hammer-shrink-") as scratch:
        oracle = _Oracle(verdict, Path(scratch), max_trials, started + budget, log)
        if not oracle.fails(case):
            raise ValueError(f"{run_dir}: round {index} run on its own does not fail with {verdict!r} "
                             "(the run is not reproducible from its meta.json?)")
        if engine["device_seed"] != 0 and oracle.fails(seeded := replace(case, engine={**engine, "device_seed": 0})):
            steps.append(f"device seed 0 (was {engine['device_seed']})")
            case = seeded
        case = _ddmin(case, oracle, steps)
        case = _simplify(case, oracle, steps)
    return ShrinkResult(case, len(hammer), oracle.trials, time.monotonic() - started, steps)


_TEST_FILE = '''"""A shrunk failing case: {n} request(s) whose cache hit is corrupted ({verdict}).

Written by `hammer shrink` from {source}.
It fails while the engine has the bug and passes once the safeguard is back. Engine options:
{engine}. HAMMER_FAULTS overrides the faults: comma-separated, empty for every safeguard on.

    pytest {name}                      # fails: the corrupted hit, its verdict, the run directory
    HAMMER_FAULTS= pytest {name}       # passes
"""

import os

from hammer.shrink import Case, run_case

CASE = Case.from_json({case})


def test_no_corrupted_hit(tmp_path):
    faults = os.environ.get("HAMMER_FAULTS")
    chosen = None if faults is None else [f for f in faults.split(",") if f]
    outcome = run_case(CASE, tmp_path, faults=chosen)
    assert not outcome.failures, outcome.explain()
'''


def _literal(text: str) -> str:
    """``text`` as a readable Python literal: a raw triple-quoted string when that is exact, else repr."""
    return f"r'''{text}'''" if "'''" not in text and not text.endswith(("\\", "'")) else repr(text)


def write_case(result: ShrinkResult, out: str | Path) -> dict[str, Path]:
    """``out``/case.json, ``out``/test_shrunk_<verdict>.py, ``out``/shrink.json and the case run once
    as a run directory under ``out``/runs (with its report inputs). Returns the paths by name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    case = result.case
    name = f"test_shrunk_{case.verdict.replace('-', '_')}.py"
    (out / "case.json").write_text(case.to_json() + "\n")
    engine = ", ".join(f"{k}={v}" for k, v in sorted(case.engine.items()) if v not in (None, (), []))
    (out / name).write_text(_TEST_FILE.format(n=len(case.ops), verdict=case.verdict, source=case.source,
                                              engine=engine, name=name, case=_literal(case.to_json())))
    outcome = run_case(case, out / "runs")
    (out / "shrink.json").write_text(json.dumps({**result.as_dict(), "run": str(outcome.run_dir),
                                                 "failures": [list(f) for f in outcome.failures]}, indent=2) + "\n")
    return {"case": out / "case.json", "test": out / name, "run": outcome.run_dir, "log": out / "shrink.json"}
