"""Each fault removes one safeguard and the corruption comes out of the mechanism (DESIGN.md §4).

For every fault: a search over seeds of a small fixed schedule finds wrong hit outputs; the same
schedules with the safeguard on are exact; and the evidence has the fault's signature.
"""

import re

import pytest

from mini_engine.cache.pools import Owner
from mini_engine.engine import Engine, EngineConfig
from mini_engine.faults import FAULTS
from mini_engine.engine.metadata import gather_shards
from mini_engine.ops.checksum import slot_checksum
from tests.engine import fault_schedules as fs


@pytest.fixture(scope="module")
def cold(tiny_model):
    return fs.ColdReference(tiny_model)


def search(model, cold, schedule, fault, seeds, **config):
    """(seed, run) of the first seed whose schedule gives wrong hits under ``fault``; fails if none does.
    Every seed searched is also run with the safeguard on, and must be exact."""
    for seed in seeds:
        plan = schedule(seed)
        safe = fs.run(model, plan, seed=seed, **config)
        assert fs.all_exact(safe, cold), f"seed {seed}: wrong outputs with every safeguard on"
        faulty = fs.run(model, plan, faults=[fault], seed=seed, **config)
        if fs.wrong_hits(faulty, cold):
            return seed, faulty
    pytest.fail(f"{fault}: no seed in {seeds} produced a wrong hit")


def test_fault_names_are_validated_and_transfer_is_one_fault():
    """Unknown fault names are rejected by name; donate=transfer and donate_policy='transfer' are one switch."""
    with pytest.raises(ValueError, match="unknown fault.*'nope'"):
        EngineConfig(faults=["nope"])
    assert EngineConfig(faults=["donate=transfer"]).donate_policy == "transfer"
    assert EngineConfig(donate_policy="transfer").faults == {"donate=transfer"}
    assert len(FAULTS) == 7 and EngineConfig().faults == frozenset()


def test_transfer_writes_a_tree_slot_after_its_donation(tiny_model, cold, reference):
    """donate=transfer + overlap: the batch built before a finish writes the live slot the tree now owns."""
    def first_tokens(seed):
        return tuple(reference(fs.tokens(fs.random.Random(seed), 44), 10))

    seeds = [s for s in range(16) if first_tokens(s)[4] not in first_tokens(s)[:4]]  # it stops at 48 exactly
    seed, faulty = search(tiny_model, cold, lambda s: fs.finish_at_page_boundary(s, first_tokens(s)),
                          "donate=transfer", seeds, overlap=True)
    writes_to_tree = []

    def watch_writes(engine):
        original = engine.states.write

        def write(slot, state):  # runs when the forward runs on the device
            if engine.cache.slots.owner_of(slot) == Owner("tree", 0, "snapshot"):
                writes_to_tree.append(slot)
            original(slot, state)

        engine.states.write = write

    fs.run(tiny_model, fs.finish_at_page_boundary(seed, first_tokens(seed)), faults=["donate=transfer"], seed=seed,
           overlap=True, prepare=watch_writes)
    assert writes_to_tree, "no forward wrote a slot owned by the tree"
    assert faulty.of("fault", name="donate=transfer", role="live")


def test_admission_barrier_off_lets_a_restore_overtake_the_clone(tiny_model, cold):
    """admission_barrier=off: a hit's restore runs before the donation clone has filled its source slot."""
    seed, faulty = search(tiny_model, cold, fs.donations_then_hits, "admission_barrier=off", range(40))
    order = []
    fs.run(tiny_model, fs.donations_then_hits(seed), faults=["admission_barrier=off"], seed=seed,
           prepare=lambda engine: engine.device.observers.append(lambda op: order.append(op.label)))
    clones = {label.split("->")[1]: i for i, label in enumerate(order) if label.startswith("clone:")}
    overtaken = [label for i, label in enumerate(order)
                 if label.startswith("restore:") and clones.get(label[8:].split("->")[0], -1) > i]
    assert overtaken, "every restore ran after the clone of its source"
    assert faulty.of("fault", name="admission_barrier=off", site="restore")


def test_track_writer_off_donates_the_slots_prior_content(tiny_model, cold):
    """track_writer=off: the donated snapshot's checksum equals its source slot's content before the forward."""
    seed, faulty = search(tiny_model, cold, fs.donate_then_hit_later, "track_writer=off", range(8))
    engine = Engine(EngineConfig(device_seed=seed, faults=["track_writer=off"]), model=tiny_model)
    plan = fs.donate_then_hit_later(seed)
    engine.submit(list(plan[0].prompt), plan[0].params, rid="p")
    engine.run()
    engine.device.synchronize()
    prior = {slot: slot_checksum(engine.states.slot_bytes(slot, 128)) for slot in range(1, 10)}
    for s in plan[1:]:
        engine.submit(list(s.prompt), s.params, rid=s.rid, at_step=s.at_step)
    events = []
    engine.events.sink = events.append
    engine.run()
    engine.device.synchronize()
    clone = next(e for e in events if e["type"] == "clone")
    donated = slot_checksum(engine.states.slot_bytes(clone["dst"], 128))
    assert donated == prior[clone["src"]]
    assert any(e["type"] == "fault" and e["name"] == "track_writer=off" for e in events)


