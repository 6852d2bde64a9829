"""``media-ab``: the same prompt text with media A, then B, then A, ...

Hazard: a cache key without the media digest (``media_key=off``). A and B have byte-identical
text, so such a key serves B from A's cached prefix and the answer describes A. With a correct
key A and B never share a prefix past the media, and each still hits its own earlier run. By
default the prompt goes as a chat user message: chat is the only OpenAI request that carries media.
"""

from __future__ import annotations

from dataclasses import replace

from hammer.patterns.op import Op, op_id, with_controls
from probes import Message, generate_probes, stable_seed

__all__ = ["NAME", "generate"]

NAME = "media-ab"


def generate(seed: int, count: int, *, pairs: int = 1, attributes: tuple[str, ...] = ("color", "shape"),
             gap: int = 2, chat: bool = True) -> tuple[Op, ...]:
    """Op i asks side ``i % 2`` (A, B) of pair ``(i // 2) % pairs``, one op every ``gap`` ticks (as a
    chat user message when ``chat``, else as a completion prompt)."""
    if pairs < 1 or gap < 0:
        raise ValueError(f"{NAME}: need pairs >= 1 and gap >= 0; got pairs={pairs}, gap={gap}")
    probes = generate_probes("media", stable_seed(NAME, seed), 2 * pairs, attributes=attributes)
    ops = []
    for i in range(count):
        probe = probes[2 * ((i // 2) % pairs) + i % 2]
        if chat:
            probe = replace(probe, prompt=None, messages=(Message("user", probe.prompt),))
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=i * gap))
    return with_controls(ops, f"{NAME}-{seed}")
