"""``donate-hit``: a fresh prefix, hits on it in the very next steps, and a cold newcomer beside them.

Hazard: the restore of a hit queued right behind the donation that fills its source slot. The
donation clone runs on the copy stream; without the admission barrier the hit's restore can
overtake it and read a slot nobody has filled yet. Under slot pressure (few slots, e.g.
``--num-slots 6 --max-running 2``) the newcomer admitted with the hits forces an eviction, and
eviction that ignores snapshot locks frees the snapshot a hit holds but has not restored yet.
Each wave uses a new prefix, so every wave donates afresh: the warm request, hits one tick later
(their restores queue behind the donation clone), and once the warm request has finished, a late
hit and the newcomer admitted in the same step (the newcomer's slots come from eviction).
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import Probe, count_tokens
from probes.families.arithmetic import question
from probes.families.needle import filler

__all__ = ["NAME", "generate"]

NAME = "donate-hit"


def generate(seed: int, count: int, *, prefix_tokens: int = 130, hits: int = 2, newcomer_tokens: int = 40,
             settle: int = 8, gap: int = 12) -> tuple[Op, ...]:
    """Waves of ``hits + 3`` ops every ``gap`` ticks: the warm request (prefix + question 0) at the
    wave's tick, ``hits`` hits (prefix + question k) one tick later, then, ``settle`` ticks after the
    warm request (it has finished), one more hit and a newcomer (its own filler) together."""
    if prefix_tokens < 64 or hits < 0 or newcomer_tokens < 1 or not 1 < settle < gap:
        raise ValueError(f"{NAME}: need prefix_tokens >= 64 (a snapshot to donate), hits >= 0, newcomer_tokens >= 1 "
                         f"and 1 < settle < gap; got prefix_tokens={prefix_tokens}, hits={hits}, "
                         f"newcomer_tokens={newcomer_tokens}, settle={settle}, gap={gap}")
    per_wave = hits + 3
    ops = []
    for i in range(count):
        wave, k = divmod(i, per_wave)
        start = wave * gap
        prefix = filler(prefix_tokens, seed * 7919 + wave)
        if k == 0:
            probe, at = _probe(seed, wave, k, prefix), start
        elif k <= hits + 1:  # the hits racing the donation, then the late hit
            probe, at = _probe(seed, wave, k, prefix), start + (1 if k <= hits else settle)
        else:
            probe, at = _probe(seed, wave, k, filler(newcomer_tokens, seed * 7919 + wave + 104729)), start + settle
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=at))
    return with_controls(sorted(ops, key=lambda op: op.at), f"{NAME}-{seed}")


def _probe(seed: int, wave: int, k: int, prefix: str) -> Probe:
    pid = f"{NAME}/{seed}/{wave}/{k}"
    text, answer = question(pid)
    body = prefix + "\n" + text
    assert count_tokens(body) > len(prefix)
    return Probe(id=pid, family="arithmetic", expected=answer, extract="first_number", group=f"{NAME}/{seed}/{wave}",
                 max_tokens=len(answer) + 4, prompt=body)
