"""Attribution names the planted cause: each fault's corrupted hits get its verdict from ledger data.

The ledger is the engine's own instrumentation (checksums computed where the slots live, reference
states recomputed cold); ``forensics.attribute`` never sees which fault was planted.
"""

import pytest

from forensics.attribute import attribute
from forensics.ledger import validate_row
from tests.engine import fault_schedules as fs


def donors_freed_under_their_clones(seed: int, donors: int = 8, newcomers: int = 6) -> list[fs.Submit]:
    """One-token donors free their snapshot slots in the step their clones are queued; identical cold
    newcomers take those slots one step later; every donor's prompt is hit once all is quiet."""
    rnd = fs.random.Random(seed)
    prompts = [tuple(fs.tokens(rnd, 95)) for _ in range(donors)]
    newcomer, one = tuple(fs.tokens(rnd, 95)), fs.SamplingParams(max_tokens=1)
    return ([fs.Submit(f"d{j}", p, one) for j, p in enumerate(prompts)]
            + [fs.Submit(f"n{k}", newcomer, one, at_step=1) for k in range(newcomers)]
            + [fs.Submit(f"h{j}", p, fs.SamplingParams(max_tokens=4), at_step=4) for j, p in enumerate(prompts)])


CASES = [  # fault, schedule, config, expected verdict, hypotheses that must be falsified
    ("donate=transfer", "transfer_schedule", {"overlap": True}, "poisoned-after-donate", ["bad-at-donate"]),
    ("track_writer=off", fs.donate_then_hit_later, {}, "bad-at-donate", ["poisoned-after-donate"]),
    ("admission_barrier=off", fs.donations_then_hits, {}, "restore-raced", []),
    ("evict_locked=on", fs.hit_and_newcomer_under_slot_pressure, {"max_running": 2, "num_slots": 6},
     "evicted-under-lock", []),
    ("metadata_fence=off", fs.donations_then_hits, {}, "stale-metadata", ["bad-at-donate"]),
    ("page_cow=off", fs.sampled_choices, {}, "cow-violation", []),
    ("free_unfenced=on", donors_freed_under_their_clones, {}, "freed-in-flight",
     ["bad-at-donate", "poisoned-after-donate"]),
]


@pytest.fixture(scope="module")
def cold(tiny_model):
    return fs.ColdReference(tiny_model)


def failing_run(model, cold, schedule, fault, config, seeds=range(40)):
    for seed in seeds:
        result = fs.run(model, schedule(seed), faults=[fault], seed=seed, reference_states=True, **config)
        wrong = fs.wrong_hits(result, cold)
        if wrong:
            return result, wrong
    pytest.fail(f"{fault}: no failing seed")


@pytest.mark.parametrize("fault, schedule, config, expected, falsified", CASES, ids=[c[0] for c in CASES])
def test_each_fault_gets_its_verdict(tiny_model, cold, reference, fault, schedule, config, expected, falsified):
    """>= 95% of a fault's corrupted hits get the fault's verdict, its hypothesis is confirmed, and every
    ledger row the engine wrote follows the public schema."""
    if schedule == "transfer_schedule":
        def schedule(seed):
            first = tuple(reference(fs.tokens(fs.random.Random(seed), 44), 10))
            return fs.finish_at_page_boundary(seed, first)
    result, wrong = failing_run(tiny_model, cold, schedule, fault, config)
    for row in result.events:
        validate_row(row)  # the engine speaks the public ledger schema
    report = attribute(result.events, wrong)
    verdicts = [v.verdict for v in report.verdicts]
    assert verdicts.count(expected) >= 0.95 * len(verdicts), verdicts
    status = {h["hypothesis"]: h["status"] for h in report.hypotheses}
    assert status[expected] == "confirmed"
    assert all(status[name] == "falsified" for name in falsified), status
    assert all(v.evidence for v in report.verdicts if v.verdict == expected)


