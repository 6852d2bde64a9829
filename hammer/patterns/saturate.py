"""``saturate``: an identical prompt arriving while long decodes fill the batch.

Hazard: a hit admitted into a batch that is busy decoding other requests. Its restore and the
donations of the decoding requests are co-batched, which is when a missing admission barrier, a
late write through an aliased slot, or stale device-resident decode metadata (a key change under
load) corrupts the hit. The long decodes repeat too, so they hit as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hammer.patterns.op import Op, op_id, with_controls
from probes import generate_probes, stable_seed

__all__ = ["NAME", "generate"]

NAME = "saturate"


def generate(seed: int, count: int, *, family: str = "arithmetic", batch: int = 8, decode_tokens: int = 64,
             delay: int = 2, wave_gap: int | None = None, probe_settings: Mapping[str, Any] | None = None
             ) -> tuple[Op, ...]:
    """Waves of ``batch`` ops: ``batch - 1`` long decodes (``decode_tokens`` each) at the wave's tick,
    then the probe ``delay`` ticks later; waves start every ``wave_gap`` ticks (default: half a
    decode, so consecutive waves overlap and the batch stays full)."""
    if batch < 2 or decode_tokens < 1 or delay < 0:
        raise ValueError(f"{NAME}: need batch >= 2, decode_tokens >= 1, delay >= 0; got batch={batch}, "
                         f"decode_tokens={decode_tokens}, delay={delay}")
    wave_gap = decode_tokens // 2 if wave_gap is None else wave_gap
    probe, *fillers = generate_probes(family, stable_seed(NAME, seed), batch, **(probe_settings or {}))
    ops = []
    for i in range(count):
        wave, slot = divmod(i, batch)
        start = wave * wave_gap
        if slot < batch - 1:
            op = Op.from_probe(fillers[slot], request=op_id(NAME, seed, i), pattern=NAME, at=start,
                               max_tokens=max(decode_tokens, fillers[slot].max_tokens))
        else:
            op = Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=start + delay)
        ops.append(op)
    return with_controls(ops, f"{NAME}-{seed}")
