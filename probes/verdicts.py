"""One verdict row per request, and the run's verdict: the oracles composed, Jepsen ``check-safe`` style.

An oracle that raises gives ``unknown`` (label ``error``) for that row and that oracle only; the
rest of the analysis goes on. A request that did not complete (abandoned on purpose, failed,
indeterminate, still pending) gets ``unknown`` from every oracle and is never counted as corrupted.

The run is ``valid`` False if any completed hammer request is corrupted; else ``"unknown"`` if an
oracle could not decide on one of them (no control, an oracle error) or the history breaks the
protocol; else True.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from forensics import Fold, RequestRecord, RunDir, fold_history
from probes.oracles import CONTROL_ARM, ORACLES, UNKNOWN, Check, Context, build_context

__all__ = ["Analysis", "VerdictRow", "check_fold", "check_history", "check_run", "check_safe"]

Oracle = Callable[[RequestRecord, Context], Check]

# Why a request that did not complete cannot be judged, by its outcome.
_NOT_JUDGED = {"fail": "failed", "info": "indeterminate", None: "pending"}


@dataclass(frozen=True)
class VerdictRow:
    request: str
    parent: str  # the request id of an n > 1 request's choices (== request for n = 1)
    choice: int
    pattern: str | None
    group: str | None
    key: str  # what was asked: a hammered request and its control share it
    probe_id: str | None
    family: str | None
    arm: str  # "hammer" | "control-cold"
    outcome: str  # "ok" | "fail" | "info" | "pending"
    hit: bool | None  # cached_tokens > 0; None when not reported
    cached_tokens: int | None
    abandoned: bool
    corrupted: bool  # an oracle that counts as corruption fired on a completed hammer request
    fired: tuple[str, ...]  # the oracles that counted
    checks: Mapping[str, Check]

    def as_dict(self) -> dict[str, Any]:
        """A flat row: the scalar columns, one column per oracle holding its label, and ``details``."""
        row = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "checks"}
        row["fired"] = list(self.fired)
        row.update({name: check.label for name, check in self.checks.items()})
        row["details"] = {name: dict(check.details) for name, check in self.checks.items() if check.details}
        return row


@dataclass(frozen=True)
class Analysis:
    valid: bool | str
    rows: tuple[VerdictRow, ...]
    counts: Mapping[str, int]
    anomalies: tuple[str, ...] = ()

    @property
    def corrupted(self) -> tuple[VerdictRow, ...]:
        return tuple(row for row in self.rows if row.corrupted)

    def controls(self) -> dict[str, str]:
        """Each hammered request -> the request of its cold control (the first control run of the same key)."""
        of_key: dict[str, str] = {}
        for row in self.rows:
            if row.arm == CONTROL_ARM:
                of_key.setdefault(row.key, row.request)
        return {row.request: of_key[row.key] for row in self.rows if row.arm != CONTROL_ARM and row.key in of_key}


def check_safe(oracle: Oracle, record: RequestRecord, ctx: Context) -> Check:
    """``oracle(record, ctx)``, or an ``unknown`` check naming the error if it raises or returns junk."""
    try:
        check = oracle(record, ctx)
    except Exception as error:  # noqa: BLE001 -- a broken checker must never take the analysis down
        return Check(UNKNOWN, "error", details={"error": f"{type(error).__name__}: {error}"})
    if not isinstance(check, Check):
        return Check(UNKNOWN, "error", details={"error": f"oracle returned {type(check).__name__}, not a Check"})
    return check


def check_fold(fold: Fold, *, oracles: Mapping[str, Oracle] = ORACLES, exact: bool = True) -> Analysis:
    """Verdicts for every record of ``fold``."""
    records = tuple(fold.records.values())
    ctx = build_context(records, exact=exact)
    rows = tuple(_row(record, ctx, oracles) for record in records)
    anomalies = (*fold.anomalies, *_warm_controls(records), *_control_disagreements(records))
    return Analysis(_run_validity(rows, anomalies), rows, _counts(rows), anomalies)


def check_history(events: Iterable[Mapping[str, Any]], **kwargs: Any) -> Analysis:
    return check_fold(fold_history(events), **kwargs)


def check_run(path: str | os.PathLike, **kwargs: Any) -> Analysis:
    """Analyze a stored run directory (a partial one too)."""
    return check_history(RunDir.open(path).history(), **kwargs)


def _row(record: RequestRecord, ctx: Context, oracles: Mapping[str, Oracle]) -> VerdictRow:
    if record.outcome == "ok":
        checks = {name: check_safe(oracle, record, ctx) for name, oracle in oracles.items()}
    else:
        reason = "abandoned" if record.abandoned else _NOT_JUDGED[record.outcome]
        checks = {name: Check(UNKNOWN, reason) for name in oracles}
    counted = record.arm != CONTROL_ARM and record.outcome == "ok"
    fired = tuple(name for name, check in checks.items() if counted and check.corruption)
    probe = record.probe or {}
    return VerdictRow(
        request=record.request, parent=record.parent, choice=record.choice, pattern=record.invoke.get("pattern"),
        group=record.invoke.get("group"), key=record.key, probe_id=probe.get("id"), family=probe.get("family"),
        arm=record.arm, outcome=record.outcome or "pending", hit=record.hit, cached_tokens=record.cached_tokens,
        abandoned=record.abandoned, corrupted=bool(fired), fired=fired, checks=checks)


def _run_validity(rows: tuple[VerdictRow, ...], anomalies: tuple[str, ...]) -> bool | str:
    judged = [r for r in rows if r.arm != CONTROL_ARM and r.outcome == "ok"]
    if any(r.corrupted for r in judged):
        return False
    if anomalies or any(c.valid == UNKNOWN for r in judged for c in r.checks.values()):
        return UNKNOWN
    return True


def _warm_controls(records: tuple[RequestRecord, ...]) -> list[str]:
    """A control that reports cached tokens was not cold: the target did not switch the cache off."""
    return [f"control {r.request} reports cached_tokens={r.cached_tokens}: it was not run cold, so it is no "
            "reference (run controls with the cache off)" for r in records if r.arm == CONTROL_ARM and r.hit]


def _control_disagreements(records: tuple[RequestRecord, ...]) -> list[str]:
    """Two completed controls of one request that differ: the reference itself is not reproducible."""
    outputs: dict[tuple[str, int], dict[Any, str]] = defaultdict(dict)
    for r in records:
        if r.arm == CONTROL_ARM and r.outcome == "ok":
            outputs[(r.key, r.choice)].setdefault(r.token_ids or r.text, r.request)
    return [f"controls {sorted(seen.values())} of key {key} choice {choice} disagree: the cold reference is "
            "not reproducible" for (key, choice), seen in outputs.items() if len(seen) > 1]


def _counts(rows: tuple[VerdictRow, ...]) -> dict[str, int]:
    hammer = [r for r in rows if r.arm != CONTROL_ARM]
    completed = [r for r in hammer if r.outcome == "ok"]
    return {
        "requests": len(rows), "hammer": len(hammer), "controls": len(rows) - len(hammer),
        "completed": len(completed), "hits": sum(1 for r in completed if r.hit),
        # completed without cached_tokens: hit or miss unknown (vLLM reports it with --enable-prompt-tokens-details)
        "hits_unreported": sum(1 for r in completed if r.hit is None),
        "corrupted": sum(1 for r in completed if r.corrupted),
        "corrupted_hits": sum(1 for r in completed if r.corrupted and r.hit),
        "unknown": sum(1 for r in completed if any(c.valid == UNKNOWN for c in r.checks.values())),
        "abandoned": sum(1 for r in hammer if r.abandoned),
        "failed": sum(1 for r in hammer if r.outcome == "fail"),
        "indeterminate": sum(1 for r in hammer if r.outcome == "info" and not r.abandoned),
        "pending": sum(1 for r in hammer if r.outcome == "pending"),
    }
