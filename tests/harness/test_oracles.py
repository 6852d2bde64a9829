"""Oracles on literal histories: hits must equal their cold control; only real corruption is counted."""

import pytest

from forensics import RunDir, RunMeta, read_history
from hammer.patterns import generate_ops
from probes import ORACLES, check_history, check_run
from probes.oracles import Check
from tests.harness.fakes import simulate

PROBE = {"id": "p1", "family": "arithmetic", "expected": "433", "extract": "first_number", "group": "g",
         "max_tokens": 8}


class History:
    """Literal events, numbered as a writer would."""

    def __init__(self):
        self.events = []

    def add(self, kind, request, **fields):
        self.events.append({"type": kind, "index": len(self.events), "time": float(len(self.events)),
                            "request": request, **fields})
        return self

    def request(self, rid, text, *, arm="hammer", key="k1", cached=64, probe=PROBE, ids=None, **ok_fields):
        self.add("invoke", rid, arm=arm, key=key, probe=probe, pattern="saturate")
        return self.add("ok", rid, text=text, cached_tokens=0 if arm == "control-cold" else cached,
                        token_ids=ids, **ok_fields)


def _row(analysis, rid):
    return next(r for r in analysis.rows if r.request == rid)


def test_a_hit_identical_to_its_control_is_valid():
    """Same text as the cold control and the right answer: every oracle ok, nothing corrupted."""
    h = History().request("c", "433", arm="control-cold").request("h", "433")
    analysis = check_history(h.events)
    row = _row(analysis, "h")
    assert row.hit and not row.corrupted and all(c.valid is True for c in row.checks.values())
    assert analysis.valid is True and analysis.counts["hits"] == 1


def test_a_hit_that_differs_from_its_control_is_corrupted_by_the_reference():
    """One differing token id on a hit fires the reference oracle and makes the run invalid."""
    h = History().request("c", "433", arm="control-cold", ids=[52, 51, 51]).request("h", "433", ids=[52, 51, 50])
    analysis = check_history(h.events)
    row = _row(analysis, "h")
    assert row.corrupted and row.fired == ("reference",)
    assert row.checks["reference"].details["first_difference"] == 2
    assert analysis.valid is False and analysis.counts["corrupted_hits"] == 1


def test_a_wrong_control_makes_a_wrong_hit_model_wrong_not_corruption():
    """When the cold control is wrong too, ground truth says model-wrong and nothing is corrupted."""
    h = History().request("c", "432", arm="control-cold").request("h", "432")
    row = _row(check_history(h.events), "h")
    assert row.checks["ground_truth"].label == "model-wrong" and row.checks["ground_truth"].valid is False
    assert not row.corrupted


def test_a_wrong_hit_with_a_right_control_is_corrupted_by_ground_truth():
    """A right control and a wrong hit: ground truth fires (with the reference)."""
    h = History().request("c", "433", arm="control-cold").request("h", "17")
    row = _row(check_history(h.events), "h")
    assert set(row.fired) == {"reference", "ground_truth"}
    assert row.checks["ground_truth"].details["answer"] == "17"


def test_an_abandoned_request_is_never_corrupted():
    """Tokens that differ from the control on a stream closed on purpose are not judged."""
    h = History().request("c", "433", arm="control-cold")
    h.add("invoke", "a", arm="hammer", key="k1", probe=PROBE).add("token", "a", position=0, text="\ufffd")
    h.add("info", "a", reason="abandoned", tokens_received=1)
    analysis = check_history(h.events)
    row = _row(analysis, "a")
    assert row.abandoned and not row.corrupted and all(c.label == "abandoned" for c in row.checks.values())
    assert analysis.valid is True and analysis.counts["abandoned"] == 1


def test_a_crashing_oracle_reports_unknown_and_the_rest_still_run():
    """An oracle that raises gives 'unknown' for itself only; the run's verdict becomes unknown."""
    def broken(record, ctx):
        raise RuntimeError("checker bug")

    h = History().request("c", "433", arm="control-cold").request("h", "433")
    analysis = check_history(h.events, oracles={**ORACLES, "broken": broken})
    row = _row(analysis, "h")
    assert row.checks["broken"].valid == "unknown" and "checker bug" in row.checks["broken"].details["error"]
    assert row.checks["reference"].label == "ok" and analysis.valid == "unknown"


