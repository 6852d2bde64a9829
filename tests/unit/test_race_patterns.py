"""The race patterns schedule what their hazards need: donations queued together, then the requests racing them."""

import pytest

from hammer.patterns import CONTROL_ARM, HAMMER_ARM, generate_ops
from probes import count_tokens


def _split(ops):
    return [op for op in ops if op.arm == HAMMER_ARM], [op for op in ops if op.arm == CONTROL_ARM]


def test_free_reuse_donors_finish_at_once_newcomers_follow_and_hits_repeat_the_donors():
    """One wave: 8 one-token donors (a fresh prefix each, one prefill chunk past a 64-boundary) at the wave's
    tick, 6 identical cold newcomers one tick later, then each donor's request again: 9 controls in all."""
    hammer, controls = _split(generate_ops("free-reuse", 3, 22))
    donors, newcomers, hits = hammer[:8], hammer[8:14], hammer[14:]
    assert {op.at for op in donors} == {0} and {op.at for op in newcomers} == {1} and {op.at for op in hits} == {2}
    assert all(op.max_tokens == 1 for op in hammer)
    assert len({op.text for op in donors}) == 8 and all(64 < count_tokens(op.text) < 128 for op in donors)
    assert len({op.text for op in newcomers}) == 1 and newcomers[0].text not in {op.text for op in donors}
    assert [op.key for op in hits] == [op.key for op in donors]
    assert len(controls) == 9
    next_wave = generate_ops("free-reuse", 3, 23)[22]
    assert next_wave.at == 4 and next_wave.text not in {op.text for op in donors}


def test_donate_hit_warms_several_prefixes_and_hits_the_newest_first():
    """prefixes=8: eight warm requests with distinct prefixes at the wave's tick, one hit each one tick later in
    reverse order; repeat makes each hit its warm request again (one control each), max_tokens applies to all."""
    hammer, controls = _split(generate_ops("donate-hit", 5, 16, prefixes=8, hits=1, repeat=True, max_tokens=2,
                                           prefix_tokens=70))
    warm, hits = hammer[:8], hammer[8:]
    assert {op.at for op in warm} == {0} and {op.at for op in hits} == {1}
    assert len({op.text[:70] for op in warm}) == 8
    assert [op.key for op in hits] == [op.key for op in reversed(warm)]
    assert all(op.max_tokens == 2 for op in hammer) and len(controls) == 8
    asked = _split(generate_ops("donate-hit", 5, 16, prefixes=8, hits=1, prefix_tokens=70))[0]
    assert [op.text[:70] for op in asked[8:]] == [op.text[:70] for op in reversed(asked[:8])]
    assert all(h.text != w.text for h, w in zip(asked[8:], reversed(asked[:8])))


def test_donate_hit_with_one_prefix_keeps_its_schedule():
    """The default (one prefix): warm, hits on the same prefix one tick later, the late hit and the newcomer."""
    hammer, _ = _split(generate_ops("donate-hit", 0, 7, hits=4, gap=8, settle=6))
    assert [op.at for op in hammer] == [0, 1, 1, 1, 1, 6, 6]
    assert len({op.text[:130] for op in hammer[:6]}) == 1 and hammer[6].text[:40] != hammer[0].text[:40]
    assert [op.probe.id for op in hammer[:2]] == ["donate-hit/0/0/0", "donate-hit/0/0/1"]



@pytest.mark.parametrize("pattern, bad", [("free-reuse", {"prefix_tokens": 130}), ("free-reuse", {"settle": 1}),
                                          ("donate-hit", {"prefixes": 0}), ("donate-hit", {"max_tokens": 0})])
def test_race_pattern_settings_are_checked_and_named(pattern, bad):
    """A donor prompt that cannot cross a 64-boundary in one chunk, hits not after the newcomers, no prefix, no
    token: ValueError naming the pattern and the setting."""
    with pytest.raises(ValueError, match=f"{pattern}.*{next(iter(bad))}"):
        generate_ops(pattern, 0, 4, **bad)