def test_writer_bug_alone_falsifies_aliasing_and_both_faults_are_told_apart(tiny_model, cold, reference):
    """The first seed re-enacted: track_writer=off alone falsifies aliasing; with donate=transfer too,
    both causes are reported, each on its own failures."""
    def schedule(seed):
        first = tuple(reference(fs.tokens(fs.random.Random(seed), 44), 10))
        return fs.donate_then_hit_later(seed) + [
            fs.Submit(f"t{s.rid}", s.prompt, s.params, s.at_step + 100) for s in fs.finish_at_page_boundary(seed, first)]
    result, wrong = failing_run(tiny_model, cold, schedule, "track_writer=off", {})
    alone = {h["hypothesis"]: h["status"] for h in attribute(result.events, wrong).hypotheses}
    assert alone["bad-at-donate"] == "confirmed" and alone["poisoned-after-donate"] == "falsified"
    for seed in range(16):
        both = fs.run(tiny_model, schedule(seed), faults=["track_writer=off", "donate=transfer"], seed=seed,
                      reference_states=True, overlap=True)
        verdicts = {v.verdict for v in attribute(both.events, fs.wrong_hits(both, cold)).verdicts}
        if {"bad-at-donate", "poisoned-after-donate"} <= verdicts:
            return
    pytest.fail("no seed showed both causes")


def test_clean_runs_have_no_verdicts_and_clean_state_is_said(tiny_model, cold):
    """With every safeguard on nothing is corrupted; a hit judged wrong anyway is 'state-clean'."""
    result = fs.run(tiny_model, fs.donations_then_hits(0), reference_states=True)
    assert fs.wrong_hits(result, cold) == [] and attribute(result.events, []).verdicts == ()
    (verdict,) = attribute(result.events, ["h0"]).verdicts
    assert verdict.verdict == "state-clean"


def test_without_a_ledger_every_hypothesis_is_untested():
    """No ledger rows: nothing can be confirmed or falsified, and the verdict says the state looked clean."""
    report = attribute([], ["r1"])
    assert [v.verdict for v in report.verdicts] == ["state-clean"]
    assert {h["status"] for h in report.hypotheses} == {"untested"}
    assert attribute([], ["r1"], echo_failed=["r1"]).verdicts[0].verdict == "key-or-payload"


def test_a_clone_that_read_its_source_after_the_free_is_freed_in_flight_not_a_writer_bug():
    """The donor wrote the reference bytes, freed the slot, its next owner took it, and only then did the clone
    read it (other bytes): freed-in-flight, proven by the write, the free and the alloc; the same rows without
    the free leave the bad donation unexplained by reuse (bad-at-donate)."""
    rows = [{"type": "snapshot_write", "seq": 1, "rid": "donor", "slot": 8, "position": 64, "checksum": 11},
            {"type": "clone", "seq": 2, "src": 8, "dst": 2},
            {"type": "donate", "seq": 3, "rid": "donor", "slot": 2, "position": 64, "prefix": "p", "policy": "copy"},
            {"type": "reference_state", "seq": 4, "prefix": "p", "position": 64, "checksum": 11},
            {"type": "free", "seq": 5, "slot": 8, "owner": "donor", "role": "pingpong"},
            {"type": "alloc", "seq": 6, "slot": 8, "owner": "newcomer", "role": "live"},
            {"type": "clone_written", "seq": 7, "src": 8, "dst": 2, "position": 64, "src_checksum": 99, "checksum": 99},
            {"type": "restore_read", "seq": 8, "rid": "victim", "src": 2, "dst": 5, "position": 64,
             "src_checksum": 99, "checksum": 99}]  # (the newcomer's bytes: any digest but 0, which is UNLANDED)
    for row in rows:
        validate_row(row)
    (verdict,) = attribute(rows, ["victim"]).verdicts
    assert verdict.verdict == "freed-in-flight"
    assert [r["type"] for r in verdict.evidence] == ["donate", "snapshot_write", "free", "alloc", "clone_written",
                                                     "restore_read"]
    (unfreed,) = attribute([r for r in rows if r["type"] != "free"], ["victim"]).verdicts
    assert unfreed.verdict == "bad-at-donate"
