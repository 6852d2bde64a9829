"""Media A/B alternation: identical prompt text, different media, different right answers.

A media item is a small byte string (``b"color:red;shape:circle"``). Probes come in A/B pairs whose
prompt text is byte-identical and whose media differ in every attribute, so the only thing that
tells the engine which answer is right is the media itself. An engine whose cache key leaves out
the media digest serves B from A's cached prefix and answers about A. The media marker sits early
and the prompt is long, so the cached prefix (a multiple of 64 tokens) holds the media.
"""

from __future__ import annotations

from probes.probe import Probe
from probes.seeding import probe_id, settings_tag, stable_rng
from probes.text import MEDIA_MARKER

__all__ = ["ATTRIBUTES", "generate", "media_item"]

ATTRIBUTES = {
    "color": ("red", "blue", "green", "yellow", "purple", "orange"),
    "shape": ("circle", "square", "triangle", "star", "hexagon", "diamond"),
}
# Room for the longest answer word after its leading space, and the end of the reply (bytes are tokens).
MAX_TOKENS = max(len(v) for values in ATTRIBUTES.values() for v in values) + 4
INSTRUCTION = (
    "The media item above encodes a single object with a color and a shape. Look at the item itself, "
    "not at anything said about earlier items, and answer the question about it with one lower-case word.\n"
)


def media_item(values: dict[str, str]) -> bytes:
    """``{"color": "red", "shape": "circle"}`` -> ``b"color:red;shape:circle"`` (attributes in a fixed order)."""
    return ";".join(f"{name}:{values[name]}" for name in ATTRIBUTES).encode("ascii")


def generate(seed: int, count: int, *, attributes: tuple[str, ...] = ("color", "shape")) -> tuple[Probe, ...]:
    """``count`` probes in the order A, B, A, B, ...: probes 2k and 2k+1 share text, differ in media.

    Pair k asks about ``attributes[k % len(attributes)]``.
    """
    unknown = [a for a in attributes if a not in ATTRIBUTES]
    if not attributes or unknown:
        raise ValueError(f"attributes must be a non-empty subset of {tuple(ATTRIBUTES)}; got {attributes!r}")
    settings = {"attributes": list(attributes)}
    tag = settings_tag(settings)
    probes: list[Probe] = []
    for pair in range(-(-count // 2)):
        attribute = attributes[pair % len(attributes)]
        pid = probe_id("media", settings, seed, pair)
        a, b = _pair_values(pid)
        prompt = f"Media item: {MEDIA_MARKER}\n{INSTRUCTION}What {attribute} is shown? Answer:"
        for side, values in (("A", a), ("B", b)):
            probes.append(Probe(id=f"{pid}/{side}", family="media", expected=values[attribute],
                                extract="exact_word", group=f"media/{tag}/{attribute}", prompt=prompt,
                                media=(media_item(values),), max_tokens=MAX_TOKENS))
    return tuple(probes[:count])


def _pair_values(pid: str) -> tuple[dict[str, str], dict[str, str]]:
    """Two objects that differ in every attribute."""
    rng = stable_rng(pid)
    picks = {name: rng.sample(choices, 2) for name, choices in ATTRIBUTES.items()}
    return ({name: pair[0] for name, pair in picks.items()}, {name: pair[1] for name, pair in picks.items()})
