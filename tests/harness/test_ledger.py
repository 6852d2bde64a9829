"""The public ledger schema and the log-line adapter: a foreign engine's log is attributed like ours."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics import SchemaError
from forensics.ledger import attribute_streams, log_line, parse_log_lines, streams, validate_row

FOREIGN_LOG = """\
2026-12-02 10:00:01 INFO scheduler: batch 41 built (3 reqs)
2026-12-02 10:00:01 DEBUG LEDGER slot_write rid=req-A slot=7 position=128 checksum=0x1111 batch=41
2026-12-02 10:00:01 DEBUG LEDGER donate rid=req-A slot=7 position=128 prefix=9f00aa policy=transfer
2026-12-02 10:00:01 DEBUG LEDGER reference_state prefix=9f00aa position=128 checksum=0x1111
2026-12-02 10:00:02 DEBUG LEDGER slot_write rid=req-A slot=7 position=129 checksum=0x2222 batch=42
2026-12-02 10:00:02 INFO radix: hit 128 tokens for req-B
2026-12-02 10:00:02 DEBUG LEDGER restore rid=req-B src=7 dst=3 position=128 prefix=9f00aa
2026-12-02 10:00:02 DEBUG LEDGER restore_read rid=req-B src=7 dst=3 position=128 src_checksum=0x2222 checksum=0x2222
"""


def test_adapter_parses_a_foreign_log_and_attributes_the_planted_late_write():
    """Only LEDGER lines become rows, numbered in order; the late write after a transfer is found."""
    rows = parse_log_lines(FOREIGN_LOG.splitlines())
    assert [r["type"] for r in rows] == ["slot_write", "donate", "reference_state", "slot_write", "restore",
                                         "restore_read"]
    assert rows[0]["checksum"] == 0x1111 and rows[1]["prefix"] == "9f00aa" and rows[-1]["seq"] == 6
    (verdict,) = attribute_streams(rows, ["req-B"]).verdicts
    assert verdict.verdict == "poisoned-after-donate"
    assert any(r.get("position") == 129 for r in verdict.evidence)  # the write that poisoned it


def test_digits_only_prefixes_stay_text():
    """A prefix digest made only of digits is still the same text key as in JSON rows."""
    (row,) = parse_log_lines(["LEDGER reference_state prefix=1234 position=64 checksum=5"])
    assert row["prefix"] == "1234" and row["checksum"] == 5


@pytest.mark.parametrize("line, message", [
    ("LEDGER nonsense slot=1", "unknown"),
    ("LEDGER donate rid=a slot=1 position=64", "lacks prefix, policy"),
    ("LEDGER alloc slot", "not key=value"),
])
def test_bad_rows_name_the_line_and_the_field(line, message):
    """A malformed ledger line is an error naming its line number and what is wrong."""
    with pytest.raises(SchemaError, match=f"line 2: .*{message}"):
        parse_log_lines(["ordinary log line", line])


def test_rows_are_attributed_within_their_own_engine_stream():
    """seq restarts per (engine, round): a request is judged only against its own stream's rows."""
    rows = parse_log_lines(FOREIGN_LOG.splitlines())
    clean = [{**r, "round": 1, "rid": str(r.get("rid", "")).replace("req-", "clean-"),
              **({"src_checksum": 0x1111, "checksum": 0x1111} if r["type"] == "restore_read" else {})}
             for r in rows if r["type"] != "slot_write" or r["position"] == 128]
    mine = [{**r, "round": 0} for r in rows]
    assert set(streams(clean + mine)) == {(None, 0), (None, 1)}
    verdicts = attribute_streams(clean + mine, ["req-B", "clean-B"]).verdicts
    assert [v.verdict for v in verdicts] == ["poisoned-after-donate", "state-clean"]
    with pytest.raises(SchemaError, match="integer 'seq'"):
        validate_row({"type": "fault", "name": "x"})


def test_a_stale_decode_of_another_request_explains_a_victim_with_clean_metadata():
    """A decode that read stale mappings writes into pages it does not own: the request whose own reads
    were clean but finished after that stale decode gets stale-metadata with the offending row; one that
    ended before it stays state-clean."""
    rows = [{"type": "decode_metadata", "seq": 1, "rid": "early", "read_checksum": 1, "staged_checksum": 1,
             "match": True},
            {"type": "decode_metadata", "seq": 2, "rid": "culprit", "read_checksum": 7, "staged_checksum": 8,
             "match": False},
            {"type": "decode_metadata", "seq": 3, "rid": "victim", "read_checksum": 5, "staged_checksum": 5,
             "match": True}]
    verdicts = {v.request: v for v in attribute_streams(rows, ["victim", "early"]).verdicts}
    assert verdicts["victim"].verdict == "stale-metadata" and verdicts["victim"].evidence[0]["rid"] == "culprit"
    assert verdicts["early"].verdict == "state-clean"


