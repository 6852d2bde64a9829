"""reports.tables: a row per request choice with run and timing context, and honest grouped rates."""

import pytest

from forensics import RunDir, RunMeta
from hammer.patterns import generate_ops
from reports.tables import RATE_COLUMNS, export, load_run, load_runs, rates
from tests.harness.fakes import simulate


def stored_run(root, *, corrupt=lambda op, hit: False, faults=(), seed=3, target=None):
    meta = RunMeta(target=target or {"kind": "embedded"}, patterns=({"name": "alternate-abandon", "settings": {}},),
                   seeds={"pattern": seed}, faults=faults)
    run = RunDir.create(root, meta)
    simulate(generate_ops("alternate-abandon", seed, 12), run.history_path, corrupt=corrupt,
             output=lambda op, choice: f"answer {op.key[:8]}")  # long enough to be abandoned after 4
    return run.path


def test_one_row_per_request_with_run_columns(tmp_path):
    """Every invoked request gets a row carrying its run, faults and seeds; abandoned ones are marked."""
    path = stored_run(tmp_path, faults=("donate=transfer",))
    frame = load_run(path)
    assert len(frame) == len(set(frame["request"])) and (frame["faults"] == "donate=transfer").all()
    assert (frame["run"] == path.name).all() and set(frame["seeds"]) == {"pattern=3"}
    assert frame["abandoned"].sum() == 6 and not frame.loc[frame["abandoned"], "corrupted"].any()


def test_rates_count_only_completed_hammer_requests(tmp_path):
    """Planted corruption on every hit shows as corrupted/hits with intervals; cold requests stay clean."""
    path = stored_run(tmp_path, corrupt=lambda op, hit: hit)
    table = rates(load_run(path), by=["hit"]).set_index("hit")
    assert list(table.columns) == list(RATE_COLUMNS)
    hits, cold = table.loc[True], table.loc[False]
    assert hits["corrupted"] == hits["requests"] > 0 and hits["rate"] == 1.0
    assert cold["corrupted"] == 0 and 0 < cold["wilson_high"] < 1
    assert hits["wilson_low"] <= hits["rate"] <= hits["wilson_high"]


def test_an_inexact_engines_differences_are_reported_not_counted(tmp_path):
    """The table judges a run as its target said: on an engine that is not bit-exact (mini-engine on a
    GPU, any other server) a hit that differs from its control is a mismatch, not corruption."""
    exact = load_run(stored_run(tmp_path / "exact", corrupt=lambda op, hit: hit))
    inexact = load_run(stored_run(tmp_path / "inexact", corrupt=lambda op, hit: hit,
                                  target={"kind": "embedded", "exact": False}))
    assert exact["corrupted"].sum() > 0 and inexact["corrupted"].sum() == 0
    assert (inexact.loc[exact["corrupted"].fillna(False).to_numpy(), "reference"] == "mismatch").all()


def test_abandoned_neighbours_and_in_flight_context(tmp_path):
    """A request sent while an abandoned stream of its group was still open is marked as such."""
    frame = load_run(stored_run(tmp_path))
    assert frame["in_flight"].min() >= 0
    # the fake runs ops one after another: nothing overlaps, so no neighbour is ever in flight
    assert not frame["abandoned_neighbour"].any() and (frame["in_flight"] == 0).all()


def test_many_runs_concatenate_and_export(tmp_path):
    """Two runs load into one frame (grouped apart by their faults) and round-trip through CSV."""
    clean = stored_run(tmp_path / "a")
    broken = stored_run(tmp_path / "b", corrupt=lambda op, hit: hit, faults=("track_writer=off",))
    frame = load_runs([clean, broken])
    table = rates(frame, by=["faults"]).set_index("faults")
    assert table.loc["none", "corrupted"] == 0 and table.loc["track_writer=off", "corrupted"] > 0
    out = export(table.reset_index(), tmp_path / "out" / "rates.csv")
    assert out.read_text().splitlines()[0].startswith("faults,requests,corrupted")


def test_an_empty_history_gives_empty_tables(tmp_path):
    """A run killed before its first request loads as an empty frame and an empty rate table."""
    run = RunDir.create(tmp_path, RunMeta(target={"kind": "http"}, patterns=(), seeds={}))
    assert load_run(run.path).empty
    assert rates(load_run(run.path)).empty
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_run(tmp_path / "missing")


def test_parquet_export_round_trips_typed_columns(tmp_path):
    """The per-request table survives Parquet: same rows and columns, numbers and booleans stay typed,
    list cells (the oracles that fired) come back as JSON text; an unknown suffix is refused."""
    import json

    import pandas as pd

    frame = load_run(stored_run(tmp_path, corrupt=lambda op, hit: hit))
    back = pd.read_parquet(export(frame, tmp_path / "requests.parquet"))
    assert list(back.columns) == list(frame.columns) and len(back) == len(frame)
    assert back["corrupted"].dtype == bool and back["corrupted"].sum() == frame["corrupted"].sum() > 0
    fired = back.loc[back["corrupted"], "fired"].map(json.loads)
    assert fired.map(len).min() >= 1
    with pytest.raises(ValueError, match=r"\.csv or \.parquet"):
        export(frame, tmp_path / "requests.xlsx")
