"""``multi-turn``: conversations whose later turns extend the earlier ones.

Hazard: the prefix of turn t is turn t-1's prompt plus the assistant's answer, so each turn hits
the branch the previous turn donated at finish -- including the page-aligned tail of a decode.
A finish donation that aliases the live slot, or a stale snapshot at the turn boundary, makes a
later turn forget a fact stated at the start. Conversations run side by side, turn by turn.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import generate_probes, stable_seed

__all__ = ["NAME", "generate"]

NAME = "multi-turn"


def generate(seed: int, count: int, *, conversations: int = 2, facts: int = 3, filler_turns: int = 2,
             gap: int = 6) -> tuple[Op, ...]:
    """Op i asks turn ``(i // conversations) % facts`` of conversation ``i % conversations``, one op
    every ``gap`` ticks; after the last turn the conversations start over (now as full hits)."""
    if conversations < 1 or gap < 0:
        raise ValueError(f"{NAME}: need conversations >= 1 and gap >= 0; got conversations={conversations}, "
                         f"gap={gap}")
    probes = generate_probes("recall", stable_seed(NAME, seed), conversations * facts, facts=facts,
                             filler_turns=filler_turns)
    ops = []
    for i in range(count):
        conversation, turn = i % conversations, (i // conversations) % facts
        ops.append(Op.from_probe(probes[conversation * facts + turn], request=op_id(NAME, seed, i), pattern=NAME,
                                 at=i * gap))
    return with_controls(ops, f"{NAME}-{seed}")