def test_an_oracle_returning_junk_is_unknown():
    """An oracle that returns something other than a Check is reported as an error, not trusted."""
    h = History().request("c", "433", arm="control-cold").request("h", "433")
    row = _row(check_history(h.events, oracles={"junk": lambda record, ctx: True}), "h")
    assert row.checks["junk"] == Check("unknown", "error", details=row.checks["junk"].details)


@pytest.mark.parametrize("text, oracle", [
    ("", "empty"),
    ("433<|im_end|><|im_start|>assistant", "special_leak"),
    ("433 " + "ab" * 20, "repetition"),
    ("4\ufffd\ufffd\x01\x02", "garbage"),
])
def test_content_forensics_catch_symptoms_the_control_does_not_show(text, oracle):
    """Empty output, special-token leaks, runaway repetition and garbage on a hit are found and counted."""
    h = History().request("c", "433", arm="control-cold").request("h", text)
    row = _row(check_history(h.events), "h")
    assert row.checks[oracle].label == "found" and oracle in row.fired


def test_content_symptoms_the_control_shares_are_model_wrong():
    """A special-token leak the cold control shows too is the model's, not the cache's."""
    leak = "433<|endoftext|>"
    h = History().request("c", leak, arm="control-cold").request("h", leak)
    row = _row(check_history(h.events), "h")
    assert row.checks["special_leak"].label == "model-wrong" and not row.corrupted


def test_without_a_control_the_reference_is_unknown():
    """A hit whose control never completed cannot be compared: unknown, not valid and not corrupted."""
    h = History().request("h", "433")
    h.add("invoke", "c", arm="control-cold", key="k1").add("fail", "c", error="HTTP 500")
    analysis = check_history(h.events)
    assert _row(analysis, "h").checks["reference"].label == "no-control"
    assert analysis.valid == "unknown" and not analysis.corrupted


def test_echo_catches_a_wrong_media_digest_and_a_cache_key_shared_by_two_payloads():
    """A returned media digest unlike the one sent, and one cache key for two payloads, fire the echo oracle."""
    h = History()
    h.request("c", "433", arm="control-cold", forensic={"cache_key": "K"})
    h.add("invoke", "a", arm="hammer", key="k1", payload="A", media_digest="aa", probe=PROBE)
    h.add("ok", "a", text="433", cached_tokens=64, forensic={"cache_key": "K", "media_digest": "bb"})
    h.add("invoke", "b", arm="hammer", key="k1", payload="B", probe=PROBE)
    h.add("ok", "b", text="433", cached_tokens=64, forensic={"cache_key": "K"})
    analysis = check_history(h.events)
    a, b = _row(analysis, "a"), _row(analysis, "b")
    assert a.fired == ("echo",) and any("media digest" in p for p in a.checks["echo"].details["problems"])
    assert b.fired == ("echo",) and "shared by 2" in b.checks["echo"].details["problems"][0]


def test_choices_are_compared_with_the_same_choice_of_the_control():
    """Choice 1 of an n=2 hit is compared with choice 1 of its n=2 control."""
    h = History()
    for rid, arm, second in (("c", "control-cold", "B"), ("h", "hammer", "X")):
        h.add("invoke", rid, arm=arm, key="k2", n=2)
        h.add("ok", rid, text="A", cached_tokens=64).add("ok", f"{rid}#1", text=second, cached_tokens=64)
    analysis = check_history(h.events)
    assert not _row(analysis, "h").corrupted and _row(analysis, "h#1").fired == ("reference",)


