"""The history file: one writer, flushed per event, survives a killed run, resumes where it stopped."""

import json
import threading

import pytest

from forensics import HistoryWriter, SchemaError, fold_history, read_history


def _write_three(path):
    with HistoryWriter(path) as writer:
        writer.invoke("r1", arm="hammer", key="k1", prompt="hi", max_tokens=4)
        writer.token("r1", position=0, text="a", token_id=97)
        writer.ok("r1", text="a", token_ids=[97], finish_reason="stop", cached_tokens=0)


def test_round_trip_keeps_fields_and_numbers_events(tmp_path):
    """Events read back as written, with indices 0, 1, 2 and non-decreasing times."""
    path = tmp_path / "history.jsonl"
    _write_three(path)
    events = read_history(path)
    assert [e["type"] for e in events] == ["invoke", "token", "ok"]
    assert [e["index"] for e in events] == [0, 1, 2]
    assert events[0]["prompt"] == "hi" and events[2]["token_ids"] == [97]
    assert all(a["time"] <= b["time"] for a, b in zip(events, events[1:]))


def test_each_event_is_on_disk_while_the_writer_is_open(tmp_path):
    """A reader sees every appended event before the writer closes (flushed per event)."""
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    for i in range(3):
        writer.invoke(f"r{i}", arm="hammer", key="k")
        assert [e["request"] for e in read_history(path)] == [f"r{j}" for j in range(i + 1)]
    writer.close()


def test_truncated_final_line_is_dropped(tmp_path):
    """A run killed mid-write keeps every complete event; the half line is ignored."""
    path = tmp_path / "history.jsonl"
    _write_three(path)
    with open(path, "a") as f:
        f.write('{"type":"invoke","index":3,"ti')
    assert [e["index"] for e in read_history(path)] == [0, 1, 2]


def test_a_bad_line_in_the_middle_is_an_error_naming_the_line(tmp_path):
    """Only the last line may be cut short; junk earlier is reported with its line number."""
    path = tmp_path / "history.jsonl"
    _write_three(path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{junk", *lines[1:]]) + "\n")
    with pytest.raises(SchemaError, match=":2:"):
        read_history(path)


def test_resume_continues_indices_and_times_after_a_killed_run(tmp_path):
    """Resuming cuts the half line, then numbers new events after the last complete one."""
    path = tmp_path / "history.jsonl"
    _write_three(path)
    last_time = read_history(path)[-1]["time"]
    with open(path, "a") as f:
        f.write('{"type":"tok')
    with HistoryWriter.resume(path) as writer:
        assert writer.next_index == 3
        writer.invoke("r2", arm="hammer", key="k2")
    events = read_history(path)
    assert [e["index"] for e in events] == [0, 1, 2, 3]
    assert events[-1]["time"] >= last_time


def test_resume_keeps_a_whole_last_event_that_lost_its_newline(tmp_path):
    """A last event written whole but without its newline is kept, and the next one starts a new line."""
    path = tmp_path / "history.jsonl"
    _write_three(path)
    path.write_text(path.read_text().rstrip("\n"))
    with HistoryWriter.resume(path) as writer:
        writer.fail("r1", error="late")
    assert [e["index"] for e in read_history(path)] == [0, 1, 2, 3]


@pytest.mark.parametrize("kind, fields, message", [
    ("ok", {}, "missing field"),
    ("token", {"position": 0, "text": "a", "colour": 1}, "unknown field"),
    ("info", {"reason": "bored"}, "info.reason"),
    ("invoke", {"arm": "hammer", "key": "k", "prompt": b"bytes"}, "JSON-serializable"),
])
def test_writer_refuses_events_the_schema_refuses(tmp_path, kind, fields, message):
    """Missing, unknown, out-of-range and unserializable fields raise before anything is written."""
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        with pytest.raises(SchemaError, match=message):
            writer.append(kind, "r1", **fields)
        assert writer.next_index == 0
    assert path.read_text() == ""


def test_any_text_round_trips(tmp_path):
    """Replacement characters, controls, special-token strings and lone surrogates come back unchanged."""
    text = "\ufffd\x00<|im_end|>\ud800 é"
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.invoke("r", arm="hammer", key="k")
        writer.ok("r", text=text)
    assert read_history(path)[-1]["text"] == text


def test_fault_events_need_no_request(tmp_path):
    """A fault no single request owns is written with request None and read back as a fault."""
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.fault("donate=transfer", site="commit", details={"slot": 5})
    (event,) = read_history(path)
    assert event["type"] == "fault" and event["request"] is None and event["details"] == {"slot": 5}


def test_threads_sharing_the_writer_get_unique_indices_in_file_order(tmp_path):
    """Eight threads appending at once leave indices 0..N-1, in file order, one line each."""
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)

    def hammer(t):
        for i in range(50):
            writer.invoke(f"t{t}-{i}", arm="hammer", key="k")

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == list(range(400))


def test_fold_gives_one_record_per_request_and_choice(tmp_path):
    """An n=2 invoke folds into two records; tokens, outcome, hit and abandonment land on the right one."""
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        w.invoke("r", arm="hammer", key="k", n=2)
        w.token("r", position=0, text="x", token_id=120)
        w.ok("r", text="x", cached_tokens=64)
        w.token("r#1", position=0, text="y")
        w.info("r#1", reason="abandoned", tokens_received=1)
        w.invoke("s", arm="control-cold", key="k")
    fold = fold_history(read_history(path))
    assert list(fold.records) == ["r", "r#1", "s"]
    first, second, pending = fold.records.values()
    assert (first.outcome, first.hit, first.token_ids, first.text) == ("ok", True, (120,), "x")
    assert (second.parent, second.choice, second.abandoned, second.text, second.token_ids) == ("r", 1, True, "y", None)
    assert pending.outcome is None and pending.hit is None
    assert not fold.anomalies


def test_fold_reports_protocol_breaks_instead_of_raising(tmp_path):
    """An event for an unknown request, a second ending and a second invoke become anomalies."""
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        w.ok("ghost", text="boo")
        w.invoke("r", arm="hammer", key="k")
        w.invoke("r", arm="hammer", key="k")
        w.ok("r", text="a")
        w.fail("r", error="twice")
    fold = fold_history(read_history(path))
    assert fold.records["r"].outcome == "ok"
    assert len(fold.anomalies) == 3
    assert any("never invoked" in a for a in fold.anomalies)
