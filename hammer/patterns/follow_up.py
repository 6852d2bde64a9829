"""``follow-up``: conversations whose every turn continues the reply the engine actually gave.

Hazard: a turn that ends on a stop (EOS or a stop string) while its next decode is already in
flight (overlap scheduling) is donated at finish at its page-aligned length -- zero-copy under
``donate=transfer``, so the decode in flight writes into the tree's snapshot. The next turn's
prompt begins with exactly that turn's prompt and reply, so it restores that very snapshot: the
finish-at-page-aligned-length case, which identical prompts never reach (they hit the prompt's
64-token snapshots, not the state after a reply). Replies stop at U+FFFD, the first undecodable
byte: that keeps every reply valid text, so the next turn continues it token-exactly, and on the
built-in random model it ends most turns within a few tokens, by stop.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import Probe
from probes.families.arithmetic import PREAMBLE, probe

__all__ = ["NAME", "REPLY_STOP", "generate"]

NAME = "follow-up"
REPLY_STOP = ("\ufffd",)


def generate(seed: int, count: int, *, conversations: int = 2, turns: int = 4, max_tokens: int = 8,
             stop: tuple[str, ...] = REPLY_STOP, gap: int = 2) -> tuple[Op, ...]:
    """Op i is turn ``(i // conversations) % turns`` of conversation ``i % conversations``, one op every
    ``gap`` ticks. Turn 0 asks an arithmetic question after the calculator preamble; turn t > 0
    continues turn t - 1 (``continues``) with a new question. After the last turn a conversation
    starts over, so the repeated turns hit the whole branch, replies included."""
    if conversations < 1 or turns < 1 or max_tokens < 1 or gap < 0:
        raise ValueError(f"{NAME}: need conversations >= 1, turns >= 1, max_tokens >= 1, gap >= 0; got "
                         f"conversations={conversations}, turns={turns}, max_tokens={max_tokens}, gap={gap}")
    ops = []
    for i in range(count):
        conversation, turn = i % conversations, (i // conversations) % turns
        probe = _turn(seed, conversation, turn)
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=i * gap, stop=tuple(stop),
                                 max_tokens=max(max_tokens, probe.max_tokens),
                                 continues=op_id(NAME, seed, i - conversations) if turn else None))
    return with_controls(ops, f"{NAME}-{seed}")


def _turn(seed: int, conversation: int, turn: int) -> Probe:
    """Turn 0: the preamble and a question; later turns: a new line and the next question."""
    group = f"{NAME}/{seed}/{conversation}"
    return probe(f"{group}/{turn}", group, PREAMBLE if turn == 0 else "\n")
