"""Patterns are pure, seeded schedules that say what they claim, and every request they ask has a control."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hammer.patterns import CONTROL_ARM, HAMMER_ARM, PATTERNS, Op, generate_ops, hazard
from hammer.patterns.chunk_boundary import boundary_lengths
from mini_engine.model import ByteTokenizer
from probes import Message, render_chat

SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def _hammer(ops):
    return [op for op in ops if op.arm == HAMMER_ARM]


@settings(max_examples=15, deadline=None)
@given(seed=SEEDS, count=st.integers(min_value=0, max_value=24), name=st.sampled_from(sorted(PATTERNS)))
def test_patterns_are_pure_and_every_request_has_one_control(seed, count, name):
    """Same seed, same ops; exactly `count` hammer ops in arrival order; one control per distinct key."""
    ops = generate_ops(name, seed, count)
    assert ops == generate_ops(name, seed, count)
    hammer, controls = _hammer(ops), [op for op in ops if op.arm == CONTROL_ARM]
    assert len(hammer) == count and ops[:count] == tuple(hammer)
    assert [op.at for op in hammer] == sorted(op.at for op in hammer)
    assert sorted(c.key for c in controls) == sorted({op.key for op in hammer})
    assert all(c.abandon_after is None and c.at > hammer[-1].at for c in controls)
    assert len({op.request for op in ops}) == len(ops)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_patterns_differ_across_seeds(name):
    """Two seeds give two different schedules (prompts, media or arrivals)."""
    def shape(seed):
        return [(op.text, op.media, op.at) for op in generate_ops(name, seed, 16)]

    assert shape(1) != shape(2)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_pattern_documents_its_hazard(name):
    """Each pattern's module docstring names itself and the hazard it provokes."""
    assert f"``{name}``" in hazard(name) and "Hazard" in hazard(name)


def test_alternate_abandon_alternates_full_and_abandoned_on_one_prompt():
    """Ops alternate complete / cut after k tokens, on an identical request, one control in all."""
    ops = generate_ops("alternate-abandon", 3, 10, abandon_after=3)
    hammer = _hammer(ops)
    assert [op.abandon_after for op in hammer] == [None, 3] * 5
    assert len({op.key for op in hammer}) == 1 and len(ops) == 11
    assert all(op.max_tokens > 3 for op in hammer)


@pytest.mark.parametrize("chat", [False, True])
def test_chunk_boundary_lengths_are_what_they_claim(chat):
    """Each prompt is exactly boundary+offset tokens under the engine's tokenizer, template included."""
    tokenizer = ByteTokenizer()
    ops = _hammer(generate_ops("chunk-boundary", 4, 12, boundaries=(64, 128), chat=chat))
    claimed = boundary_lengths((64, 128), (-1, 0, 1))
    assert claimed == (63, 64, 65, 127, 128, 129)
    for op in ops:
        assert len(tokenizer.encode(op.text)) == op.prompt_tokens == int(op.probe.id.rsplit("/", 1)[1])
        assert (op.messages is not None) == chat
    assert [op.prompt_tokens for op in ops] == list(claimed) * 2


def test_chunk_boundary_prompts_share_prefixes_across_lengths():
    """The 129-token prompt starts with the same filler as the 65-token one (prompts of lengths share prefixes)."""
    ops = {op.prompt_tokens: op for op in _hammer(generate_ops("chunk-boundary", 2, 6, boundaries=(64, 128)))}
    assert ops[129].text[:30] == ops[65].text[:30]


def test_saturate_fills_the_batch_with_long_decodes_around_a_repeated_prompt():
    """Each wave: batch-1 long decodes at one tick, then the same probe prompt a little later."""
    hammer = _hammer(generate_ops("saturate", 5, 16, batch=4, decode_tokens=40, delay=1))
    waves = [hammer[i:i + 4] for i in range(0, 16, 4)]
    for wave in waves:
        fillers, probe = wave[:3], wave[3]
        assert len({op.at for op in fillers}) == 1 and probe.at == fillers[0].at + 1
        assert all(op.max_tokens >= 40 for op in fillers) and probe.max_tokens < 40
    assert len({wave[3].key for wave in waves}) == 1
    assert waves[1][0].at < waves[0][0].at + 40  # the next wave arrives while the decodes still run


def test_branch_fanout_waves_arrive_together_and_some_sample_siblings():
    """After a lone primer, waves of distinct suffixes share one tick; some ask n > 1 at temperature > 0."""
    hammer = _hammer(generate_ops("branch-fanout", 6, 33, fanout=8, sampled=0.5))
    assert hammer[0].at == 0 and hammer[1].at > 0
    ticks = Counter(op.at for op in hammer[1:])
    assert sorted(ticks.values()) == [8, 8, 8, 8]
    assert len({op.group for op in hammer}) == 1 and len({op.text for op in hammer[1:9]}) == 8
    sampled = [op for op in hammer if op.n > 1]
    assert sampled and all(op.temperature > 0 for op in sampled)


