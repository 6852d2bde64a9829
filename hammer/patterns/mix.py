"""``mix``: a seeded interleaving of the other patterns, all running at once.

Hazard: every hazard of its parts, plus their interactions -- eviction pressure from one pattern
while another hits, media and text branches side by side, fan-outs during abandons. Each op keeps
the name of the pattern that shaped it (``op.pattern``), so rates can still be split per pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from hammer.patterns.op import HAMMER_ARM, Op, op_id, with_controls
from probes import stable_seed
from probes.seeding import stable_rng

__all__ = ["NAME", "make_generate"]

NAME = "mix"


def make_generate(parts: dict[str, Callable[..., tuple[Op, ...]]]) -> Callable[..., tuple[Op, ...]]:
    """The mix generator over ``parts`` (the registry of the other patterns)."""

    def generate(seed: int, count: int, *, patterns: tuple[str, ...] = tuple(parts), spread: int = 8,
                 part_settings: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[Op, ...]:
        """``count`` ops shared among ``patterns`` (seeded split), each part generated with its own
        derived seed (and ``part_settings[name]``), shifted by a seeded start in ``[0, spread)``
        ticks, merged by arrival."""
        part_settings = part_settings or {}
        unknown = [p for p in (*patterns, *part_settings) if p not in parts]
        if not patterns or unknown:
            raise ValueError(f"{NAME}: patterns must be a non-empty subset of {tuple(parts)}; got {patterns!r}")
        rng = stable_rng(NAME, seed)
        shares = _split(count, len(patterns), rng.randrange)
        merged = []
        for name, share in zip(patterns, shares):
            start = rng.randrange(max(spread, 1))
            part = parts[name](stable_seed(NAME, seed, name) % 2**31, share, **part_settings.get(name, {}))
            merged += [(op.at + start, rng.random(), op) for op in part if op.arm == HAMMER_ARM]
        merged.sort(key=lambda entry: entry[:2])  # arrival, then a seeded tie-break between parts
        renamed = {op.request: op_id(NAME, seed, i) for i, (_, _, op) in enumerate(merged)}
        ops = [replace(op, request=renamed[op.request], at=at, continues=renamed.get(op.continues, op.continues))
               for at, _, op in merged]
        return with_controls(ops, f"{NAME}-{seed}")

    return generate


def _split(count: int, ways: int, randrange: Callable[[int], int]) -> list[int]:
    """``count`` split into ``ways`` near-equal shares; the remainder goes to seeded parts."""
    shares = [count // ways] * ways
    for _ in range(count % ways):
        shares[randrange(ways)] += 1
    return shares
