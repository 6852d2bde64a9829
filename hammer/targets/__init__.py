"""Targets: where ops go. ``embedded`` (an in-process engine in virtual time) or an HTTP URL
(any OpenAI-compatible server). Selecting one is one option; everything downstream is identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hammer.targets.base import (Completion, Delta, Failure, Indeterminate, Lane, SteppedTarget, StreamingTarget,
                                 Target, TargetUnavailable, Update)

__all__ = ["Completion", "Delta", "Failure", "Indeterminate", "Lane", "SteppedTarget", "StreamingTarget", "Target",
           "TargetUnavailable", "Update", "make_target"]

EMBEDDED = "embedded"


def make_target(spec: str, *, engine: Mapping[str, Any] | None = None, http: Mapping[str, Any] | None = None,
                ledger: Any = None) -> Target:
    """``"embedded"`` -> EmbeddedTarget(engine options, ledger); ``"http://..."`` -> HttpTarget(spec, **http).

    Raises ValueError for anything else, or for options the chosen target does not take.
    """
    if spec == EMBEDDED:
        from hammer.targets.embedded import EmbeddedTarget  # torch loads only when the engine is wanted

        return EmbeddedTarget(engine, ledger=ledger)
    if spec.startswith(("http://", "https://")):
        if engine and any(engine.values()):
            raise ValueError(f"engine options ({', '.join(k for k, v in engine.items() if v)}) apply to the "
                             "embedded target only; configure the server instead")
        from hammer.targets.http import HttpTarget

        return HttpTarget(spec, **(http or {}))
    raise ValueError(f"target must be 'embedded' or an http(s):// URL; got {spec!r}")