def test_a_bad_donation_from_a_corrupted_donor_is_inherited_and_confirms_no_writer_bug():
    """The donated bytes differ from the cold reference, but the donor was itself corrupted: the verdict is
    bad-at-donate inherited from it, and the writer-bug hypothesis is not confirmed by it."""
    rows = [{"type": "slot_write", "seq": 1, "rid": "donor", "slot": 3, "position": 64, "checksum": 11},
            {"type": "donate", "seq": 2, "rid": "donor", "slot": 3, "position": 64, "prefix": "p", "policy": "transfer"},
            {"type": "reference_state", "seq": 3, "prefix": "p", "position": 64, "checksum": 12},
            {"type": "restore_read", "seq": 4, "rid": "victim", "src": 3, "dst": 5, "position": 64,
             "src_checksum": 11, "checksum": 11}]
    alone = attribute_streams(rows, ["victim"])
    assert alone.verdicts[0].inherited is None
    assert {h["hypothesis"]: h["status"] for h in alone.hypotheses}["bad-at-donate"] == "confirmed"
    both = attribute_streams(rows + [{"type": "decode_metadata", "seq": 5, "rid": "donor", "read_checksum": 1,
                                      "staged_checksum": 1, "match": True}], ["victim", "donor"])
    victim = next(v for v in both.verdicts if v.request == "victim")
    assert victim.verdict == "bad-at-donate" and victim.inherited == "donor"
    status = {h["hypothesis"]: h for h in both.hypotheses}["bad-at-donate"]
    assert status["status"] != "confirmed" and "poison passed on" in status["detail"]


SENT = "hammer-5eed0001"  # the run's X-Request-Id prefix (meta.target.request_ids)


@pytest.mark.parametrize("rid, renamed", [
    (f"{SENT}-r1", "r1"),  # the header as the server's own id
    (f"cmpl-{SENT}-r1", "r1"),  # behind a prefix (vLLM, mini-engine)
    (f"chatcmpl-{SENT}-r1-9f8e7d6c", "r1"),  # and a random suffix (vLLM since late 2025)
    (f"1_cmpl-{SENT}-r1-9f8e7d6c", "r1#1"),  # vLLM's child of a parallel-sampling request: choice 1
    (f"cmpl-{SENT}-r1#2", "r1#2"),  # mini-engine's choice 2
    (f"cmpl-{SENT}-r1-c000-9f8e7d6c", "r1-c000"),  # the longest sent id wins: not r1 with a suffix
    ("srv-7", "r2"),  # the response id the run recorded (server_id)
    ("echoed-3", "r3"),  # the request_id the server echoed (forensics)
    (f"x{SENT}-r1", f"x{SENT}-r1"),  # not at a boundary: another client's id, kept
    (f"cmpl-{SENT}-r9", f"cmpl-{SENT}-r9"),  # an id this run never sent: kept
    ("cmpl-hammer-0ther000-r1", "cmpl-hammer-0ther000-r1"),  # another run's: kept
])
def test_a_servers_rows_are_renamed_by_any_id_it_knew_the_request_by(tmp_path, rid, renamed):
    """``hammer analyze --ledger-log``: a row's rid names a run's request if it holds the X-Request-Id the request was
    sent with (under whatever the server wrapped it in), the id its response carried, or the id it echoed."""
    from forensics import RunDir, RunMeta
    from hammer.ledger_logs import attach_ledger_logs

    run = RunDir.create(tmp_path, RunMeta(target={"kind": "http", "request_ids": SENT}, patterns=(),
                                          seeds={"pattern": 0}))
    with run.writer() as history:
        for name, ended in (("r1", {}), ("r1-c000", {}), ("r2", {"server_id": "srv-7"}),
                            ("r3", {"forensic": {"request_id": "echoed-3"}})):
            history.append("invoke", name, arm="hammer", key=name)
            history.append("ok", name, text="x", **ended)
    log = tmp_path / "server.jsonl"
    log.write_text(json.dumps({"type": "slot_write", "rid": rid, "slot": 1, "position": 5, "checksum": 7}) + "\n"
                   + json.dumps({"type": "slot_write", "rid": f"{SENT}-r3", "slot": 2, "position": 5, "checksum": 8})
                   + "\n")
    attach_ledger_logs(run.path, log)
    assert [row["rid"] for row in run.ledger()] == [renamed, "r3"]


# Text that prints (what a log line can hold): str.isprintable()'s characters, the space included.
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"),
                             include_characters=" "), max_size=12)
