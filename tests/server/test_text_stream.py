"""Streamed text deltas: never a broken UTF-8 sequence, never a possible stop string, and they add up to the text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mini_engine.engine import RequestResult
from mini_engine.model import ByteTokenizer
from mini_engine.server.streaming import TextStream, incomplete_utf8_tail, stop_prefix_len

TOKENIZER = ByteTokenizer()
TEXTS = st.text(alphabet=st.sampled_from("ab€😀é\n"), max_size=12)
TOKEN_IDS = st.lists(st.one_of(st.integers(0, 255), st.sampled_from(TOKENIZER.eos_token_ids)), max_size=40)


def final_text(ids: list[int], stop: tuple[str, ...]) -> str:
    """What the engine reports: the decoded output cut before the first stop string."""
    text = TOKENIZER.decode(ids, skip_special=True)
    cuts = [text.index(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def engine_output(ids: list[int], stop: tuple[str, ...]) -> list[int]:
    """The tokens the engine emits: it ends a request at the first token whose text holds a stop string."""
    for end in range(1, len(ids) + 1):
        if any(s in TOKENIZER.decode(ids[:end], skip_special=True) for s in stop):
            return ids[:end]
    return ids


def result(ids: list[int], stop: tuple[str, ...]) -> RequestResult:
    return RequestResult("r", 1, tuple(ids), "length", 0, "key", None, final_text(ids, stop))


@settings(max_examples=300, deadline=None)
@given(ids=TOKEN_IDS, stop=st.lists(st.text(alphabet="ab€", min_size=1, max_size=3), max_size=2).map(tuple),
       cuts=st.lists(st.integers(0, 40), max_size=6))
def test_deltas_add_up_to_the_final_text(ids, stop, cuts):
    """Whatever the token chunking, the deltas concatenate to exactly the engine's final (stop-cut) text."""
    ids = engine_output(ids, stop)
    stream, sent, start = TextStream(TOKENIZER, stop), [], 0
    for cut in sorted(c for c in cuts if c < len(ids)):
        sent.append(stream.push(tuple(ids[start:cut])))
        start = cut
    sent.append(stream.push(tuple(ids[start:]), result(ids, stop)))
    assert "".join(sent) == final_text(ids, stop)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS, stop=st.lists(st.text(alphabet="ab€", min_size=1, max_size=3), max_size=2).map(tuple))
def test_no_delta_splits_a_character_or_could_be_cut_later(text, stop):
    """Fed byte by byte, the text emitted so far has no U+FFFD and survives any continuation (even a stop)."""
    stream, emitted, ids = TextStream(TOKENIZER, stop), "", []
    for byte in text.encode():
        ids.append(byte)
        if any(s in TOKENIZER.decode(ids) for s in stop):  # the engine stops here and sends its result
            assert emitted + stream.push((byte,), result(ids, stop)) == final_text(ids, stop)
            return
        emitted += stream.push((byte,))
        assert "\ufffd" not in emitted
        for continuation in ("", *stop):
            assert final_text(ids + list(continuation.encode()), stop).startswith(emitted)


def test_incomplete_utf8_tail_counts_a_started_sequence():
    """The tail of a started multi-byte sequence is held; complete ones and ASCII are not."""
    euro = list("€".encode())  # 3 bytes
    assert incomplete_utf8_tail(euro[:1]) == 1 and incomplete_utf8_tail(euro[:2]) == 2
    assert incomplete_utf8_tail(euro) == 0 and incomplete_utf8_tail([65]) == 0
    assert incomplete_utf8_tail(euro[:2] + [TOKENIZER.eos_token_ids[0]]) == 0


def test_stop_prefix_len_is_the_longest_proper_prefix():
    """The held-back suffix is the longest one that begins some stop string, never a whole stop."""
    assert stop_prefix_len("hello wor", ("world",)) == 3
    assert stop_prefix_len("hello", ("world", "lo!")) == 2
    assert stop_prefix_len("abc", ("abc",)) == 0  # a whole stop string: the engine has stopped already
