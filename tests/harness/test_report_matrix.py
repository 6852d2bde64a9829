"""reports.matrix on literal rows: the exit code and what it says for a miss, a wrong cause, a dirty clean cell."""

from reports.matrix import matrix_verdict, render_matrix


def row(cell, expected, **fields):
    base = {"cell": cell, "expected": expected, "ok": True, "corrupted": 3, "corrupted_hits": 3, "hits": 10,
            "hammer": 12, "seconds": 5.0, "first_detection": 2, "t99_s": 4.0, "t99_low_s": 9.0, "rate_low": 0.1,
            "rate_high": 0.6, "top_verdict": expected, "top_share": 1.0, "verdicts": {expected: 3}, "windows": 1,
            "failures_per_window": 3.0, "upper_95": 0.3}
    return {**base, **fields}


def test_a_matrix_with_every_cell_ok_exits_0():
    """All detected and attributed, clean clean: exit 0, no problems."""
    rows = [row("donate=transfer", "poisoned-after-donate"),
            row("clean", None, corrupted=0, corrupted_hits=0, verdicts={}, top_verdict=None, first_detection=None)]
    assert matrix_verdict(rows) == (0, [])


def test_a_miss_a_wrong_cause_and_a_dirty_clean_cell_each_fail_the_matrix():
    """Each problem is named with its numbers; the exit code is 1."""
    rows = [row("page_cow=off", "cow-violation", ok=False, corrupted=0, corrupted_hits=0, top_verdict=None,
                top_share=None, first_detection=None),
            row("metadata_fence=off", "stale-metadata", ok=False, top_verdict="state-clean", top_share=0.8),
            row("clean", None, ok=False, corrupted=2, corrupted_hits=2, verdicts={"state-clean": 2})]
    code, problems = matrix_verdict(rows)
    assert code == 1 and len(problems) == 3
    assert problems[0] == "page_cow=off: not detected in 12 requests (5.0 s)"
    assert problems[1] == "metadata_fence=off: attributed to state-clean (80%), expected stale-metadata"
    assert problems[2] == "clean: 2 corrupted request(s) on the clean engine"
    text = render_matrix(rows)
    assert "NO" in text and "WRONG" in text and "CORRUPTED" in text


def test_the_matrix_junit_has_a_testcase_per_cell_and_fails_the_bad_ones(tmp_path):
    """One testcase per cell; only the cell with a problem carries a failure naming it and its run."""
    import xml.etree.ElementTree as ET

    from hammer.junit import Case, write_suite
    from reports.matrix import matrix_cases

    rows = [row("donate=transfer", "poisoned-after-donate", run="runs/a"),
            row("page_cow=off", "cow-violation", ok=False, corrupted_hits=0, run="runs/b")]
    cases = [Case("faults", cell, failure, run, seconds) for cell, failure, run, seconds in matrix_cases(rows)]
    suite = ET.parse(write_suite("hammer-faults", cases, tmp_path / "junit.xml")).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    by_name = {c.get("name"): c for c in suite}
    assert by_name["donate=transfer"].find("failure") is None
    failure = by_name["page_cow=off"].find("failure")
    assert failure.get("message").startswith("page_cow=off: not detected") and failure.text == "runs/b"
