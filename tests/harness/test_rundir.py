"""Run directories: meta, history and ledger in one folder; ``last`` points at the newest; runs resume."""

import json

import pytest

from forensics import SCHEMA_VERSION, RunDir, RunMeta, SchemaError, resolve_run


def _meta(**overrides):
    return RunMeta(**{"target": {"kind": "embedded"}, "patterns": ({"name": "saturate", "settings": {"batch": 4}},),
                      "seeds": {"pattern": 7}, "faults": ("donate=transfer",), "command": ("hammer", "run"),
                      **overrides})


def test_create_writes_meta_and_an_empty_history_under_a_fresh_name(tmp_path):
    """create() makes root/<timestamp>-<id> holding meta.json (with versions) and an empty history."""
    run = RunDir.create(tmp_path, _meta())
    assert run.path.parent == tmp_path and run.path.name[:8].isdigit() and "-" in run.path.name
    meta = json.loads((run.path / "meta.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and meta["tool_version"]
    assert meta["seeds"] == {"pattern": 7} and meta["faults"] == ["donate=transfer"]
    assert meta["end_time"] is None and run.history() == []


def test_last_points_at_the_newest_run(tmp_path):
    """After two runs, root/last and resolve_run('last') name the second; open('root/last') reads it."""
    RunDir.create(tmp_path, _meta())
    second = RunDir.create(tmp_path, _meta(seeds={"pattern": 8}))
    assert resolve_run(tmp_path, "last") == second.path.resolve()
    assert RunDir.open(tmp_path / "last").meta.seeds == {"pattern": 8}


def test_resolve_last_without_runs_says_what_to_do(tmp_path):
    """With no previous run, 'last' raises an error that tells the user to run first."""
    with pytest.raises(FileNotFoundError, match="hammer run"):
        resolve_run(tmp_path, "last")


def test_open_and_write_continues_the_same_history(tmp_path):
    """Writing, re-opening and writing again gives one history with continuing indices."""
    run = RunDir.create(tmp_path, _meta(), path=tmp_path / "exact")
    with run.writer() as w:
        w.invoke("a", arm="hammer", key="k")
    with RunDir.open(run.path).writer() as w:
        w.ok("a", text="done")
    assert [(e["index"], e["type"]) for e in RunDir.open(run.path).history()] == [(0, "invoke"), (1, "ok")]


def test_create_refuses_a_folder_that_holds_a_run(tmp_path):
    """An exact path that already holds files is refused (resume with open instead)."""
    run = RunDir.create(tmp_path, _meta(), path=tmp_path / "exact")
    with pytest.raises(FileExistsError, match="RunDir.open"):
        RunDir.create(tmp_path, _meta(), path=run.path)


def test_finish_records_the_end_time(tmp_path):
    """finish() writes end_time into meta.json; the rest of the meta is unchanged."""
    run = RunDir.create(tmp_path, _meta()).finish("2026-01-01T00:00:00+00:00")
    reread = RunDir.open(run.path).meta
    assert reread.end_time == "2026-01-01T00:00:00+00:00" and reread == run.meta


def test_ledger_reads_rows_and_tolerates_a_missing_file(tmp_path):
    """ledger() yields nothing without a ledger, and each row (minus a cut last line) with one."""
    run = RunDir.create(tmp_path, _meta())
    assert list(run.ledger()) == []
    run.ledger_path.write_text('{"event":"alloc","slot":3}\n{"event":"free","slot":3}\n{"event":"do')
    assert [row["event"] for row in run.ledger()] == ["alloc", "free"]


@pytest.mark.parametrize("overrides, message", [
    ({"target": {}}, "kind"),
    ({"patterns": ({"settings": {}},)}, "name"),
    ({"seeds": {"pattern": "7"}}, "ints"),
    ({"schema_version": SCHEMA_VERSION + 1}, "schema version"),
])
def test_meta_validates_itself(overrides, message):
    """A meta without a target kind, a pattern name, int seeds or this schema version names the problem."""
    with pytest.raises(SchemaError, match=message):
        _meta(**overrides)


def test_meta_with_unknown_fields_is_refused(tmp_path):
    """A meta.json holding a field this schema does not know is refused, naming it."""
    run = RunDir.create(tmp_path, _meta())
    data = json.loads((run.path / "meta.json").read_text())
    (run.path / "meta.json").write_text(json.dumps({**data, "sede": 1}))
    with pytest.raises(SchemaError, match="sede"):
        RunDir.open(run.path)
