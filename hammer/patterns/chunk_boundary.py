"""``chunk-boundary``: prompts that end just before, on and just after 64-token boundaries.

Hazard: the snapshot at a x64 boundary is the only state a hit can restore. A model op that never
writes it (``track_writer=off``) leaves a blank or stale slot there; a prompt that ends exactly on
a boundary tests that the last token is recomputed and not taken from a half-written state; one
token past it tests the smallest possible suffix. Lengths are counted in byte-tokenizer tokens,
chat template included when ``chat`` is set. Every prompt extends one deterministic filler, so
prompts of different lengths share prefixes, and each length repeats, so repeats hit.
"""

from __future__ import annotations

from hammer.patterns.op import Op, op_id, with_controls
from probes import Message, Probe, count_tokens, render_chat
from probes.families.arithmetic import question
from probes.families.needle import filler

__all__ = ["NAME", "boundary_lengths", "generate"]

NAME = "chunk-boundary"
CHUNK = 64  # the Gated DeltaNet chunk: snapshots and hits sit on its multiples


def boundary_lengths(boundaries: tuple[int, ...], offsets: tuple[int, ...]) -> tuple[int, ...]:
    """Every ``boundary + offset`` (positive), sorted: (64, 128) x (-1, 0, 1) -> 63, 64, 65, 127, 128, 129."""
    return tuple(sorted({b + o for b in boundaries for o in offsets if b + o > 0}))


def generate(seed: int, count: int, *, boundaries: tuple[int, ...] = (64, 128, 192, 256),
             offsets: tuple[int, ...] = (-1, 0, 1), chat: bool = False, gap: int = 4) -> tuple[Op, ...]:
    """Op i asks the prompt of length ``lengths[i % len(lengths)]`` (round robin, so every length
    repeats once all have been asked), one op every ``gap`` ticks."""
    if any(b % CHUNK for b in boundaries) or not boundaries or not offsets:
        raise ValueError(f"{NAME}: boundaries must be non-empty multiples of {CHUNK} and offsets non-empty; got "
                         f"boundaries={boundaries}, offsets={offsets}")
    probes = [_probe(seed, length, chat) for length in boundary_lengths(boundaries, offsets)]
    ops = [Op.from_probe(probes[i % len(probes)], request=op_id(NAME, seed, i), pattern=NAME, at=i * gap)
           for i in range(count)]
    return with_controls(ops, f"{NAME}-{seed}")


def _probe(seed: int, length: int, chat: bool) -> Probe:
    """An arithmetic question padded in front with filler to exactly ``length`` tokens."""
    pid = f"{NAME}/{seed}/{'chat' if chat else 'text'}/{length}"
    text, answer = question(pid)
    wrap = (lambda body: render_chat([Message("user", body)])) if chat else (lambda body: body)
    pad = length - count_tokens(wrap("\n" + text))
    if pad < 0:
        raise ValueError(f"{NAME}: a prompt of {length} tokens cannot hold the question "
                         f"({length - pad} tokens with the template); use larger boundaries")
    body = filler(pad, seed) + "\n" + text
    fields = {"messages": (Message("user", body),)} if chat else {"prompt": body}
    return Probe(id=pid, family="arithmetic", expected=answer, extract="first_number",
                 group=f"{NAME}/{seed}/{'chat' if chat else 'text'}", max_tokens=len(answer) + 4, **fields)
