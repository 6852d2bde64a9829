"""The interpreter: ticks, abandons, continuations and controls, on the embedded engine and on a fake stream."""

import asyncio
import json

import pytest

from forensics import HistoryWriter, fold_history, read_history
from hammer.interpreter import run_ops
from hammer.patterns import Op, generate_ops
from hammer.targets import Completion, Delta, Failure, StreamingTarget
from hammer.targets.embedded import EmbeddedTarget


@pytest.fixture(scope="module")
def target(tiny_model, tmp_path_factory):
    ledger = tmp_path_factory.mktemp("ledger") / "ledger.jsonl"
    target = EmbeddedTarget({"overlap": True}, model=tiny_model, ledger=ledger)
    yield target, ledger
    target.close()


def run(target, ops, path, **kwargs):
    with HistoryWriter(path) as writer:
        run_ops(target, ops, writer, **kwargs)
    return read_history(path)


def test_an_abandoned_stream_is_aborted_right_after_its_kth_token(target, tmp_path):
    """abandon_after=3: exactly 3 token events, an info 'abandoned', and the engine's abort in the ledger."""
    engine_target, ledger = target
    engine_target.begin_round(0)
    events = run(engine_target, generate_ops("alternate-abandon", 5, 4, abandon_after=3), tmp_path / "h.jsonl")
    abandoned = [r for r in fold_history(events).records.values() if r.abandoned]
    assert len(abandoned) == 2 and all(len(r.tokens) == 3 and r.end["tokens_received"] == 3 for r in abandoned)
    aborts = {row["rid"] for row in map(json.loads, ledger.read_text().splitlines()) if row["type"] == "abort"}
    assert {r.request for r in abandoned} <= aborts


def test_a_follow_up_turn_continues_the_reply_it_got_and_its_control_asks_the_same(target, tmp_path):
    """Turn 1 is sent as turn 0's prompt + turn 0's reply + its own part; its control asks exactly that."""
    engine_target, _ = target
    engine_target.begin_round(1)
    events = run(engine_target, generate_ops("follow-up", 2, 2, conversations=1), tmp_path / "h.jsonl")
    records = fold_history(events).records
    first, second = (r for r in records.values() if r.arm == "hammer")
    assert second.invoke["continued_from"] == first.request
    assert second.invoke["prompt"] == first.invoke["prompt"] + first.text + "\n" + second.invoke["prompt"].split("\n")[-1]
    controls = [r for r in records.values() if r.arm == "control-cold"]
    assert sorted(c.key for c in controls) == sorted({first.key, second.key})
    assert second.hit and all(c.cached_tokens == 0 for c in controls)


class FakeStream(StreamingTarget):
    """Each request streams ``length`` deltas, yielding to the event loop between them; ``fail`` refuses some."""

    kind = "fake"

    def __init__(self, length=3, fail=()):
        self.length, self.fail, self.log = length, set(fail), []

    def describe(self):
        return {"kind": self.kind}

    async def stream(self, op):
        self.log.append(("start", op.request))
        if op.request in self.fail:
            yield Failure("refused", 400)
            return
        try:
            for i in range(self.length):
                await asyncio.sleep(0)  # a yield point, like a network read
                self.log.append(("delta", op.request, i))
                yield Delta(0, "x")
            yield Completion(0, "x" * self.length, cached_tokens=0)
        finally:
            self.log.append(("closed", op.request))


def test_a_tick_waits_for_every_open_stream_to_stream_that_many_deltas(tmp_path):
    """Ops at tick 0 start together; an op at tick 2 starts once both have streamed 2 deltas (or ended)."""
    fake = FakeStream(length=5)
    ops = [Op(request=r, pattern="p", prompt="x", at=at) for r, at in (("a", 0), ("b", 0), ("c", 2))]
    run(fake, ops, tmp_path / "h.jsonl")
    start_c = fake.log.index(("start", "c"))
    assert fake.log.index(("start", "b")) < fake.log.index(("delta", "a", 0))
    assert {("delta", "a", 1), ("delta", "b", 1)} <= set(fake.log[:start_c])
    assert ("delta", "a", 4) not in fake.log[:start_c]


def test_abandon_closes_the_stream_and_concurrency_one_runs_requests_one_at_a_time(tmp_path):
    """abandon_after=2 closes the stream after 2 deltas; with --concurrency 1 no two requests overlap."""
    fake = FakeStream(length=6)
    ops = [Op(request=r, pattern="p", prompt="x", max_tokens=8, abandon_after=2 if r == "a" else None)
           for r in ("a", "b")]
    events = run(fake, ops, tmp_path / "h.jsonl", concurrency=1)
    assert ("delta", "a", 2) not in fake.log and fake.log.index(("closed", "a")) < fake.log.index(("start", "b"))
    assert [e["reason"] for e in events if e["type"] == "info"] == ["abandoned"]


def test_a_turn_whose_predecessor_failed_is_recorded_as_not_sent(tmp_path):
    """A continuation of a failed request is invoked and failed, naming why; it never reaches the target."""
    fake = FakeStream(fail={"a"})
    ops = [Op(request="a", pattern="p", prompt="x"), Op(request="b", pattern="p", prompt="y", at=1, continues="a")]
    events = run(fake, ops, tmp_path / "h.jsonl")
    assert ("start", "b") not in fake.log
    assert [e["error"] for e in events if e["type"] == "fail"][1].startswith("not sent: a")


def test_each_round_gets_its_own_device_seed_but_cuda_seed_zero_stays_the_gpus_own_timing():
    from hammer.targets.embedded import round_device_seed

    assert [round_device_seed({"device_seed": 5}, r) for r in range(3)] == [5, 6, 7]
    assert [round_device_seed({}, r) for r in range(3)] == [0, 1, 2]  # the sim: a schedule per round
    assert [round_device_seed({"device": "cuda"}, r) for r in range(3)] == [0, 0, 0]  # no nemesis unless asked
    assert [round_device_seed({"device": "cuda", "device_seed": 2}, r) for r in range(3)] == [2, 3, 4]


def test_a_rounds_engines_are_freed_when_the_next_round_begins(tiny_model, tmp_path):
    """With the cyclic GC off (it runs when Python's object counts say, not when a GPU is full): a round's engines
    (their slot pools, gigabytes on a GPU at a production model's size) are gone before the next round's are built,
    and after close(); reference states on, whose callback makes a cycle inside the engine too."""
    import gc
    import weakref

    target = EmbeddedTarget({"reference_states": True}, model=tiny_model, ledger=tmp_path / "ledger.jsonl")
    collecting = gc.isenabled()
    gc.disable()
    try:
        target.begin_round(0)
        first = [weakref.ref(target.lane(arm).engine) for arm in ("hammer", "control-cold")]
        run(target, generate_ops("alternate-abandon", 1, 2), tmp_path / "h.jsonl")
        target.begin_round(1)
        assert [ref() for ref in first] == [None, None]
        second = [weakref.ref(target.lane(arm).engine) for arm in ("hammer", "control-cold")]
        run(target, generate_ops("alternate-abandon", 2, 2), tmp_path / "h2.jsonl")
        target.close()
        assert [ref() for ref in second] == [None, None]
    finally:
        if collecting:
            gc.enable()
    rounds = {row["round"] for row in map(json.loads, (tmp_path / "ledger.jsonl").read_text().splitlines())}
    assert rounds == {0, 1}