def test_same_tokens_from_different_logits_are_a_corrupted_hit_on_an_exact_engine():
    """Tokens equal to the control's but a different logits digest: reference fires (logits-mismatch) on an
    exact engine; equal digests, or a digest missing on either side, or an inexact engine, count nothing."""
    def run(hit_digest, control_digest="aaaa", exact=True):
        h = History().request("c", "433", arm="control-cold", ids=[52, 51, 51],
                              forensic={"logits_digest": control_digest} if control_digest else {})
        h.request("h", "433", ids=[52, 51, 51], forensic={"logits_digest": hit_digest} if hit_digest else {})
        return _row(check_history(h.events, exact=exact), "h")

    bad = run("bbbb")
    assert bad.corrupted and bad.fired == ("reference",) and bad.checks["reference"].label == "logits-mismatch"
    assert bad.checks["reference"].details["control_logits_digest"] == "aaaa"
    assert not run("aaaa").corrupted and not run(None).corrupted and not run("bbbb", None).corrupted
    assert not run("bbbb", exact=False).corrupted


def test_an_inexact_engine_reports_reference_mismatches_without_counting_them():
    """exact=False: a differing hit is reported as a mismatch but not as corruption."""
    h = History().request("c", "433 a", arm="control-cold").request("h", "433 b")
    row = _row(check_history(h.events, exact=False), "h")
    assert row.checks["reference"].label == "mismatch" and not row.corrupted


def test_controls_that_disagree_are_an_anomaly():
    """Two cold controls of one request with different outputs make the run unknown, naming them."""
    h = History().request("c1", "433", arm="control-cold").request("c2", "434", arm="control-cold")
    analysis = check_history(h.events)
    assert analysis.valid == "unknown" and "not reproducible" in analysis.anomalies[0]


def test_a_control_that_hit_the_cache_is_an_anomaly():
    """A control reporting cached tokens was not cold; the run says so and is not called valid."""
    h = History().request("c", "433", arm="control-cold")
    h.events[-1]["cached_tokens"] = 64
    h.request("h", "433")
    analysis = check_history(h.events)
    assert analysis.valid == "unknown" and "not run cold" in analysis.anomalies[0]


def test_verdict_rows_flatten_for_tables():
    """as_dict holds the documented columns and one label column per oracle."""
    h = History().request("c", "433", arm="control-cold").request("h", "x")
    row = _row(check_history(h.events), "h").as_dict()
    for column in ("request", "pattern", "probe_id", "family", "arm", "hit", "cached_tokens", "abandoned",
                   "corrupted", "fired", *ORACLES):
        assert column in row
    assert row["reference"] == "mismatch" and "reference" in row["details"]


@pytest.mark.parametrize("pattern", ["alternate-abandon", "branch-fanout", "media-ab", "chunk-boundary"])
def test_a_clean_fake_engine_gives_a_valid_run_and_planted_hit_corruption_is_caught(tmp_path, pattern):
    """Through the fake target: no corruption when exact; every planted hit corruption found, only those."""
    ops = generate_ops(pattern, 11, 16)
    clean = check_history(_events(ops, tmp_path / "a"))
    assert clean.valid is True and clean.counts["hits"] > 0
    planted = check_history(_events(ops, tmp_path / "b", corrupt=lambda op, hit: hit))
    corrupted = planted.corrupted
    assert planted.valid is False and corrupted and all(r.hit for r in corrupted)
    assert {r.request for r in corrupted} == {r.request for r in planted.rows if r.hit and r.outcome == "ok"}


def test_check_run_analyzes_a_partial_run_directory(tmp_path):
    """A run killed midway (a cut last line, a request never ended) is analyzed: pending, not corrupted."""
    run = RunDir.create(tmp_path, _meta("saturate"))
    simulate(generate_ops("saturate", 1, 4), run.history_path)
    with open(run.history_path, "a") as f:
        f.write('{"type":"invoke","index":999,"time":1.0,"request":"late","arm":"hammer","key":"z"}\n{"type":"o')
    analysis = check_run(run.path)
    assert _row(analysis, "late").outcome == "pending" and analysis.counts["pending"] == 1
    assert analysis.valid is True


def _meta(pattern):
    return RunMeta(target={"kind": "fake"}, patterns=({"name": pattern},), seeds={"pattern": 11})


def _events(ops, path, **kwargs):
    return read_history(simulate(ops, path, **kwargs))
