"""The engine's slot ledger: the work it counts, when its rows are flushed, where its device digests land."""

import random

import pytest

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.instrument import Deferred
from tests.engine.test_engine import drive, tokens


def test_the_ledger_counts_its_own_work(tiny_model):
    """The slot ledger's own work. Read back (state_digests="readback"), every byte of a slot state per checksum
    field of a slot row. Tracked (the default), the same rows with the same checksums, and the digest of a live
    state past the last one digested, in its chunk, reads conv and the rows since alone (a decode step's, a prefill
    chunk's after the one before: the forward writes its whole state back, and the rec and rows the memo covers
    compare equal). The host time counted too; an engine without a sink counts neither."""
    rnd = random.Random(5)
    prefix = tokens(rnd, 130)
    prompts = [prefix + tokens(rnd, n) for n in (3, 20, 70)]
    rows: dict[str, list] = {"readback": [], "tracked": []}
    engines = {}
    for mode in ("readback", "tracked", "plain"):
        sink = rows[mode].append if mode in rows else None
        engine = engines[mode] = Engine(EngineConfig(state_digests="readback" if mode == "readback" else "tracked"),
                                        model=tiny_model, sink=sink)
        for prompt in prompts:
            engine.submit(prompt, SamplingParams(max_tokens=5))
        drive(engine)
    fields = {"slot_write": ("checksum",), "snapshot_write": ("checksum",), "clone_written": ("src_checksum", "checksum"),
              "restore_read": ("src_checksum", "checksum")}
    states = engines["readback"].states
    expected = sum(states.nbytes(r["position"]) for r in rows["readback"] for f in fields.get(r["type"], ()) if f in r)
    assert expected > 0 and states.hashed_bytes == expected

    def checksums(ledger):
        return [(r["type"], r.get("rid"), r.get("position"), *(r.get(f) for f in fields[r["type"]]))
                for r in ledger if r["type"] in fields]

    assert checksums(rows["tracked"]) == checksums(rows["readback"])
    conv_bytes, row_bytes = states.conv[0].nbytes, states.pending[0, :, 0].nbytes
    last: dict[str, int] = {}
    saved = 0
    for r in rows["tracked"]:
        if r["type"] == "slot_write":
            before, position = last.get(r["rid"], -1), r["position"]
            if 0 <= before < position and before // 64 == position // 64:  # a prefill's next chunk, a decode step
                saved += states.nbytes(position) - conv_bytes - (position - before) * row_bytes
            last[r["rid"]] = position
    assert saved > 0 and engines["tracked"].states.hashed_bytes == expected - saved
    assert engines["readback"].events.host_seconds > 0 and engines["tracked"].events.host_seconds > 0
    assert engines["plain"].states.hashed_bytes == 0 and engines["plain"].events.host_seconds == 0



