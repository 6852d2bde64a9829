"""forensics.divergences: where a hit first parts from its cold run, from two ledgers (sim device and rows)."""

import dataclasses
import json
import random

from forensics.divergence import Divergence, divergences, partings
from mini_engine.engine import Engine, EngineConfig, SamplingParams


def hit_heavy(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` requests over 2 shared 150-token prefixes plus 1-20 private tokens, arriving 3 per step."""
    rnd = random.Random(seed)
    prefixes = [[rnd.randrange(256) for _ in range(150)] for _ in range(2)]
    return [(rnd.choice(prefixes) + [rnd.randrange(256) for _ in range(rnd.randrange(1, 20))], i // 3)
            for i in range(n)]


def hot_and_cold(model, requests, **options):
    """(results, ledger rows) of the requests with the cache on, then off."""
    runs = []
    for cache in (True, False):
        rows = []
        engine = Engine(EngineConfig(enable_cache=cache, **options), model=model, sink=rows.append)
        ids = [engine.submit(prompt, SamplingParams(max_tokens=4), at_step=step) for prompt, step in requests]
        engine.run()
        runs.append(([engine.result(r) for r in ids], rows))
    return runs


def logit_checks(hot, cold):
    return {h.rid: (h.logit_checks, c.logit_checks) for h, c in zip(hot, cold)}


def test_a_clean_engines_hits_never_part_from_their_cold_runs(tiny_model):
    """On the exact sim engine every hit's live state equals its cold run's at every position both wrote, and so
    do the logits of every token."""
    (hot, hot_rows), (cold, cold_rows) = hot_and_cold(tiny_model, hit_heavy(9))
    found = {d.rid: d for d in divergences(hot_rows, cold_rows, logits=logit_checks(hot, cold))}
    hits = [r.rid for r in hot if r.cached_tokens]
    assert len(hits) >= 5 and all(len(r.logit_checks) == 4 for r in hot)
    assert [rid for rid in hits if found[rid].parted] == []
    assert all(found[rid].compared >= 4 and found[rid].restored_at for rid in hits)  # prompt end and decode tokens


def test_a_snapshot_nobody_wrote_parts_a_hit_at_its_first_forward(tiny_model):
    """track_writer=off: the 64-boundary snapshots a hit restores were never written, so its state parts at the
    first position it writes after the restore, in a forward of at least one item in each run."""
    (hot, hot_rows), (cold, cold_rows) = hot_and_cold(tiny_model, hit_heavy(9), faults={"track_writer=off"})
    found = {d.rid: d for d in divergences(hot_rows, cold_rows, logits=logit_checks(hot, cold))}
    first_write = {}
    for row in hot_rows:
        if row["type"] == "slot_write":
            first_write.setdefault(row["rid"], row["position"])
    hits = [r for r in hot if r.cached_tokens]
    assert len(hits) >= 5
    for hit in hits:
        divergence = found[hit.rid]
        assert divergence.state_at == first_write[hit.rid] and divergence.first_forward, divergence.describe()
        assert divergence.restored_at == hit.cached_tokens < divergence.state_at
        assert min(divergence.packed) >= 1 and divergence.token == 0
        assert f"restored at {hit.cached_tokens}" in divergence.describe()
        assert "differs at position" in divergence.describe() and "its first forward" in divergence.describe()


def row(rid, position, checksum, batch=0):
    return {"type": "slot_write", "rid": rid, "position": position, "checksum": checksum, "batch": batch}


def test_equal_states_with_other_logits_name_the_first_token():
    """States equal wherever both wrote, logits parting at token 2: the divergence is the token, not a state."""
    run = [row("a", 150, 1), row("a", 151, 2, batch=1), row("a", 152, 3, batch=2)]
    control = [row("a", 100, 9), row("a", 150, 1), row("a", 151, 2), row("a", 152, 3)]
    (found,) = divergences(run, control, logits={"a": ([5, 6, 7], [5, 6, 8])})
    assert found == Divergence("a", compared=3, token=2)
    assert "equal at all 3 positions" in found.describe() and "output token 2" in found.describe()


def test_the_first_parting_position_counts_and_the_last_write_of_a_position_wins():
    """A position written twice (recomputed) counts by its last write; the first differing position is reported
    with the items its batch packed in each run; requests missing from the control are skipped."""
    run = [row("a", 64, 1, batch=0), row("b", 10, 4, batch=0), row("a", 65, 7, batch=1), row("a", 65, 2, batch=2),
           row("a", 66, 8, batch=3), row("b", 11, 5, batch=3), row("c", 1, 1, batch=3)]
    control = [row("a", 64, 1, batch=5), row("a", 65, 2, batch=6), row("a", 66, 3, batch=7), row("b", 11, 5, batch=7)]
    found = divergences(run, control)
    assert found == [Divergence("a", 3, state_at=66, packed=(3, 2)), Divergence("b", 1)]
    assert not found[1].parted and found[0].parted


def test_a_run_that_stops_early_parts_at_its_first_missing_token():
    """Checks of unequal lengths agreeing as far as both go part at the shorter one's end; with no position written
    by both runs, the sentence says so."""
    (found,) = divergences([row("a", 1, 1)], [row("a", 1, 1)], logits={"a": ([1, 2], [1, 2, 3])})
    assert found.token == 2
    (blind,) = divergences([row("a", 1, 1)], [row("a", 2, 1)], logits={"a": ([1], [2])})
    assert blind == Divergence("a", 0, token=0) and "no position was written by both runs" in blind.describe()


def test_a_request_is_compared_with_the_control_it_is_paired_with():
    """``pairs`` names each run request's control (the harness's controls have ids of their own); unpaired
    requests are skipped."""
    run, control = [row("hit", 5, 1), row("other", 5, 1)], [row("ctl", 4, 0), row("ctl", 5, 2)]
    assert divergences(run, control) == []
    (found,) = divergences(run, control, pairs={"hit": "ctl"})
    assert found == Divergence("hit", 1, state_at=5, packed=(2, 2), first_forward=True)


def test_ledgers_of_two_checksum_formats_compare_logits_alone():
    """Two builds' ledgers (``hammer diff`` / ``replay``) whose state checksums are computed otherwise: equal states
    would checksum apart, so no position is compared; the logits still are. A ledger that names no format (an
    older build's) is another format; two that name the same one compare their states."""
    def ledger(fmt, checksum):
        rows = [{**row("a", 5, checksum), "seq": 2}]
        return rows if fmt is None else [{"type": "checksum_format", "state": fmt, "seq": 1}, *rows]

    logits = {"a": ([1, 2], [1, 3])}
    (found,) = partings(ledger("v2", 7), {"a": "a"}, control_ledger=ledger("v1", 8), logits=logits)
    assert Divergence.from_dict(found) == Divergence("a", 0, token=1, formats=("v2", "v1"))
    assert "checksum a state otherwise (v2 in the run, v1 in the control)" in Divergence.from_dict(found).describe()
    (old,) = partings(ledger("v2", 7), {"a": "a"}, control_ledger=ledger(None, 7))
    assert old["formats"] == ("v2", "no format named") and old["state_at"] is None
    (same,) = partings(ledger("v2", 7), {"a": "a"}, control_ledger=ledger("v2", 8))
    assert same["state_at"] == 5 and same["formats"] is None


def test_a_divergence_reads_back_from_its_json_form():
    """attribution.json holds divergences as dicts (``packed`` a list): ``from_dict`` gives the same one back."""
    found = Divergence("a", 3, state_at=66, packed=(3, 2), token=1, restored_at=64, first_forward=True)
    assert Divergence.from_dict({**json.loads(json.dumps(dataclasses.asdict(found))), "control": "c"}) == found


def test_positions_whose_digest_never_landed_are_not_compared():
    """A live-slot digest of 0 in either ledger never landed (``attribute.UNLANDED``): that position is not compared
    (nor counted), and the first real difference after it is the parting."""
    run = [row("a", 1, 0), row("a", 2, 5, batch=1), row("a", 3, 6, batch=2)]
    control = [row("a", 1, 7), row("a", 2, 5), row("a", 3, 9)]
    (found,) = divergences(run, control)
    assert found == Divergence("a", compared=2, state_at=3, packed=(1, 3))
