"""``hammer probe FAMILY``: the probes of one family, each asked cold and then again (a hit).

A pure generator like the patterns (same seed, same ops), named ``probe:<family>`` wherever a
pattern name goes, so soak rounds, resume and replay treat it as one more pattern.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hammer.patterns import Op, generate_ops, with_controls
from probes import FAMILIES, Message, generate_probes, stable_seed

__all__ = ["PROBE_PREFIX", "probe_ops", "source_ops"]

PROBE_PREFIX = "probe:"


def probe_ops(family: str, seed: int, count: int, *, gap: int = 2, **settings: Any) -> tuple[Op, ...]:
    """``count`` ops over ``ceil(count / 2)`` probes of ``family``: each probe cold, then once more,
    one op every ``gap`` ticks; a probe with media is sent as a chat user message (the only OpenAI
    request that carries media)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown probe family {family!r}; known: {', '.join(FAMILIES)}")
    name = f"{PROBE_PREFIX}{family}"
    probes = generate_probes(family, stable_seed(name, seed), -(-count // 2), **settings)
    ops = []
    for i in range(count):
        probe = probes[i // 2]
        if probe.media:
            probe = replace(probe, prompt=None, messages=(Message("user", probe.prompt),))
        ops.append(Op.from_probe(probe, request=f"{family}-{seed}-{i:04d}", pattern=name, at=i * gap))
    return with_controls(ops, f"{family}-{seed}")


def source_ops(name: str, seed: int, count: int, **settings: Any) -> tuple[Op, ...]:
    """The ops of a pattern, or of ``probe:<family>``; ValueError naming what is known otherwise."""
    if name.startswith(PROBE_PREFIX):
        return probe_ops(name[len(PROBE_PREFIX):], seed, count, **settings)
    return generate_ops(name, seed, count, **settings)
