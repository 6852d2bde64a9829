"""Stable seeds: derived with blake2b from names, never with Python's per-process ``hash``."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from typing import Any

__all__ = ["probe_id", "settings_tag", "stable_rng", "stable_seed"]


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from ``parts`` (their ``str``), the same on every machine and every run."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def stable_rng(*parts: object) -> random.Random:
    """A private ``random.Random`` seeded from ``parts`` (e.g. a probe id)."""
    return random.Random(stable_seed(*parts))


def settings_tag(settings: Mapping[str, Any]) -> str:
    """Six hex digits naming a settings mapping, so probes made with other settings get other ids."""
    text = json.dumps(settings, sort_keys=True, default=repr)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=3).hexdigest()


def probe_id(family: str, settings: Mapping[str, Any], seed: int, index: int) -> str:
    """``family/<settings tag>/seed/index``: unique per generator call, the key of the probe's own seed."""
    return f"{family}/{settings_tag(settings)}/{seed}/{index}"