def test_media_ab_alternates_media_under_identical_text():
    """A, B, A, B: one prompt text, two media items, two right answers."""
    hammer = _hammer(generate_ops("media-ab", 7, 6))
    assert len({op.text for op in hammer}) == 1
    assert [op.media for op in hammer[:2]] * 3 == [op.media for op in hammer]
    assert hammer[0].media != hammer[1].media and hammer[0].probe.expected != hammer[1].probe.expected
    assert hammer[0].media_digest != hammer[1].media_digest and hammer[0].payload != hammer[1].payload


def test_multi_turn_later_turns_extend_earlier_ones():
    """Turn t+1 of a conversation is turn t's messages plus the assistant's answer plus a new question."""
    hammer = _hammer(generate_ops("multi-turn", 8, 6, conversations=2, facts=3))
    for conversation in (hammer[0::2], hammer[1::2]):
        for earlier, later in zip(conversation, conversation[1:]):
            assert later.messages[:len(earlier.messages)] == earlier.messages
            assert later.messages[len(earlier.messages)].role == "assistant"


def test_mix_interleaves_several_patterns_under_unique_ids():
    """A mix holds ops of several patterns, in arrival order, with ids of its own."""
    hammer = _hammer(generate_ops("mix", 9, 60))
    assert len({op.pattern for op in hammer}) >= 5
    assert all(op.request.startswith("mix-9-") for op in hammer)
    tuned = _hammer(generate_ops("mix", 9, 20, patterns=("alternate-abandon",),
                                 part_settings={"alternate-abandon": {"abandon_after": 2}}))
    assert {op.abandon_after for op in tuned} == {None, 2}


def test_op_round_trips_through_its_invoke_event():
    """Op.from_invoke(invoke fields) rebuilds the same op, probe and media included."""
    for name in ("media-ab", "multi-turn", "branch-fanout"):
        for op in generate_ops(name, 1, 6):
            assert Op.from_invoke({"request": op.request, **op.invoke_fields()}) == op


def test_op_validates_itself():
    """An op with a '#' id, an abandon point past max_tokens or an abandoned control is refused."""
    with pytest.raises(ValueError, match="'#'"):
        Op(request="a#1", pattern="p", prompt="x")
    with pytest.raises(ValueError, match="abandon_after"):
        Op(request="a", pattern="p", prompt="x", max_tokens=4, abandon_after=4)
    with pytest.raises(ValueError, match="control"):
        Op(request="a", pattern="p", prompt="x", arm=CONTROL_ARM, abandon_after=1)
    with pytest.raises(ValueError, match="exactly one"):
        Op(request="a", pattern="p", prompt="x", messages=(Message("user", "x"),))


def test_unknown_pattern_names_the_known_ones():
    """Asking for a pattern that does not exist lists the ones that do."""
    with pytest.raises(ValueError, match="alternate-abandon"):
        generate_ops("hammer-time", 1, 1)


def test_follow_up_turns_continue_the_previous_turn_of_their_conversation():
    """Turn t > 0 continues turn t - 1 of its own conversation (also inside a mix); replies stop at U+FFFD."""
    hammer = _hammer(generate_ops("follow-up", 4, 8, conversations=2, turns=4))
    by_id = {op.request: op for op in hammer}
    assert [op.continues is None for op in hammer] == [True, True, False, False, False, False, False, False]
    assert all(by_id[op.continues].group == op.group and by_id[op.continues].at < op.at
               for op in hammer if op.continues)
    assert all(op.stop == ("\ufffd",) for op in hammer)
    mixed = _hammer(generate_ops("mix", 4, 40, patterns=("follow-up", "alternate-abandon")))
    ids = {op.request for op in mixed}
    assert any(op.continues for op in mixed) and all(op.continues in ids for op in mixed if op.continues)


def test_a_continued_op_begins_with_its_base_prompt_and_reply():
    """op.continued(base, reply): completion text base + reply + own; chat adds the reply as an assistant turn."""
    base = Op(request="a", pattern="p", prompt="Q1:", media=())
    turn = Op(request="b", pattern="p", prompt=" Q2:", continues="a")
    sent = turn.continued(base, " A1.")
    assert sent.prompt == "Q1: A1. Q2:" and sent.continued_from == "a" and sent.continues is None
    assert sent.key != turn.key
    chat = Op(request="c", pattern="p", messages=(Message("user", "hi"),))
    follow = Op(request="d", pattern="p", messages=(Message("user", "again"),), continues="c").continued(chat, "yo")
    assert [m.role for m in follow.messages] == ["user", "assistant", "user"] and follow.messages[1].content == "yo"
    assert follow.text == chat.text + "yo<|im_end|>\n" + render_chat([Message("user", "again")])