def test_digests_land_with_their_copy_and_not_before_it_is_queued():
    """The landing of ledger digests in ``DigestRows`` (CUDA: a batch's results, the block a restore's or a clone's
    take rows of) is their copy to the host: asking before its event is set is refused (the rows would read as landed
    before the work that fills them had run); once set it is that event's state, and a block's landing moved on to a
    later copy's event (the next clone's) is that one's."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.landing import DigestArena, Landing

    device = SimDevice()
    stream = device.stream("copy")
    arena = DigestArena(device, stream)
    block = arena.block(4)
    landing = block.landing
    assert isinstance(landing, Landing) and block.left == 4 and not block.device.any() and not block.host.any()
    with pytest.raises(RuntimeError, match="digests asked for before the copy they land with was queued"):
        landing.query()
    for _ in range(2):  # two clones' rows, each copy's event after it
        device.launch(stream, lambda: None, label="clone")
        landing.done = device.new_event()
        device.record(landing.done, stream)
        assert not landing.query()
    landing.synchronize()
    assert landing.query() and device.is_complete(landing.done)
    assert arena.block(2, landing).landing is landing


def test_digest_blocks_are_cut_from_their_arena_and_never_share_a_row():
    """``DigestArena``: blocks cut in order, each zero when cut; an arena used up gives way to a fresh one while
    blocks cut from the old keep their rows (a block's digests, added in, are not zeroed or taken again); a block
    larger than the arena is refused."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.landing import DigestArena

    device = SimDevice()
    arena = DigestArena(device, device.stream("compute"), rows=8)
    blocks = []
    for i in range(7):  # 3 rows each: two blocks an arena, four arenas
        block = arena.block(3)
        assert block.left == 3 and not block.device.any() and not block.host.any()
        rows, first = block.take(3)
        assert first == 0
        rows += i + 1  # a digest kernel adds its lane sums in
        blocks.append(block)
    assert [sorted(set(b.device.flatten().tolist())) for b in blocks] == [[i + 1] for i in range(7)]
    assert len({b.device.untyped_storage().data_ptr() for b in blocks}) == 4
    with pytest.raises(ValueError, match="a digest block takes 1 to 8 rows of its arena; asked for 9"):
        arena.block(9)


def test_the_ledger_is_flushed_every_few_steps_while_busy_and_waited_for_once_idle(tiny_model):
    """A flush costs the same however little it delivers: while requests run the engine flushes the ledger
    ``LEDGER_FLUSH_STEPS`` steps after its last flush, without waiting (unless a flush in the device's shadow came
    sooner: the next test); the step that leaves it idle flushes and waits for every row."""
    from mini_engine.engine.engine import LEDGER_FLUSH_STEPS

    rows = []
    engine = Engine(EngineConfig(overlap=True), model=tiny_model, sink=rows.append)
    flushes = []  # (step, wait, the shadow flushes before it)
    flush = engine.events.flush
    engine.events.flush = lambda *, wait=False, until=None: (
        flushes.append((engine.steps, wait, engine.shadow_flushes)), flush(wait=wait, until=until))[1]
    engine.submit(tokens(random.Random(2), 70), SamplingParams(max_tokens=2 * LEDGER_FLUSH_STEPS + 3))
    drive(engine)
    last = engine.steps
    assert last > 2 * LEDGER_FLUSH_STEPS and flushes[-1] == (last, True, engine.shadow_flushes)
    assert all(not wait for _, wait, _ in flushes[:-1])
    # each busy flush after the one before it (the first after step 0): in the shadow where the count of those went
    # up after it, else exactly LEDGER_FLUSH_STEPS steps later; either way no later than that
    steps = [0] + [step for step, *_ in flushes]
    counts = [count for *_, count in flushes] + [engine.shadow_flushes]
    gaps = [(steps[i + 1] - steps[i], counts[i + 1] > counts[i]) for i in range(len(flushes) - 1)]
    assert [gap for gap, shadow in gaps if not shadow] and all(gap == LEDGER_FLUSH_STEPS for gap, shadow in gaps
                                                               if not shadow)
    assert all(gap <= LEDGER_FLUSH_STEPS for gap, _ in gaps)
    assert engine.events.pending == 0 and rows


class _Landing(Deferred):
    """A value that lands when a sim device event passes, as a CUDA digest lands with its batch's results."""

    def __init__(self, device, event, value):
        self.device, self.event, self.value = device, event, value

    def ready(self):
        return self.device.is_complete(self.event)

    def wait(self):
        self.device.wait_host(self.event)

    @classmethod
    def resolve_all(cls, values):
        return [v.value for v in values]


def test_the_ledger_is_flushed_in_the_devices_shadow_when_the_host_is_about_to_wait(tiny_model):
    """Rows waiting for device values are flushed where the host is about to block on a batch still running (its host
    time is then free), and otherwise at least every ``LEDGER_FLUSH_STEPS`` steps: a row a batch, landing with its
    results, on the sim (its seeded progress leaves some batches unfinished when their results are asked for)."""
    from mini_engine.engine.engine import LEDGER_FLUSH_STEPS

    rows = []
    engine = Engine(EngineConfig(overlap=True, device_seed=3), model=tiny_model, sink=rows.append)
    log = []  # ("flush", step, wait) and ("results", step, batch finished, rows queued, a shadow flush just ran)
    flush, results, launch = engine.events.flush, engine.runner.results, engine.runner.launch
    seen = [0]  # the shadow flushes counted so far

    def flushed(*, wait=False, until=None):
        log.append(("flush", engine.steps, wait))
        return flush(wait=wait, until=until)

    def resulted(batch):
        shadow, seen[0] = engine.shadow_flushes > seen[0], engine.shadow_flushes
        log.append(("results", engine.steps, engine.device.is_complete(batch.done), engine.events.queued, shadow))
        return results(batch)

    def launched(items):
        batch = launch(items)
        engine.events.emit("probe", batch=batch.index, value=_Landing(engine.device, batch.done, batch.index))
        return batch

    engine.events.flush, engine.runner.results, engine.runner.launch = flushed, resulted, launched
    rnd = random.Random(4)
    for n in (40, 70, 90):
        engine.submit(tokens(rnd, n), SamplingParams(max_tokens=2 * LEDGER_FLUSH_STEPS))
    drive(engine)
    waits = [entry for entry in log if entry[0] == "results"]
    shadows = [entry for entry in waits if entry[-1]]
    # a shadow flush ran exactly where the batch asked for was still running with rows waiting
    assert shadows and all(not finished and queued for _, _, finished, queued, _ in shadows)
    assert all(finished or not queued for _, _, finished, queued, shadow in waits if not shadow)
    assert any(finished and queued for _, _, finished, queued, _ in waits)  # ... and only there
    assert engine.shadow_flushes == len(shadows) and engine.shadow_flush_seconds > 0
    flushes = [step for kind, step, *_ in log if kind == "flush"]
    assert all(b - a <= LEDGER_FLUSH_STEPS for a, b in zip([0, *flushes], flushes))
    assert log[-1] == ("flush", engine.steps, True) and engine.events.pending == 0
    probes = [r for r in rows if r["type"] == "probe"]
    assert [r["value"] for r in probes] == [r["batch"] for r in probes] == list(range(1, len(probes) + 1))
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))


