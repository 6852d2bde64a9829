"""``free-reuse``: donors that finish in the step they donate, and cold newcomers taking their slots at once.

Hazard: a slot freed while an op queued on it has not run yet, and handed straight to a new owner.
A donor asks one token, so the forward that writes its 64-boundary snapshot also samples its
last token: the donation clone (copy stream) is queued and, in the same step, the finished donor
frees the snapshot slot the clone has still to read. Newcomers admitted one tick later get the
lowest free slots -- those very ones -- and write them on the compute stream at once (a cold live
slot is cleared at admission, a first forward writes its own snapshot). Only the freed slot's
fences order that write after the clone; without them (``free_unfenced=on``) the write can
overtake it, and the tree keeps the newcomer's state under the donor's prefix. One hit per donor
prefix ``settle`` ticks later restores exactly that snapshot. Several donors per wave queue their
clones one behind another, so the later ones are still pending when the newcomers arrive.

The defaults fit an allocator that hands out the lowest free slot, three per request (live + two
ping-pong), on a fresh engine: the donors' clones take the slots the first donors freed, and with
eight donors the newcomers' live slots (cleared at admission) fall exactly on the snapshot slots
of donors 2..7. Other counts shift that phase and mostly leave the newcomers the donors' live
slots, whose ops have all run; one wave per fresh engine keeps the layout.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import Probe
from probes.families.arithmetic import probe
from probes.families.needle import filler

__all__ = ["NAME", "generate"]

NAME = "free-reuse"
_NEWCOMER_HAYSTACK = 15485863  # keeps the newcomers' filler apart from every donor's


def generate(seed: int, count: int, *, donors: int = 8, newcomers: int = 6, prefix_tokens: int = 70,
             newcomer_tokens: int = 70, hit_tokens: int = 1, settle: int = 2, gap: int = 4) -> tuple[Op, ...]:
    """Waves of ``2 * donors + newcomers`` ops every ``gap`` ticks: ``donors`` one-token requests
    (a fresh prefix each + a question) at the wave's tick, ``newcomers`` identical cold requests
    (their own fresh filler) one tick later, and ``settle`` ticks after the donors one hit per donor
    prefix: the donor's request again, with ``hit_tokens`` tokens (1: the very same request, so its
    control serves both; the reference oracle compares the logits that token came from -- raise it
    on a target that reports no logits digest). A donor's prompt must cross a 64-token boundary
    inside one prefill chunk: ``prefix_tokens`` >= 64 and the prompt under 128 tokens."""
    if (not 64 <= prefix_tokens <= 100 or min(donors, newcomers, newcomer_tokens, hit_tokens) < 1
            or not 1 < settle < gap):
        raise ValueError(f"{NAME}: need 64 <= prefix_tokens <= 100 (one prefill chunk past a 64-boundary), "
                         f"donors >= 1, newcomers >= 1, newcomer_tokens >= 1, hit_tokens >= 1 and 1 < settle < gap; "
                         f"got prefix_tokens={prefix_tokens}, donors={donors}, newcomers={newcomers}, "
                         f"newcomer_tokens={newcomer_tokens}, hit_tokens={hit_tokens}, settle={settle}, gap={gap}")
    per_wave = 2 * donors + newcomers
    ops = []
    for i in range(count):
        wave, k = divmod(i, per_wave)
        start = wave * gap
        if k < donors:
            probe, at, tokens = _donor(seed, wave, k, donors, prefix_tokens), start, 1
        elif k < donors + newcomers:
            probe, at, tokens = _newcomer(seed, wave, newcomer_tokens), start + 1, 1
        else:  # the hits, one per donor prefix, in the donors' order
            probe = _donor(seed, wave, k - donors - newcomers, donors, prefix_tokens)
            at, tokens = start + settle, hit_tokens
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=at, max_tokens=tokens))
    return with_controls(ops, f"{NAME}-{seed}")


def _donor(seed: int, wave: int, j: int, donors: int, prefix_tokens: int) -> Probe:
    pid = f"{NAME}/{seed}/{wave}/{j}"
    return probe(pid, pid, filler(prefix_tokens, seed * 7919 + wave * donors + j) + "\n")


def _newcomer(seed: int, wave: int, tokens: int) -> Probe:
    pid = f"{NAME}/{seed}/{wave}/new"
    return probe(pid, pid, filler(tokens, seed * 7919 + wave + _NEWCOMER_HAYSTACK) + "\n")
