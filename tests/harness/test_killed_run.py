"""A soak killed midway keeps every event written, is judged as far as it got, and resumes where it stopped."""

import itertools
import json

import pytest
from click.testing import CliRunner

from forensics import HistoryWriter, RunDir, fold_history
from hammer.cli import main
from hammer.runs import execute
from hammer.soak import SoakPlan

KILL_AT = 80  # history events: inside round 1 of alternate-abandon rounds of 6


def test_a_killed_soak_stays_readable_analyzable_and_resumable(tmp_path, monkeypatch):
    """Stopped after N events: N events read back, analyze judges them (pending, not corrupted), --resume goes on."""
    real_append, written = HistoryWriter.append, itertools.count()

    def dying(self, kind, request, **fields):
        if next(written) == KILL_AT:
            raise KeyboardInterrupt("killed")
        return real_append(self, kind, request, **fields)

    monkeypatch.setattr(HistoryWriter, "append", dying)
    plan = SoakPlan(("alternate-abandon",), 4, round_size=6, requests=18)
    with pytest.raises(KeyboardInterrupt):
        execute(target="embedded", plan=plan, out=tmp_path, echo=lambda line: None)
    monkeypatch.undo()
    run = RunDir.open(tmp_path / "last")
    assert [e["index"] for e in run.history()] == list(range(KILL_AT))
    analyzed = CliRunner().invoke(main, ["analyze", str(run.path)])
    summary = json.loads((run.path / "summary.json").read_text())
    assert analyzed.exit_code == 0 and summary["counts"]["pending"] >= 1 and summary["counts"]["corrupted"] == 0
    pending = {r.request for r in fold_history(run.history()).records.values() if r.outcome is None}
    resumed = CliRunner().invoke(main, ["soak", "--resume", str(run.path)])
    assert resumed.exit_code == 0, resumed.output
    events = run.history()
    invokes = [e for e in events if e["type"] == "invoke"]
    assert len(invokes) == len({e["request"] for e in invokes})  # no request id asked twice
    assert {e["extra"]["round"] for e in invokes} == {0, 1, 2}
    records = fold_history(events).records
    assert all(records[r].outcome is None for r in pending)  # the killed round's open requests stay unjudged
    assert all(records[e["request"]].outcome for e in invokes if e["extra"]["round"] == 2)