def test_a_shadow_flush_stops_when_the_batch_finishes_and_one_it_outlasted_is_an_overrun(tiny_model, monkeypatch):
    """A flush in the device's shadow is free only while the device is still running: it delivers its rows a chunk at
    a time and stops once the batch has finished (the rest go later, in order), and the engine counts, with its time,
    each one the batch finished during (up to all of it was on the step's path). Here the sim device runs some of its
    queue while the host flushes, as a GPU does (between a flush's chunks); a row a batch lands with its
    results, as the CUDA digests do, and a chunk is 4 rows (a sim step makes few)."""
    from mini_engine import instrument
    from mini_engine.engine.engine import LEDGER_FLUSH_STEPS

    monkeypatch.setattr(instrument, "FLUSH_CHUNK_ROWS", 4)
    rows = []
    engine = Engine(EngineConfig(overlap=True, device_seed=3), model=tiny_model, sink=rows.append)
    flush, results = engine.events.flush, engine.runner.results
    seen = [0, 0]  # the shadow flushes and overruns counted so far
    log = []  # per wait for results: (a shadow flush ran, an overrun was counted, the batch had finished)
    flushes = []  # (step, cut short, rows delivered, rows still queued)

    def flushed(*, wait=False, until=None):
        def running_until():  # the device has run some of its queue while the host delivered a chunk
            engine.device.progress()
            return until()

        before = len(rows)
        went = flush(wait=wait, until=None if until is None else running_until)
        flushes.append((engine.steps, not went, len(rows) - before, engine.events.pending))
        return went

    def resulted(batch):
        counts = (engine.shadow_flushes, engine.shadow_overruns)
        log.append((counts[0] > seen[0], counts[1] > seen[1], engine.device.is_complete(batch.done)))
        seen[:] = counts
        return results(batch)

    def launched(items):
        batch = launch(items)
        engine.events.emit("probe", batch=batch.index, value=_Landing(engine.device, batch.done, batch.index))
        return batch

    launch = engine.runner.launch
    engine.events.flush, engine.runner.results, engine.runner.launch = flushed, resulted, launched
    rnd = random.Random(4)
    for n in (40, 70, 90):
        engine.submit(tokens(rnd, n), SamplingParams(max_tokens=20))
    drive(engine)
    shadows = [(overran, finished) for shadow, overran, finished in log if shadow]
    assert all(overran == finished for overran, finished in shadows)
    assert not any(overran for shadow, overran, _ in log if not shadow)
    assert {overran for overran, _ in shadows} == {True, False}  # both kinds seen
    assert engine.shadow_overruns == sum(overran for overran, _ in shadows)
    assert 0 < engine.shadow_overrun_seconds < engine.shadow_flush_seconds
    # some flushes were cut short, after a chunk, with rows left; a cut-short flush leaves the next periodic flush
    # where it was: complete flushes come no more than LEDGER_FLUSH_STEPS steps apart
    short = [f for f in flushes if f[1]]
    assert short and all(delivered >= 4 and left for _, _, delivered, left in short)
    complete = [step for step, cut, *_ in flushes if not cut]
    assert all(b - a <= LEDGER_FLUSH_STEPS for a, b in zip([0, *complete], complete))
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
