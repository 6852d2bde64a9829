"""``branch-fanout``: many suffixes on one cached prefix, arriving together; some sample n > 1 choices.

Hazard: one branch's snapshot restored into many requests at once (restore without a barrier,
eviction of a locked node under the pressure of a wave), and n > 1 siblings that share the
prompt's partial last page: without page copy-on-write, one sibling's decode overwrites the page
another reads. The primer op warms the prefix alone first, so every wave hits it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hammer.patterns.op import Op, op_id, with_controls
from probes import generate_probes, stable_seed
from probes.seeding import stable_rng

__all__ = ["NAME", "generate"]

NAME = "branch-fanout"


def generate(seed: int, count: int, *, family: str = "arithmetic", fanout: int = 8, sampled: float = 0.25,
             n: int = 2, temperature: float = 0.8, gap: int = 8,
             probe_settings: Mapping[str, Any] | None = None) -> tuple[Op, ...]:
    """Op 0 (the primer) at tick 0; then waves of ``fanout`` ops, all at one tick, every ``gap`` ticks.

    Wave op j asks suffix j (probe j of one prefix group); with probability ``sampled`` it asks
    ``n`` choices at ``temperature`` (seeded per suffix, so a repeat asks the same request).
    """
    if fanout < 1 or not 0.0 <= sampled <= 1.0 or n < 2 or temperature <= 0 or gap < 1:
        raise ValueError(f"{NAME}: need fanout >= 1, 0 <= sampled <= 1, n >= 2, temperature > 0, gap >= 1; got "
                         f"fanout={fanout}, sampled={sampled}, n={n}, temperature={temperature}, gap={gap}")
    probes = generate_probes(family, stable_seed(NAME, seed), fanout, **(probe_settings or {}))
    coin = stable_rng(NAME, seed, "sampled")
    ops = [Op.from_probe(probes[0], request=op_id(NAME, seed, 0), pattern=NAME, at=0)] if count else []
    for i in range(1, count):
        wave, j = divmod(i - 1, fanout)
        sampling = {}
        if coin.random() < sampled:
            sampling = {"n": n, "temperature": temperature, "seed": stable_seed(NAME, seed, j) % 2**31}
        ops.append(Op.from_probe(probes[j], request=op_id(NAME, seed, i), pattern=NAME, at=(wave + 1) * gap,
                                 **sampling))
    return with_controls(ops, f"{NAME}-{seed}")
