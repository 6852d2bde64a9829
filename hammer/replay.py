"""Replay and diff: two executions of one schedule, compared request by request.

An embedded run is a function of its seeds (schedule seed, device seed) and engine options, so a
replay (``replay_run``: the stored run re-executed from its meta.json) must stream exactly the same
tokens for every request, sampled from the same logits where the engine reports their checks.
``diff_runs`` compares two stored runs of one schedule (the same patterns, seed and rounds) on any two
targets: the same engine on the sim and on a GPU, two builds of an engine, a fault on and off.

Either way the first request that differs is reported, with where its live state first parted
(``forensics.divergence``, one run's ledger against the other's) when both runs have a ledger: that
says which forward computed otherwise. ``request`` narrows the comparison to that request and its
choices (and a replay to the round that holds it: rounds run on fresh engines, so one round replays
on its own).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from forensics import RunDir, fold_history
from forensics.divergence import Divergence, first_mismatch, partings
from forensics.schema import split_choice
from hammer.runs import plan_of, target_of
from hammer.soak import run_soak

__all__ = ["diff_runs", "first_difference", "replay_run", "token_streams"]


def token_streams(run: RunDir) -> dict[str, tuple]:
    """request -> (token ids streamed, how it ended, the logits check of each token or None) of a stored history."""
    return {rid: (tuple(d.token_id for d in record.tokens), record.outcome, record.logit_checks)
            for rid, record in fold_history(run.history()).records.items()}


def _rounds(run: RunDir) -> dict[str, int]:
    """request id -> the round it was invoked in."""
    return {e["request"]: (e.get("extra") or {}).get("round") or 0 for e in run.history() if e["type"] == "invoke"}


def replay_run(run_dir: str | Path, *, request: str | None = None) -> str | None:
    """None if the re-execution streams identical tokens for every request of the stored run (or for
    ``request``), else a sentence naming the first request that differs."""
    stored = RunDir.open(run_dir)
    if stored.meta.target.get("kind") != "embedded":
        raise ValueError(f"{run_dir}: only embedded runs replay exactly (target {stored.meta.target.get('kind')!r})")
    rounds, plan = _rounds(stored), plan_of(stored.meta)
    _check_request(stored, rounds, request)
    first = rounds[split_choice(request)[0]] if request is not None else 0
    last = first if request is not None else max(rounds.values(), default=-1)
    with tempfile.TemporaryDirectory() as scratch:
        again = RunDir.create(scratch, stored.meta, link_last=False)
        bounded = replace(plan, requests=(last + 1) * plan.round_size, duration=None)
        target = target_of(stored.meta)
        target.attach(again.path)
        try:
            run_soak(target, again, bounded, first_round=first)
        finally:
            target.close()
        return first_difference(stored, again, request=request, names=("stored", "replay"))


def diff_runs(first_dir: str | Path, second_dir: str | Path, *, request: str | None = None) -> str | None:
    """None if two stored runs of one schedule streamed identical tokens (and logits, where both report them) for
    every request both finished (or for ``request``), else a sentence naming the first that differs.

    Raises ValueError when the runs are not of one schedule (naming what differs) or lack ``request``."""
    runs = RunDir.open(first_dir), RunDir.open(second_dir)
    plans = [plan_of(run.meta) for run in runs]
    for field in _SCHEDULE_FIELDS:
        if getattr(plans[0], field) != getattr(plans[1], field):
            raise ValueError(f"{first_dir} and {second_dir} are not runs of one schedule: they differ in {field} "
                             f"({getattr(plans[0], field)!r} and {getattr(plans[1], field)!r})")
    _check_request(runs[0], _rounds(runs[0]), request)
    return first_difference(*runs, request=request, names=("first", "second"))


_SCHEDULE_FIELDS = ("patterns", "seed", "round_size", "settings", "schedule")  # what makes a round's requests


def _check_request(run: RunDir, rounds: dict[str, int], request: str | None) -> None:
    if request is not None and split_choice(request)[0] not in rounds:
        raise ValueError(f"{run.path}: no request {request!r} in its history")


def first_difference(ours: RunDir, theirs: RunDir, *, request: str | None = None,
                     names: tuple[str, str] = ("stored", "replay")) -> str | None:
    """The first request ``ours`` finished whose stream ``theirs`` did not give alike (the tokens, how it ended,
    then, both reporting them, each token's logits), as a sentence with where its live state parted; None if none.
    ``names``: what to call the two runs."""
    want, got = token_streams(ours), token_streams(theirs)
    for rid, (tokens, outcome, checks) in want.items():
        if outcome is None or (request is not None and split_choice(rid)[0] != split_choice(request)[0]):
            continue  # never finished in the stored (killed) run, or not asked about
        difference = _stream_difference(tokens, outcome, checks, got.get(rid), names)
        if difference:
            return f"request {rid}: {difference}{_parted(ours, theirs, rid, names)}"
    return None


def _parted(ours: RunDir, theirs: RunDir, rid: str, names: tuple[str, str]) -> str:
    """Where ``rid``'s live state first parted between the runs, as "; ..." (empty without both ledgers)."""
    found = partings(ours.ledger(), {rid: rid}, control_ledger=theirs.ledger())
    return f"; {Divergence.from_dict(found[0]).describe(*(f'the {name} run' for name in names))}" if found else ""


def _stream_difference(tokens: tuple, outcome: str, checks: tuple | None, other: tuple | None,
                       names: tuple[str, str]) -> str:
    """The first difference of a request's stream in the other run ("" when none): its tokens, how it ended, then
    (both reporting them) the logits each token was sampled from."""
    ours, theirs = names
    if other is None:
        return f"{ours} {len(tokens)} tokens ({outcome}); the {theirs} run never sent it"
    again, how, again_checks = other
    if (again, how) != (tokens, outcome):
        position = first_mismatch(tokens, again)
        position = len(tokens) if position is None else position  # the same tokens, ended otherwise
        return (f"first difference at token {position}: {ours} {tokens[position:position + 4]} ({len(tokens)} "
                f"tokens, {outcome}), {theirs} {again[position:position + 4]} ({len(again)} tokens, {how})")
    if checks is not None and again_checks is not None and checks != again_checks:
        position = first_mismatch(checks, again_checks)
        return f"the same {len(tokens)} tokens, but token {position} was sampled from other logits"
    return ""
