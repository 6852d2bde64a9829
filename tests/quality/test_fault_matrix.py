"""The fault matrix at CI size (``hammer faults --quick``): every planted fault is caught and blamed on its
cause, and the clean engine shows nothing. This is the project's main acceptance test (DESIGN.md §4)."""

import json

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
    """One cell per fault of the catalogue, plus the clean engine; each names the verdict it must get."""
    assert {n for n, c in CELLS.items() if not c.extra} == {*FAULTS, CLEAN}
    assert {n for n, c in CELLS.items() if c.extra} == set(EXTRA_FAULTS)
    assert all(cell.expected for cell in CELLS.values() if not cell.extra and cell.faults)
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


def test_a_safeguard_outside_the_catalogue_is_caught_and_named(tmp_path):
    """restore_rec=off (a restore that drops the recurrent state), against every pattern with nothing tuned
    for it: detected, and attribution names the incomplete restore from its checksums."""
    result = CliRunner().invoke(main, ["faults", "--quick", "--faults", "restore_rec=off", "--no-report",
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (row,) = rows_of(tmp_path)
    assert row["corrupted_hits"] >= 1 and row["top_verdict"] == "restore-incomplete" and row["top_share"] >= 0.95
