"""RULER-style needle retrieval: one key/value needle hidden at a chosen depth of a long haystack.

``The special magic number for amber-falcon is 4821937.`` sits at ``depth`` (0 = first, 1 = last)
of ``haystack_tokens`` tokens of filler, and the question comes at the end. The filler is a fixed
function of ``haystack_seed``, so every probe of one haystack shares the prefix up to its needle:
a hit restores a long prefix, and a state restored wrongly loses or garbles the needle.
"""

from __future__ import annotations

import random

from probes.probe import Probe
from probes.seeding import probe_id, settings_tag, stable_rng

__all__ = ["filler", "generate"]

INSTRUCTION = ("Read the text below carefully. A special magic number is hidden in it; you will be asked "
               "for it at the end.\n\n")
ADJECTIVES = ("amber", "silent", "rapid", "golden", "hollow", "crimson", "gentle", "frozen", "bright", "quiet",
              "ancient", "narrow", "velvet", "bitter", "distant", "patient")
NOUNS = ("falcon", "river", "lantern", "harbor", "meadow", "engine", "glacier", "orchard", "canyon", "violin",
         "compass", "thistle", "beacon", "marble", "willow", "comet")
VERBS = ("crosses", "follows", "watches", "circles", "remembers", "carries", "shelters", "outlasts")


def filler(length: int, haystack_seed: int) -> str:
    """Exactly ``length`` characters (= tokens) of deterministic filler sentences; a longer haystack of
    the same seed extends a shorter one."""
    rng = random.Random(haystack_seed)
    sentences, size = [], 0
    while size < length:
        sentence = (f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
                    f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}. ")
        sentences.append(sentence)
        size += len(sentence)
    return "".join(sentences)[:length]


def generate(seed: int, count: int, *, haystack_tokens: int = 512,
             depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0), haystack_seed: int = 0) -> tuple[Probe, ...]:
    """``count`` probes; probe i hides its needle at ``depths[i % len(depths)]``."""
    if haystack_tokens < 1:
        raise ValueError(f"haystack_tokens must be >= 1; got {haystack_tokens}")
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise ValueError(f"depths must be a non-empty tuple of numbers in [0, 1]; got {depths!r}")
    settings = {"haystack_tokens": haystack_tokens, "depths": list(depths), "haystack_seed": haystack_seed}
    haystack = filler(haystack_tokens, haystack_seed)
    group = f"needle/{settings_tag(settings)}"
    return tuple(_probe(probe_id("needle", settings, seed, i), group, haystack, depths[i % len(depths)])
                 for i in range(count))


def _needle_position(haystack: str, depth: float) -> int:
    """The sentence start nearest ``depth`` of the haystack (0 and the very end count as starts)."""
    starts = [0, *(i + 2 for i in range(len(haystack) - 1) if haystack[i:i + 2] == ". "), len(haystack)]
    goal = depth * len(haystack)
    return min(starts, key=lambda s: (abs(s - goal), s))


def _probe(pid: str, group: str, haystack: str, depth: float) -> Probe:
    rng = stable_rng(pid)
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    value = str(rng.randint(1_000_000, 9_999_999))
    at = _needle_position(haystack, depth)
    before = haystack[:at]
    gap = "" if not before or before.endswith(" ") else " "
    needle = f"{gap}The special magic number for {key} is {value}. "
    prompt = (f"{INSTRUCTION}{before}{needle}{haystack[at:]}\n\n"
              f"What is the special magic number for {key} mentioned in the text above? Answer:")
    return Probe(id=pid, family="needle", expected=value, extract="first_number", group=group, prompt=prompt,
                 max_tokens=12)
