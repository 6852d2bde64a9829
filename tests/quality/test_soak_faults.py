"""The soak catches the first seed's aliasing bug end to end: ``donate=transfer`` under overlap corrupts
hits, and only hits; the same soak with every safeguard on is clean; the failure replays exactly.

Why these settings: under ``transfer`` the only aliased slot is the live slot donated zero-copy at
finish, at a page-aligned length, when the request stopped with a decode already in flight. Only a
prompt that continues the request's actual reply restores that snapshot -- the ``follow-up``
pattern. With 1-token pages (SGLang's default) every early stop is page-aligned; with 16-token
pages one in sixteen is, too rare for a small test.
"""

import json

import pytest
from click.testing import CliRunner

from forensics import RunDir
from hammer.cli import main
from probes import check_run

SOAK = ["soak", "--pattern", "follow-up", "--pattern", "alternate-abandon", "--requests", "32", "--round-size", "16",
        "--overlap", "--page-size", "1", "--num-pages", "8192", "--seed", "3"]


@pytest.fixture(scope="module")
def soaks(tmp_path_factory):
    out = {}
    for name, faults in (("clean", []), ("transfer", ["--fault", "donate=transfer"])):
        root = tmp_path_factory.mktemp(name)
        result = CliRunner().invoke(main, [*SOAK, *faults, "--out", str(root)])
        out[name] = (result, (root / "last").resolve())
    return out


def test_the_clean_soak_finds_no_corruption(soaks):
    """Every safeguard on, overlap on: hits and abandoned streams, 0 corrupted, exit 0."""
    result, run = soaks["clean"]
    assert result.exit_code == 0, result.output
    counts = json.loads((run / "summary.json").read_text())["counts"]
    assert counts["corrupted"] == 0 and counts["hits"] >= 20 and counts["abandoned"] >= 8


def test_transfer_under_overlap_corrupts_hits_only_and_the_reference_oracle_says_so(soaks):
    """donate=transfer --overlap: corrupted hits, never a corrupted cold request, each fired by the reference."""
    result, run = soaks["transfer"]
    assert result.exit_code == 1, result.output
    analysis = check_run(run)
    corrupted = analysis.corrupted
    assert corrupted and all(row.hit for row in corrupted)
    assert all("reference" in row.fired for row in corrupted)
    assert not [row for row in analysis.rows if row.corrupted and not row.hit]
    assert {row.pattern for row in corrupted} == {"follow-up"}  # identical prompts never reach a finish donation
    faults = [e for e in RunDir.open(run).history() if e["type"] == "fault"]
    assert faults and {(e["name"], e["site"]) for e in faults} == {("donate=transfer", "donate")}


def test_the_ledger_attributes_transfer_to_poisoning_after_donation(soaks):
    """attribution.json: poisoned-after-donate is confirmed; a bad-at-donate verdict only ever names a donor that
    was itself a corrupted hit (the poison passed on: a turn computed from a poisoned state donates bad state)."""
    _, run = soaks["transfer"]
    summary = json.loads((run / "summary.json").read_text())
    verdicts = json.loads((run / "attribution.json").read_text())["verdicts"]
    assert summary["hypotheses"]["poisoned-after-donate"] == "confirmed"
    assert set(summary["attribution"]) <= {"poisoned-after-donate", "bad-at-donate"}
    corrupted = set(summary["corrupted"])
    donors = [next(row["rid"] for row in v["evidence"] if row["type"] == "donate") for v in verdicts
              if v["verdict"] == "bad-at-donate"]
    assert all(donor in corrupted for donor in donors), donors


def test_a_corrupted_hit_replays_exactly(soaks):
    """hammer replay --request re-runs the failing round from meta.json and streams the same wrong tokens."""
    _, run = soaks["transfer"]
    request = check_run(run).corrupted[0].request
    result = CliRunner().invoke(main, ["replay", str(run), "--request", request])
    assert result.exit_code == 0 and "every token identical" in result.output, result.output
