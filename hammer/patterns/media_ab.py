"""``media-ab``: the same prompt text with media A, then B, then A, ...

Hazard: a cache key without the media digest (``media_key=off``). A and B have byte-identical
text, so such a key serves B from A's cached prefix and the answer describes A. With a correct
key A and B never share a prefix past the media, and each still hits its own earlier run.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import generate_probes, stable_seed

__all__ = ["NAME", "generate"]

NAME = "media-ab"


def generate(seed: int, count: int, *, pairs: int = 1, attributes: tuple[str, ...] = ("color", "shape"),
             gap: int = 2) -> tuple[Op, ...]:
    """Op i asks side ``i % 2`` (A, B) of pair ``(i // 2) % pairs``, one op every ``gap`` ticks."""
    if pairs < 1 or gap < 0:
        raise ValueError(f"{NAME}: need pairs >= 1 and gap >= 0; got pairs={pairs}, gap={gap}")
    probes = generate_probes("media", stable_seed(NAME, seed), 2 * pairs, attributes=attributes)
    ops = [Op.from_probe(probes[2 * ((i // 2) % pairs) + i % 2], request=op_id(NAME, seed, i), pattern=NAME,
                         at=i * gap) for i in range(count)]
    return with_controls(ops, f"{NAME}-{seed}")
