"""Replay: re-execute a stored embedded run from its meta.json and compare every streamed token.

An embedded run is a function of its seeds (schedule seed, device seed) and engine options, so a
replay must stream exactly the same tokens for every request; the first difference is reported.
``request`` narrows the replay to the round that holds that request (rounds run on fresh engines,
so one round replays on its own) and the comparison to that request and its choices.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from forensics import RunDir, fold_history
from forensics.schema import split_choice
from hammer.runs import plan_of, target_of
from hammer.soak import run_soak

__all__ = ["replay_run", "token_streams"]


def token_streams(run: RunDir) -> dict[str, tuple]:
    """request -> (token ids streamed, how it ended) of a stored history."""
    return {rid: (tuple(d.token_id for d in record.tokens), record.outcome)
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
    if request is not None and split_choice(request)[0] not in rounds:
        raise ValueError(f"{run_dir}: no request {request!r} in its history")
    first = rounds[split_choice(request)[0]] if request is not None else 0
    last = first if request is not None else max(rounds.values(), default=-1)
    with tempfile.TemporaryDirectory() as scratch:
        again = RunDir.create(scratch, stored.meta, link_last=False)
        bounded = replace(plan, requests=(last + 1) * plan.round_size, duration=None)
        run_soak(target_of(stored.meta), again, bounded, first_round=first)
        want, got = token_streams(stored), token_streams(again)
    for rid, (tokens, outcome) in want.items():
        if outcome is None or (request is not None and split_choice(rid)[0] != split_choice(request)[0]):
            continue  # never finished in the stored (killed) run, or not asked about
        if got.get(rid) != (tokens, outcome):
            return f"request {rid}: {_first_difference(tokens, outcome, got.get(rid))}"
    return None


def _first_difference(tokens: tuple, outcome: str, replayed: tuple | None) -> str:
    if replayed is None:
        return f"stored {len(tokens)} tokens ({outcome}); the replay never sent it"
    again, how = replayed
    position = next((i for i, (a, b) in enumerate(zip(tokens, again)) if a != b), min(len(tokens), len(again)))
    return (f"first difference at token {position}: stored {tokens[position:position + 4]} ({len(tokens)} tokens, "
            f"{outcome}), replay {again[position:position + 4]} ({len(again)} tokens, {how})")
