"""forensics.donated_states: each restore paired with the bytes its slot was donated with (sim device)."""

import random

from forensics.attribute import donated_states
from mini_engine.engine import Engine, EngineConfig, SamplingParams


def test_transfer_restores_bytes_changed_after_donation_copy_does_not(tiny_model):
    """A stop-finished reply under overlap: transfer's donated live slot is written by the decode in
    flight, so the next turn's restore reads other bytes than were donated; copy's clone is untouched."""
    prompt = [random.Random(1).randrange(256) for _ in range(90)]
    same = {}
    for policy in ("copy", "transfer"):
        rows = []
        engine = Engine(EngineConfig(overlap=True, page_size=1, num_pages=4096, donate_policy=policy),
                        model=tiny_model, sink=rows.append)
        free = engine.submit(prompt, SamplingParams(max_tokens=6))
        engine.run()
        out = engine.result(free).output_ids
        stop = next(t for i, t in enumerate(out) if i >= 2 and t not in out[:i])
        reply = list(out[: out.index(stop) + 1])
        engine.submit(prompt, SamplingParams(max_tokens=6, stop_token_ids=(stop,)))
        engine.run()
        follow = engine.submit(prompt + reply + [7, 8, 9], SamplingParams(max_tokens=2))
        engine.run()
        read, donated = next((r, d) for r, d in donated_states(rows) if r.get("rid") == follow)
        same[policy] = read["src_checksum"] == donated["checksum"]
    assert same == {"copy": True, "transfer": False}
