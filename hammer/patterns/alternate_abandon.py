"""``alternate-abandon``: the identical prompt, alternately run to completion and abandoned after k tokens.

Hazard (the first seed's hammer): a stream the client closes mid-decode is aborted while snapshots
it wrote are being donated to the tree, or while the next identical request is restoring them.
Aliasing (``donate=transfer``), a missing admission barrier or an abort that donates unverified
state shows up as a wrong answer on the next identical request: a hit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hammer.patterns.op import Op, op_id, with_controls
from probes import generate_probes, stable_seed

__all__ = ["NAME", "generate"]

NAME = "alternate-abandon"


def generate(seed: int, count: int, *, family: str = "arithmetic", prompts: int = 1, abandon_after: int = 4,
             gap: int = 2, probe_settings: Mapping[str, Any] | None = None) -> tuple[Op, ...]:
    """Op i asks prompt ``(i // 2) % prompts``; even ops complete, odd ops are cut after ``abandon_after``
    tokens; one arrives every ``gap`` ticks."""
    if prompts < 1 or abandon_after < 1 or gap < 0:
        raise ValueError(f"{NAME}: need prompts >= 1, abandon_after >= 1, gap >= 0; got prompts={prompts}, "
                         f"abandon_after={abandon_after}, gap={gap}")
    probes = generate_probes(family, stable_seed(NAME, seed), prompts, **(probe_settings or {}))
    ops = []
    for i in range(count):
        probe = probes[(i // 2) % prompts]
        # Full and abandoned streams ask the same request (same key): only the client's patience differs.
        max_tokens = max(probe.max_tokens, 2 * abandon_after)
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=i * gap,
                                 max_tokens=max_tokens, abandon_after=abandon_after if i % 2 else None))
    return with_controls(ops, f"{NAME}-{seed}")