ROWS = st.one_of(
    st.fixed_dictionaries({"type": st.just("slot_write"), "seq": st.integers(0, 10**9), "rid": TEXT,
                           "slot": st.integers(0, 4096), "position": st.integers(0, 10**6),
                           "checksum": st.integers(0, 2**64 - 1)}, optional={"step": st.integers(0, 10**6)}),
    st.fixed_dictionaries({"type": st.just("donate"), "seq": st.integers(0, 10**9), "rid": TEXT,
                           "slot": st.integers(0, 9), "position": st.integers(0, 10**6), "prefix": st.sampled_from(["1234", "9f00aa", "0x10"]),
                           "policy": st.sampled_from(["copy", "transfer"])}),
    st.fixed_dictionaries({"type": st.just("fault"), "seq": st.integers(0, 10**9), "name": TEXT,
                           "site": st.sampled_from(["restore", "finish donation"]), "fired": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("checksum_format"), "seq": st.integers(0, 10**9),
                           "state": st.one_of(TEXT, st.just("hash32x2:conv|rec|rows-by-token"), st.just("1234"))}),
)


@settings(max_examples=200, deadline=None)
@given(row=ROWS)
def test_a_logged_row_reads_back_as_itself(row):
    """``log_line`` then ``parse_log_lines``: the same row, whatever its text (spaces, quotes, '=', digits-only ids),
    with a server's own words before LEDGER on the line."""
    assert parse_log_lines([f"2026-12-05 10:00:00 DEBUG engine: {log_line(row)}"]) == [row]


@pytest.mark.parametrize("row, field", [
    ({"type": "slot_write", "rid": "r", "slot": 1, "position": 2, "checksum": None}, "checksum"),
    ({"type": "slot_write", "rid": "r", "slot": 1.5, "position": 2, "checksum": 3}, "slot"),
    ({"type": "fault", "name": "x", "details": {"a": 1}}, "details"),
    ({"type": "fault", "name": True}, "name"),
    ({"type": "fault", "name": "x", "site": "17"}, "site"),  # would read back as the number 17
    ({"type": "fault", "name": "x", "bad key": 1}, "bad key"),
    ({"type": "fault", "name": "two\nlines"}, "name"),
    ({"type": "slot_write", "rid": "r", "slot": 1}, "lacks"),  # a required field missing
])
def test_a_row_the_log_form_cannot_carry_is_refused_naming_the_field(row, field):
    with pytest.raises(SchemaError, match=field):
        log_line(row)


def test_a_digest_that_never_landed_is_not_evidence():
    """A state digest of 0 (``UNLANDED``: its lane sums never landed, as when the engine's digest rows were zeroed
    before their copy ran) is the instrumentation failing: a restore whose read or whose donated bytes read 0 is
    ``ledger-unlanded``, not poisoned; with real digests the same ledger convicts; the post-mortem counts them."""
    from forensics.attribute import UNLANDED, attribute, unlanded
    from forensics.postmortem import render

    def ledger(read: int, cloned: int = 0x1111) -> list[dict]:
        return [{"type": "clone_written", "seq": 1, "src": 2, "dst": 7, "position": 128, "checksum": cloned,
                 "src_checksum": cloned},
                {"type": "donate", "seq": 2, "rid": "req-A", "slot": 7, "position": 128, "prefix": "9f",
                 "policy": "copy"},
                {"type": "restore", "seq": 3, "rid": "req-B", "src": 7, "dst": 3, "position": 128, "prefix": "9f"},
                {"type": "restore_read", "seq": 4, "rid": "req-B", "src": 7, "dst": 3, "position": 128,
                 "src_checksum": read, "checksum": read}]

    (blind,) = attribute(ledger(read=UNLANDED), ["req-B"]).verdicts
    assert blind.verdict == "ledger-unlanded" and blind.evidence[-1]["type"] == "restore_read"
    assert [r["seq"] for r in unlanded(ledger(read=UNLANDED))] == [4]
    (blind_clone,) = attribute(ledger(read=0x1111, cloned=UNLANDED), ["req-B"]).verdicts
    assert blind_clone.verdict == "ledger-unlanded" and blind_clone.evidence[-1]["type"] == "clone_written"
    reference = {"type": "reference_state", "seq": 5, "prefix": "9f", "position": 128, "checksum": UNLANDED}
    (blind_reference,) = attribute([*ledger(read=0x1111), reference], ["req-B"]).verdicts
    assert blind_reference.verdict == "ledger-unlanded" and blind_reference.evidence[-1] == reference
    (convicted,) = attribute(ledger(read=0x2222), ["req-B"]).verdicts
    assert convicted.verdict == "poisoned-after-donate" and unlanded(ledger(read=0x2222)) == []
    pm = {"run": "r", "target": {}, "faults": [], "seeds": {}, "counts": {}, "verdicts": [], "hypotheses": [],
          "windows": [], "slots": []}
    assert "LEDGER: 3 state digest(s) read 0" in render({**pm, "unlanded": 3})
    assert "LEDGER:" not in render(pm) and "LEDGER:" not in render({**pm, "unlanded": 0})
