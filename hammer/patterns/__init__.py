"""Load patterns: pure, seeded generators of request operations (DESIGN.md §5).

``generate(seed, count, **settings) -> tuple[Op, ...]``: ``count`` hammer ops in arrival order,
then one ``control-cold`` op per distinct request they ask. Same seed, same ops. Each pattern's
module docstring names the hazard it provokes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hammer.patterns import (alternate_abandon, branch_fanout, chunk_boundary, donate_hit, follow_up, free_reuse,
                             media_ab, mix, multi_turn, saturate)
from hammer.patterns.op import CONTROL_ARM, HAMMER_ARM, Op, with_controls

__all__ = ["CONTROL_ARM", "HAMMER_ARM", "Op", "PATTERNS", "generate_ops", "hazard", "with_controls"]

_PART_MODULES = (alternate_abandon, saturate, branch_fanout, chunk_boundary, media_ab, multi_turn, follow_up,
                 donate_hit, free_reuse)
_PARTS = {module.NAME: module.generate for module in _PART_MODULES}
PATTERNS: dict[str, Callable[..., tuple[Op, ...]]] = {**_PARTS, mix.NAME: mix.make_generate(_PARTS)}
_HAZARDS = {module.NAME: module.__doc__.strip() for module in (*_PART_MODULES, mix)}


def generate_ops(pattern: str, seed: int, count: int, **settings: Any) -> tuple[Op, ...]:
    """The ops of ``pattern``; raises ValueError naming the known patterns."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    if count < 0:
        raise ValueError(f"count must be >= 0; got {count}")
    return PATTERNS[pattern](seed, count, **settings)


def hazard(pattern: str) -> str:
    """The hazard ``pattern`` provokes (its module docstring)."""
    if pattern not in _HAZARDS:
        raise ValueError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    return _HAZARDS[pattern]
