"""Shrink and post-mortem on a real failing run: ``donate=transfer`` under overlap (the first seed's bug).

The soak is the quality soak's setting (tests/quality/test_soak_faults.py explains it), one round of
16 follow-up ops, which corrupts several hits. ``hammer shrink`` must cut it to <= 5 requests that
still fail with the same verdict, and the pytest file it writes must fail with the fault and pass
without it; ``hammer postmortem`` must name the cause and tell the story from the ledger.
"""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from forensics.divergence import Divergence
from hammer.cli import main

SOAK = ["soak", "--pattern", "follow-up", "--requests", "16", "--round-size", "16", "--overlap", "--page-size", "1",
        "--num-pages", "8192", "--seed", "3", "--no-report"]


@pytest.fixture(scope="module")
def transfer_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer")
    result = CliRunner().invoke(main, [*SOAK, "--fault", "donate=transfer", "--out", str(root)])
    assert result.exit_code == 1, result.output
    return (root / "last").resolve()


@pytest.fixture(scope="module")
def shrunk(transfer_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("shrunk")
    result = CliRunner().invoke(main, ["shrink", str(transfer_run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def _pytest(path, **env):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                          capture_output=True, text=True, env={**os.environ, **env}, cwd=path.parent, timeout=300)


def test_shrink_yields_at_most_five_requests_failing_the_same_way(transfer_run, shrunk):
    """The case fails with the first failure's verdict, and its own run directory shows it."""
    out, output = shrunk
    first = json.loads((transfer_run / "attribution.json").read_text())["verdicts"][0]["verdict"]
    case = json.loads((out / "case.json").read_text())
    assert 1 <= len(case["ops"]) <= 5 and case["verdict"] == first
    assert case["engine"]["faults"] == ["donate=transfer"]
    log = json.loads((out / "shrink.json").read_text())
    assert log["original_ops"] == 16 and log["ops"] == len(case["ops"])
    assert [v for _, v in log["failures"]].count(first) >= 1
    summary = json.loads((out / "runs" / "last" / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["counts"]["corrupted_hits"] >= 1
    assert f"-> {len(case['ops'])} request(s) failing with {first}" in output


def test_the_written_case_fails_with_the_fault_and_passes_without_it(shrunk):
    """The pytest file is the regression test: red while the safeguard is off, green once it is back."""
    out, _ = shrunk
    (test_file,) = out.glob("test_shrunk_*.py")
    red = _pytest(test_file)
    assert red.returncode == 1 and "corrupted hit(s)" in red.stdout, red.stdout[-2000:]
    green = _pytest(test_file, HAMMER_FAULTS="")
    assert green.returncode == 0, green.stdout[-2000:]


def test_the_shrunk_run_directory_replays(shrunk):
    """The case's run directory is an ordinary embedded run: replay re-executes it token for token."""
    out, _ = shrunk
    result = CliRunner().invoke(main, ["replay", str(out / "runs" / "last")])
    assert result.exit_code == 0 and "every token identical" in result.output, result.output


def test_postmortem_names_the_cause_with_windows_and_slot_stories(transfer_run):
    """Verdicts with the oracle that fired, aliasing confirmed and the barrier falsified, every sticky
    window's donation and its corrupted restores, and the donated slot's life story; text and JSON."""
    result = CliRunner().invoke(main, ["postmortem", str(transfer_run)])
    assert result.exit_code == 0, result.output
    text = (transfer_run / "postmortem.txt").read_text()
    assert result.output.startswith(text)
    pm = json.loads((transfer_run / "postmortem.json").read_text())
    status = {h["hypothesis"]: h["status"] for h in pm["hypotheses"]}
    assert status["poisoned-after-donate"] == "confirmed" and status["restore-raced"] == "falsified"
    assert all(v["hit"] and "reference" in v["fired"] for v in pm["verdicts"])
    assert {w["window"] for w in pm["windows"]} == {v["window"] for v in pm["verdicts"]}
    assert len(pm["windows"]) == len({w["window"] for w in pm["windows"]})  # one block per window
    for window in pm["windows"]:
        types = [item["row"]["type"] for item in window["timeline"]]
        assert types[0] == "donate" and "restore_read" in types and window["corrupted"] >= 1
    for window in pm["windows"]:  # the donated slot's story: allocated, ..., donated (this window's row), ...
        donation = window["timeline"][0]["row"]
        (story,) = [s for s in pm["slots"] if s["slot"] == window["slot"] and donation in s["rows"]]
        assert story["rows"][0]["type"] == "alloc" and story["rows"][-1]["type"] == "restore_read"
    assert "VERDICTS: " in text and "CORRUPTED hit" in text and "SLOT " in text
    assert (transfer_run / "report" / "report.html").exists()
    for verdict in pm["verdicts"]:  # the poisoned restore parts each hit's state from its control at its first forward
        parted = verdict["parted"]
        assert parted["state_at"] > parted["restored_at"] and parted["first_forward"], parted
        assert parted["packed"][1] == 1 and parted["token"] == 0  # a control runs alone; the first token differs
        assert f"{Divergence.from_dict(parted).describe()} [control {parted['control']}]" in text


def test_shrink_and_postmortem_refuse_what_they_cannot_do(tmp_path):
    """A clean run has nothing to shrink (exit 2, saying so); its post-mortem says there is nothing to attribute."""
    CliRunner().invoke(main, [*SOAK[:3], "--requests", "4", "--round-size", "4", "--out", str(tmp_path)])
    run = (tmp_path / "last").resolve()
    refused = CliRunner().invoke(main, ["shrink", str(run)])
    assert refused.exit_code == 2 and "no corrupted hit to shrink" in refused.output
    clean = CliRunner().invoke(main, ["postmortem", str(run), "--no-report"])
    assert clean.exit_code == 0 and "nothing to attribute" in clean.output
