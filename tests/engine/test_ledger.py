"""The engine's slot ledger: the work it counts, when its rows are flushed, where its device digests land."""

import random

import pytest

from mini_engine.engine import Engine, EngineConfig, SamplingParams
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



def test_a_batchs_digests_land_with_its_results_copy_and_not_before_it_is_queued():
    """The landing of a batch's ledger digests (``DigestRows`` in its results and before them, CUDA) is its results
    copy: asking before the runner has queued it is refused (the rows would read as landed while their batch has
    not run), and once the batch's ``done`` is recorded it is that event's state."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.runner import _ResultsCopy

    device = SimDevice()
    stream = device.stream("compute")
    landing = _ResultsCopy(device)
    with pytest.raises(RuntimeError, match="digests asked for before the results copy they land with was queued"):
        landing.query()
    device.launch(stream, lambda: None, label="forward")
    landing.done = device.new_event()
    device.record(landing.done, stream)
    assert not landing.query()
    landing.synchronize()
    assert landing.query()


def test_the_ledger_is_flushed_every_few_steps_while_busy_and_waited_for_once_idle(tiny_model):
    """A flush costs the same however little it delivers: while requests run the engine flushes the ledger every
    ``LEDGER_FLUSH_STEPS`` steps, without waiting; the step that leaves it idle flushes and waits for every row."""
    from mini_engine.engine.engine import LEDGER_FLUSH_STEPS

    rows = []
    engine = Engine(EngineConfig(overlap=True), model=tiny_model, sink=rows.append)
    flushes = []
    flush = engine.events.flush
    engine.events.flush = lambda *, wait=False: (flushes.append((engine.steps, wait)), flush(wait=wait))
    engine.submit(tokens(random.Random(2), 70), SamplingParams(max_tokens=2 * LEDGER_FLUSH_STEPS + 3))
    drive(engine)
    last = engine.steps
    assert last > 2 * LEDGER_FLUSH_STEPS
    want = [(s, False) for s in range(LEDGER_FLUSH_STEPS, last, LEDGER_FLUSH_STEPS)] + [(last, True)]
    assert flushes == want and engine.events.pending == 0 and rows
