"""Probe families: pure, seeded generators ``generate(seed, count, **settings) -> tuple[Probe, ...]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probes.families import arithmetic, media, needle, recall
from probes.probe import Probe

__all__ = ["FAMILIES", "generate_probes"]

FAMILIES: dict[str, Callable[..., tuple[Probe, ...]]] = {
    "arithmetic": arithmetic.generate,
    "needle": needle.generate,
    "recall": recall.generate,
    "media": media.generate,
}


def generate_probes(family: str, seed: int, count: int, **settings: Any) -> tuple[Probe, ...]:
    """``count`` probes of ``family``; raises ValueError naming the known families."""
    if family not in FAMILIES:
        raise ValueError(f"unknown probe family {family!r}; known: {', '.join(FAMILIES)}")
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    return FAMILIES[family](seed, count, **settings)
