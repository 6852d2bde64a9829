"""``donate-hit``: a fresh prefix, hits on it in the very next steps, and a cold newcomer beside them.

Hazard: the restore of a hit queued right behind the donation that fills its source slot. The
donation clone runs on the copy stream; without the admission barrier the hit's restore can
overtake it and read a slot nobody has filled yet. Under slot pressure (few slots, e.g.
``--num-slots 6 --max-running 2``) the newcomer admitted with the hits forces an eviction, and
eviction that ignores snapshot locks frees the snapshot a hit holds but has not restored yet.
Each wave uses a new prefix, so every wave donates afresh: the warm request, hits one tick later
(their restores queue behind the donation clone), and once the warm request has finished, a late
hit and the newcomer admitted in the same step (the newcomer's slots come from eviction).
``prefixes`` > 1 warms several fresh prefixes in the same tick: their clones queue one behind
another on the copy stream, and the hits come newest donation first, so the first restore queued
races the clone deepest in that queue.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import Probe, count_tokens
from probes.families.arithmetic import probe
from probes.families.needle import filler

__all__ = ["NAME", "generate"]

NAME = "donate-hit"


def generate(seed: int, count: int, *, prefix_tokens: int = 130, hits: int = 2, newcomer_tokens: int = 40,
             settle: int = 8, gap: int = 12, prefixes: int = 1, max_tokens: int | None = None,
             repeat: bool = False) -> tuple[Op, ...]:
    """Waves of ``prefixes * (hits + 1) + 2`` ops every ``gap`` ticks: one warm request per prefix
    (prefix + question 0) at the wave's tick, ``hits`` hits per prefix (prefix + question k) one tick
    later, the newest prefix's first, then, ``settle`` ticks after the warm requests (they have
    finished), one more hit on the first prefix and a newcomer (its own filler) together.
    ``max_tokens``: what every op asks (default: each probe's answer length + 4); ``repeat``: the
    hits one tick later ask their warm request's own question (the same request again, so one
    control serves both)."""
    if (prefix_tokens < 64 or hits < 0 or newcomer_tokens < 1 or not 1 < settle < gap or prefixes < 1
            or (max_tokens is not None and max_tokens < 1)):
        raise ValueError(f"{NAME}: need prefix_tokens >= 64 (a snapshot to donate), hits >= 0, newcomer_tokens >= 1, "
                         f"1 < settle < gap, prefixes >= 1 and max_tokens >= 1; got prefix_tokens={prefix_tokens}, "
                         f"hits={hits}, newcomer_tokens={newcomer_tokens}, settle={settle}, gap={gap}, "
                         f"prefixes={prefixes}, max_tokens={max_tokens}")
    warm, racing = prefixes, prefixes * hits
    per_wave = warm + racing + 2
    ops = []
    for i in range(count):
        wave, k = divmod(i, per_wave)
        start = wave * gap
        if k < warm:
            probe, at = _probe(seed, wave, k, 0, prefixes, prefix_tokens), start
        elif k < warm + racing:  # newest prefix first: its clone waits deepest in the copy queue
            j, h = divmod(k - warm, hits)
            probe, at = _probe(seed, wave, prefixes - 1 - j, 0 if repeat else 1 + h, prefixes, prefix_tokens), start + 1
        elif k == warm + racing:  # the late hit
            probe, at = _probe(seed, wave, 0, hits + 1, prefixes, prefix_tokens), start + settle
        else:
            probe, at = _newcomer(seed, wave, hits + 2, newcomer_tokens), start + settle
        asked = {} if max_tokens is None else {"max_tokens": max_tokens}
        ops.append(Op.from_probe(probe, request=op_id(NAME, seed, i), pattern=NAME, at=at, **asked))
    return with_controls(sorted(ops, key=lambda op: op.at), f"{NAME}-{seed}")


def _probe(seed: int, wave: int, j: int, k: int, prefixes: int, prefix_tokens: int) -> Probe:
    """Question ``k`` on prefix ``j`` of the wave (one prefix per wave: the ids and text of old)."""
    pid = f"{NAME}/{seed}/{wave}" if prefixes == 1 else f"{NAME}/{seed}/{wave}.{j}"
    return _question(f"{pid}/{k}", pid, filler(prefix_tokens, seed * 7919 + wave * prefixes + j))


def _newcomer(seed: int, wave: int, k: int, tokens: int) -> Probe:
    return _question(f"{NAME}/{seed}/{wave}/{k}", f"{NAME}/{seed}/{wave}",
                     filler(tokens, seed * 7919 + wave + 104729))


def _question(pid: str, group: str, prefix: str) -> Probe:
    asked = probe(pid, group, prefix + "\n")
    assert count_tokens(asked.prompt) > len(prefix)
    return asked
