"""Probe families are pure and seeded; extractors never raise; the byte rule matches the engine's tokenizer."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics import media_digest
from mini_engine.engine import engine as engine_module
from mini_engine.model import ByteTokenizer
from probes import EXTRACTORS, FAMILIES, Message, Probe, count_tokens, extract, generate_probes, render_chat
from probes.families.needle import filler
from probes.text import MEDIA_MARKER, SPECIAL_TOKENS


@pytest.mark.parametrize("family", FAMILIES)
def test_families_are_deterministic_and_seeded(family):
    """The same seed gives the same probes; another seed gives other ones; ids are unique."""
    first, again, other = (generate_probes(family, s, 6) for s in (1, 1, 2))
    assert first == again and len(first) == 6
    assert [(p.text, p.media) for p in first] != [(p.text, p.media) for p in other]
    assert len({p.id for p in first}) == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_every_probe_is_answered_by_its_own_expected_answer(family):
    """Extracting from the expected answer itself gives the expected answer (grading is consistent)."""
    for probe in generate_probes(family, 3, 8):
        assert probe.is_correct(probe.expected), probe.id


def test_arithmetic_shares_a_long_preamble():
    """Arithmetic probes share a prefix longer than two 64-token chunks and end in 'Answer:'."""
    a, b = generate_probes("arithmetic", 0, 2)
    shared = next(i for i, (x, y) in enumerate(zip(a.text, b.text)) if x != y)
    assert shared > 128 and a.text.endswith("Answer:")
    assert str(eval(a.text.rsplit("Compute ", 1)[1].split(".")[0])) == a.expected


def test_needle_is_at_its_depth_in_a_haystack_of_the_asked_length():
    """The needle's value sits at its depth; probes of one haystack share the prefix up to the first needle."""
    probes = generate_probes("needle", 5, 5, haystack_tokens=1024)
    positions = [p.text.index(f"is {p.expected}.") for p in probes]
    assert positions == sorted(positions) and positions[-1] - positions[0] > 900
    assert len(filler(1024, 0)) == 1024 and filler(2048, 0).startswith(filler(1024, 0))
    earliest = min(positions)
    assert len({p.text[:earliest - 60] for p in probes[1:]}) == 1
    assert all(p.text.endswith("Answer:") and p.expected.isdigit() and len(p.expected) == 7 for p in probes)


def test_recall_probes_extend_the_previous_turn():
    """Probe j+1's messages are probe j's plus the right answer and a new question."""
    probes = generate_probes("recall", 4, 3, facts=3)
    for earlier, later in zip(probes, probes[1:]):
        assert later.messages[:len(earlier.messages)] == earlier.messages
        assert later.messages[len(earlier.messages)] == Message("assistant", earlier.expected)
        assert later.text.startswith(earlier.text.removesuffix("<|im_start|>assistant\n"))
    assert all(p.expected in p.messages[0].content or p.expected in p.text[:p.text.index("Tell me")]
               for p in probes)


def test_media_pairs_share_text_and_differ_in_media_and_answer():
    """A and B of a pair: byte-identical text, different media, different expected answers."""
    a, b = generate_probes("media", 9, 2)
    assert a.text == b.text and a.media != b.media and a.expected != b.expected
    assert a.expected.encode() in a.media[0] and b.expected.encode() in b.media[0]
    assert count_tokens(a.text[:a.text.index(MEDIA_MARKER)]) < 64  # the marker sits in the first chunk


def test_probe_validates_itself():
    """A probe with both prompt and messages, an unknown extractor or a media/marker mismatch is refused."""
    base = {"id": "p", "family": "f", "expected": "1", "extract": "first_number", "group": "g"}
    with pytest.raises(ValueError, match="exactly one"):
        Probe(**base, prompt="x", messages=(Message("user", "x"),))
    with pytest.raises(ValueError, match="extract must be"):
        Probe(**{**base, "extract": "vibes"}, prompt="x")
    with pytest.raises(ValueError, match="marker"):
        Probe(**base, prompt="x", media=(b"m",))


def test_probe_round_trips_through_a_dict():
    """to_dict / from_dict give back an equal probe, media bytes included."""
    for probe in (*generate_probes("media", 1, 2), *generate_probes("recall", 1, 2)):
        assert Probe.from_dict(probe.to_dict()) == probe


@pytest.mark.parametrize("name, text, answer", [
    ("first_number", "The answer is 0433, not 12.", "433"),
    ("first_number", "minus -5 then", "-5"),
    ("first_number", "", None),
    ("first_number", "\ufffd\x00<|im_end|>", None),
    ("after_answer_marker", "Think. Answer: blue.\nmore", "blue"),
    ("after_answer_marker", "  first line \nsecond", "first line"),
    ("after_answer_marker", "Answer:   \n", None),
    ("exact_word", " Red.", "red"),
    ("exact_word", "123 ...", None),
])
def test_extractors_on_answers_empty_output_and_junk(name, text, answer):
    """Each extractor finds the documented answer, and None on empty output or junk."""
    assert extract(name, text) == answer


@settings(max_examples=200)
@given(st.text(), st.sampled_from(sorted(EXTRACTORS)))
def test_extractors_never_raise(text, name):
    """On any text at all, an extractor returns a string or None."""
    assert extract(name, text) is None or isinstance(extract(name, text), str)


@given(st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIAL_TOKENS)), max_size=8))
def test_count_tokens_matches_the_engine_tokenizer(pieces):
    """The byte rule counts exactly the tokens ByteTokenizer.encode gives."""
    text = "".join(pieces)
    assert count_tokens(text) == len(ByteTokenizer().encode(text))


def test_chat_rendering_matches_the_engine_template(tokenizer):
    """render_chat gives the same string as ByteTokenizer.apply_chat_template."""
    messages = [Message("system", "s"), Message("user", f"look {MEDIA_MARKER} here"), Message("assistant", "ok")]
    assert render_chat(messages) == tokenizer.apply_chat_template([m.as_dict() for m in messages])


def test_media_digest_matches_the_engine():
    """The schema's media digest is the one the engine echoes (so the echo oracle can compare them)."""
    items = (b"color:red;shape:circle", b"x")
    assert media_digest(items) == engine_module.media_digest(items)
    assert media_digest((b"ab", b"c")) != media_digest((b"a", b"bc"))