def test_metadata_fence_off_lets_a_decode_read_stale_page_mappings(tiny_model, cold):
    """metadata_fence=off: some decode step reads a page table other than the one staged for it."""
    seed, faulty = search(tiny_model, cold, fs.donations_then_hits, "metadata_fence=off", range(20))
    stale = []

    def check_tables(engine):
        forward = engine.runner._forward

        def checked_forward(batch, shards):  # what the decode kernel reads vs what was staged for it
            resident = gather_shards(shards)
            decodes = [it for it in batch.items if it.tokens is None]
            stale.extend(row for row, it in enumerate(decodes)
                         if resident[row, : len(it.pages)].tolist() != list(it.pages))
            forward(batch, shards)

        engine.runner._forward = checked_forward

    fs.run(tiny_model, fs.donations_then_hits(seed), faults=["metadata_fence=off"], seed=seed, prepare=check_tables)
    assert stale
    assert faulty.of("fault", name="metadata_fence=off")


def test_page_cow_off_lets_sampled_siblings_write_a_shared_page(tiny_model, cold):
    """page_cow=off: n=3 sampled choices write the shared partial page in place and corrupt each other."""
    seed, faulty = search(tiny_model, cold, fs.sampled_choices, "page_cow=off", range(40))
    shared = faulty.of("fault", name="page_cow=off")
    assert shared and {e["index"] for e in shared} == {9}
    assert not faulty.of("page_cow")


def test_evict_locked_restores_a_slot_already_reused(tiny_model, cold):
    """evict_locked=on: a newcomer's eviction takes the hit's locked snapshot slot, reuses it, and the
    hit restores the newcomer's state."""
    config = {"max_running": 2, "num_slots": 6}
    seed, faulty = search(tiny_model, cold, fs.hit_and_newcomer_under_slot_pressure, "evict_locked=on", range(8),
                          **config)
    (taken,) = faulty.of("fault", name="evict_locked=on")
    restore = faulty.of("restore", rid="a")[0]
    reused = [e for e in faulty.events if e["type"] == "alloc" and e["slot"] == taken["slot"]
              and e["owner"].startswith("request 'b'")]
    assert restore["src"] == taken["slot"] and reused
    assert faulty.events.index(reused[0]) < faulty.events.index(restore)


def test_media_key_off_hits_on_the_other_media(tiny_model, cold):
    """media_key=off: a request with media B hits the prefix computed with media A (same cache key)."""
    seed, faulty = search(tiny_model, cold, fs.media_a_then_b, "media_key=off", range(8))
    a, b = faulty.engine.result("a"), faulty.engine.result("b")
    assert b.cached_tokens == 64 and a.cache_key == b.cache_key and a.media_digest != b.media_digest
    safe = fs.run(tiny_model, fs.media_a_then_b(seed), seed=seed)
    assert safe.engine.result("b").cached_tokens == 0
    assert safe.engine.result("a").cache_key != safe.engine.result("b").cache_key
    assert faulty.of("fault", name="media_key=off", rid="b")


def test_media_changes_the_output_and_hits_on_the_same_media_are_exact(tiny_model, cold):
    """Media reaches the model (A and B answer differently) and a repeat with the same media hits exactly."""
    plan = fs.media_a_then_b(0)
    a_media, b_media = plan[0].media, plan[1].media
    assert cold(plan[0].prompt, plan[0].params, a_media) != cold(plan[0].prompt, plan[0].params, b_media)
    repeat = [plan[0], fs.Submit("again", plan[0].prompt, plan[0].params, at_step=20, media=a_media)]
    result = fs.run(tiny_model, repeat)
    assert result.engine.result("again").cached_tokens == 64 and fs.all_exact(result, cold)


def test_bad_media_is_rejected_by_name(tiny_model):
    """Media that is not bytes, too large, or miscounted against the placeholders is a clear error."""
    engine = Engine(EngineConfig(max_media_bytes=8), model=tiny_model)
    with pytest.raises(ValueError, match=r"media\[0\] must be bytes"):
        engine.submit("a <|media|>", media=["text"])
    with pytest.raises(ValueError, match="max_media_bytes=8"):
        engine.submit("a <|media|>", media=[b"123456789"])
    with pytest.raises(ValueError, match=re.escape("1 <|media|> placeholder(s) but 2 media")):
        engine.submit("a <|media|>", media=[b"1", b"2"])
