"""Replay: re-execute a stored embedded run from its meta.json and compare every streamed token.

An embedded run is a function of its seeds (schedule seed, device seed) and engine options, so a
replay must stream exactly the same tokens for every request; the first difference is reported.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from forensics import RunDir, fold_history
from hammer.runs import engine_options, plan_of
from hammer.soak import run_soak
from hammer.targets import make_target

__all__ = ["replay_run", "token_streams"]


def token_streams(run: RunDir) -> dict[str, tuple]:
    """request -> (token ids streamed, how it ended) of a stored history."""
    return {rid: (tuple(d.token_id for d in record.tokens), record.outcome)
            for rid, record in fold_history(run.history()).records.items()}


def replay_run(run_dir: str | Path) -> str | None:
    """None if the re-execution streams identical tokens for every request of the stored run, else
    a sentence naming the first request that differs."""
    stored = RunDir.open(run_dir)
    if stored.meta.target.get("kind") != "embedded":
        raise ValueError(f"{run_dir}: only embedded runs replay exactly (target {stored.meta.target.get('kind')!r})")
    plan = plan_of(stored.meta)
    rounds = 1 + max(((e.get("extra") or {}).get("round") or 0 for e in stored.history() if e["type"] == "invoke"),
                     default=-1)
    with tempfile.TemporaryDirectory() as scratch:
        again = RunDir.create(scratch, stored.meta, link_last=False)
        target = make_target("embedded", engine=engine_options(stored.meta.engine))
        try:
            run_soak(target, again, plan.__class__(plan.patterns, plan.seed, round_size=plan.round_size,
                                                   requests=rounds * plan.round_size), first_round=0)
        finally:
            target.close()
        want, got = token_streams(stored), token_streams(again)
    for rid, (tokens, outcome) in want.items():
        if outcome is None:
            continue  # never finished in the stored (killed) run: nothing to compare
        if got.get(rid) != (tokens, outcome):
            return f"request {rid}: stored {len(tokens)} tokens ({outcome}), replay {got.get(rid)!r:.120}"
    return None
