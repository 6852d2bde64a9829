"""Replay: re-execute a stored embedded run from its meta.json and compare every streamed token.

An embedded run is a function of its seeds (schedule seed, device seed) and engine options, so a
replay must stream exactly the same tokens for every request, sampled from the same logits where the
engine reports their checks; the first difference is reported, with
where the request's live state first parted from the stored run's (``forensics.divergence``, the stored
ledger against the replay's): on a GPU, where replays are not promised, or against an engine changed
since (meta.json edited), that says which forward computed otherwise. ``request`` narrows the replay to
the round that holds that request (rounds run on fresh engines, so one round replays on its own) and
the comparison to that request and its choices.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from forensics import RunDir, fold_history
from forensics.divergence import Divergence, partings
from forensics.schema import split_choice
from hammer.runs import plan_of, target_of
from hammer.soak import run_soak

__all__ = ["replay_run", "token_streams"]


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
    if request is not None and split_choice(request)[0] not in rounds:
        raise ValueError(f"{run_dir}: no request {request!r} in its history")
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
        want, got = token_streams(stored), token_streams(again)
        for rid, (tokens, outcome, checks) in want.items():
            if outcome is None or (request is not None and split_choice(rid)[0] != split_choice(request)[0]):
                continue  # never finished in the stored (killed) run, or not asked about
            difference = _first_difference(tokens, outcome, checks, got.get(rid))
            if difference:
                return f"request {rid}: {difference}{_parted(stored, again, rid)}"
    return None


def _parted(stored: RunDir, again: RunDir, rid: str) -> str:
    """Where ``rid``'s live state first parted from the stored run's, as "; ..." (empty without both ledgers)."""
    found = partings(stored.ledger(), {rid: rid}, control_ledger=again.ledger())
    return f"; {Divergence.from_dict(found[0]).describe('the stored run', 'the replay')}" if found else ""


def _first_difference(tokens: tuple, outcome: str, checks: tuple | None, replayed: tuple | None) -> str:
    """The first difference of a request's replay from its stored stream ("" when none): its tokens, how it ended,
    then (both reporting them) the logits each token was sampled from."""
    if replayed is None:
        return f"stored {len(tokens)} tokens ({outcome}); the replay never sent it"
    again, how, again_checks = replayed
    if (again, how) != (tokens, outcome):
        position = next((i for i, (a, b) in enumerate(zip(tokens, again)) if a != b), min(len(tokens), len(again)))
        return (f"first difference at token {position}: stored {tokens[position:position + 4]} ({len(tokens)} tokens, "
                f"{outcome}), replay {again[position:position + 4]} ({len(again)} tokens, {how})")
    if checks is not None and again_checks is not None and checks != again_checks:
        position = next((i for i, (a, b) in enumerate(zip(checks, again_checks)) if a != b),
                        min(len(checks), len(again_checks)))
        return f"the same {len(tokens)} tokens, but token {position} was sampled from other logits"
    return ""
