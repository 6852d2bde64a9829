"""The fault matrix at CI size (``hammer faults --quick``): every planted fault is caught and blamed on its
cause, and the clean engine shows nothing. This is the project's main acceptance test (DESIGN.md §4)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hammer.cli import main
from hammer.matrix import CELLS, CLEAN
from mini_engine.faults import EXTRA_FAULTS, FAULTS


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix")
    result = CliRunner().invoke(main, ["faults", "--quick", "--out", str(out)])
    return result, out


def test_the_matrix_covers_the_whole_catalogue():
    """One cell per fault of the catalogue and per extra fault, plus the clean engine; each fault cell names the
    verdict it must get."""
    assert {n for n, c in CELLS.items() if not c.extra} == {*FAULTS, CLEAN}
    assert {n for n, c in CELLS.items() if c.extra} == set(EXTRA_FAULTS)
    assert all(cell.expected for cell in CELLS.values() if cell.faults)
    assert CELLS[CLEAN].expected is None


def test_every_fault_is_detected_and_attributed_and_clean_is_clean(matrix):
    """Exit 0; per fault cell >= 1 corrupted hit and >= 95% of them with the expected verdict; clean: 0 corrupted."""
    result, out = matrix
    assert result.exit_code == 0, result.output
    rows = {row["cell"]: row for row in json.loads((out / "matrix_rows.json").read_text())}
    assert set(rows) == {n for n, c in CELLS.items() if not c.extra}
    for name, row in rows.items():
        if name == CLEAN:
            assert row["corrupted"] == 0 and row["hits"] > 0 and row["upper_95"] < 0.25
        else:
            assert row["corrupted_hits"] >= 1 and row["first_detection"] >= 1, row
            assert row["top_verdict"] == CELLS[name].expected and row["top_share"] >= 0.95, row
            assert row["t99_s"] is not None and row["t99_low_s"] >= row["t99_s"]
    assert "every fault detected and attributed" in result.output


def rows_of(out):
    return json.loads((out / "matrix_rows.json").read_text())


def test_the_matrix_writes_its_table_and_one_report(matrix):
    """matrix.md (one row per cell), a run directory per cell and a combined report over all of them."""
    _, out = matrix
    table = (out / "matrix.md").read_text().splitlines()
    assert table[0].startswith("| cell | detected |") and len(table) == 2 + len(rows_of(out))
    assert len(json.loads((out / "matrix.json").read_text())["cells"]) == len(rows_of(out))
    assert (out / "report" / "report.html").exists() and (out / "report" / "report.md").exists()


def test_bad_matrix_options_name_the_option(tmp_path):
    """An unknown cell, or --quick with --requests: exit 2, naming the option."""
    bad = CliRunner().invoke(main, ["faults", "--faults", "nope", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--faults" in bad.output and "unknown matrix cell(s) nope" in bad.output
    both = CliRunner().invoke(main, ["faults", "--quick", "--requests", "4", "--out", str(tmp_path)])
    assert both.exit_code == 2 and "--quick" in both.output


def test_safeguards_outside_the_catalogue_are_caught_and_named(tmp_path):
    """restore_rec=off (a restore that drops the recurrent state; every pattern, nothing tuned for it) and
    free_unfenced=on (a free that forgets the ops in flight; free-reuse): both detected, and attribution names
    the incomplete restore and the slot freed under its pending clone from their checksums."""
    result = CliRunner().invoke(main, ["faults", "--quick", "--faults", "restore_rec=off,free_unfenced=on",
                                       "--no-report", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = {row["cell"]: row for row in rows_of(tmp_path)}
    assert rows["restore_rec=off"]["top_verdict"] == "restore-incomplete"
    assert rows["free_unfenced=on"]["top_verdict"] == "freed-in-flight"
    for row in rows.values():
        assert row["corrupted_hits"] >= 1 and row["top_share"] >= 0.95, row


def test_dtype_reaches_every_cell(tmp_path):
    """--dtype bfloat16: the matrix records it and each cell's engine runs it (its meta.json)."""
    result = CliRunner().invoke(main, ["faults", "--faults", "clean", "--requests", "4", "--dtype", "bfloat16",
                                       "--no-report", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output  # the clean cell stays clean in bfloat16 (ground-truth oracle)
    matrix = json.loads((tmp_path / "matrix.json").read_text())
    assert matrix["dtype"] == "bfloat16"
    run = matrix["cells"][0]["run"]
    meta = json.loads((Path(run) / "meta.json").read_text())
    assert meta["engine"]["dtype"] == "bfloat16" and meta["target"]["exact"] is False


def test_each_fault_parts_its_hits_from_their_controls_where_its_mechanism_acts(matrix):
    """attribution.json says where each corrupted hit first parted from its cold control (the two ledgers): a fault
    on the restore path (wrong bytes restored: transfer, a raced restore, a snapshot nobody wrote, an evicted one)
    at the end of the hit's first forward after the restore, every time; a shared page written in place at a later
    forward, every time (a decode step reads the overwritten keys); stale decode metadata at a later forward at
    least once."""
    _, out = matrix

    def where(cell):
        (path,) = (out / cell.replace("=", "-") / "last").resolve().glob("attribution.json")
        parted = json.loads(path.read_text())["parted"]
        assert parted, cell
        return [None if p["state_at"] is None else "first" if p["first_forward"] else "later" for p in parted]

    for cell in ("donate=transfer", "admission_barrier=off", "track_writer=off", "evict_locked=on"):
        assert set(where(cell)) == {"first"}, cell
    assert set(where("page_cow=off")) == {"later"}
    assert "later" in where("metadata_fence=off")
