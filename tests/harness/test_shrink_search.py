"""The shrinker's search, offline: ddmin and op simplification against a literal failure predicate."""

from dataclasses import replace

from hammer.patterns import Op
from hammer.shrink import Case, _closed, _ddmin, _simplify


class FakeOracle:
    """Fails when ``predicate(ops)`` holds; counts its trials like the real one."""

    def __init__(self, predicate, max_trials=1000):
        self.predicate, self.trials, self.max_trials = predicate, 0, max_trials

    @property
    def exhausted(self):
        return self.trials >= self.max_trials

    def fails(self, case):
        self.trials += 1
        return self.predicate(case.ops)


def ops(n, **fields):
    return tuple(Op(request=f"r{i}", pattern="p", prompt=f"prompt {i}", at=i, **fields) for i in range(n))


def case_of(schedule):
    return Case(schedule, {"faults": ("donate=transfer",)}, "poisoned-after-donate")


def ids(schedule):
    return {op.request for op in schedule}


def test_ddmin_finds_the_two_ops_that_fail_together():
    """A failure that needs r3 and r11 out of 16 ops shrinks to exactly those, in few trials."""
    oracle = FakeOracle(lambda s: {"r3", "r11"} <= ids(s))
    steps = []
    shrunk = _ddmin(case_of(ops(16)), oracle, steps)
    assert ids(shrunk.ops) == {"r3", "r11"}
    assert steps and oracle.trials < 60


def test_ddmin_keeps_a_continuation_with_its_base():
    """An op continuing a dropped op is dropped with it; a failure needing the continuation keeps its base."""
    schedule = (*ops(6), Op(request="turn2", pattern="p", prompt=" more", at=7, continues="r2"))
    assert ids(_closed(tuple(o for o in schedule if o.request != "r2"))) == {"r0", "r1", "r3", "r4", "r5"}
    oracle = FakeOracle(lambda s: "turn2" in ids(s))
    assert ids(_ddmin(case_of(schedule), oracle, []).ops) == {"r2", "turn2"}


def test_ddmin_stops_when_the_trial_budget_is_spent_and_keeps_a_failing_schedule():
    """With 3 trials only, the result is still a schedule that failed (here: the original or a half)."""
    predicate = lambda s: {"r3", "r11"} <= ids(s)  # noqa: E731
    shrunk = _ddmin(case_of(ops(16)), FakeOracle(predicate, max_trials=3), [])
    assert predicate(shrunk.ops)


def test_simplify_drops_aborts_pulls_arrivals_and_halves_tokens_while_it_still_fails():
    """Each simplification is kept only when the failure stays: here the failure needs r1's abort."""
    schedule = (Op(request="r0", pattern="p", prompt="a", at=0, max_tokens=16, abandon_after=3),
                Op(request="r1", pattern="p", prompt="b", at=9, max_tokens=16, abandon_after=3))
    oracle = FakeOracle(lambda s: s[1].abandon_after is not None)
    steps = []
    simple = _simplify(case_of(schedule), oracle, steps).ops
    assert simple[0].abandon_after is None and simple[1].abandon_after == 3
    assert simple[1].at == 0 and simple[0].max_tokens == 1 and simple[1].max_tokens == 4
    assert any("no abort" in s for s in steps)


def test_a_case_round_trips_through_json():
    """case.json holds everything a run needs: ops (continuations, media, aborts), engine options, verdict."""
    schedule = (Op(request="r0", pattern="p", prompt="a", media=(b"\x00\x01",), max_tokens=4, abandon_after=2),
                Op(request="r1", pattern="p", prompt="b", at=3, continues="r0"))
    case = replace(case_of(schedule), seed=5, source="somewhere", concurrency=3)
    again = Case.from_json(case.to_json())
    assert again.ops == case.ops and again.verdict == case.verdict and again.seed == 5 and again.concurrency == 3
    assert again.engine["faults"] == ["donate=transfer"]
