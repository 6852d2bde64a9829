"""What ``/metrics`` and ``/debug/integrity`` report, read on the engine thread and rendered off it.

``read_metrics`` and ``integrity_report`` run inside the engine thread (``EngineLoop.call``);
``render`` turns the snapshot into the Prometheus text exposition format (version 0.0.4).
"""

from __future__ import annotations

from dataclasses import dataclass

from mini_engine.engine import Engine
from mini_engine.server.loop import RequestCounters

__all__ = ["MetricsSnapshot", "integrity_report", "read_metrics", "render"]

PREFIX = "mini_engine"
FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True)
class MetricsSnapshot:
    running: int
    waiting: int
    prompt_tokens: int
    cached_tokens: int
    slots_by_role: dict[str, int]
    slots_capacity: int
    pages_used: int
    pages_capacity: int
    evictions: int
    fence_retries: int
    finished: dict[str, int]
    clones: int  # copy-on-donate's slot copies
    clone_bytes: int
    fence_readbacks: int
    fence_readback_seconds: float


def read_metrics(engine: Engine, counters: RequestCounters) -> MetricsSnapshot:
    """Engine thread only."""
    slots, pages = engine.cache.slots, engine.cache.pages
    finished = {reason: counters.finished[reason] for reason in FINISH_REASONS}
    return MetricsSnapshot(len(engine.scheduler.running), len(engine.scheduler.waiting), counters.prompt_tokens,
                           counters.cached_tokens, slots.usage_by_role(), slots.capacity, pages.used_count,
                           pages.capacity, engine.cache.evictions, engine.metadata.retries, finished,
                           engine.cache.clones, engine.cache.clone_bytes, engine.metadata.readbacks,
                           engine.metadata.readback_seconds)


def integrity_report(engine: Engine) -> dict:
    """Engine thread only: the pools' and the tree's conservation laws, and what is in use."""
    try:
        engine.check_integrity()
    except Exception as err:  # a broken law is the report, not a crash
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    slots = engine.cache.slots
    return {"ok": True, "slots_used": slots.used_count, "slots_by_role": slots.usage_by_role(),
            "pages_used": engine.cache.pages.used_count}


def render(m: MetricsSnapshot) -> str:
    lines: list[str] = []
    family = _family(lines)
    family("requests_running", "gauge", "Requests (choices) being prefilled or decoded.", [("", m.running)])
    family("requests_waiting", "gauge", "Requests queued for admission.", [("", m.waiting)])
    family("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", [("", m.prompt_tokens)])
    family("prompt_cached_tokens_total", "counter", "Prompt tokens of finished requests served from the prefix "
           "cache (cache hits).", [("", m.cached_tokens)])
    family("slots_used", "gauge", "Linear-state slots in use, by owner role.",
           [(_labels(role=role), n) for role, n in m.slots_by_role.items()])
    family("slots_capacity", "gauge", "Linear-state slots in the pool (slot 0, the padding sink, excluded).",
           [("", m.slots_capacity)])
    family("pages_used", "gauge", "KV pages in use.", [("", m.pages_used)])
    family("pages_capacity", "gauge", "KV pages in the pool.", [("", m.pages_capacity)])
    family("cache_evictions_total", "counter", "Radix-tree evictions (snapshots and pages released).",
           [("", m.evictions)])
    family("metadata_fence_retries_total", "counter", "Decode-metadata re-uploads after a mismatching readback.",
           [("", m.fence_retries)])
    family("metadata_fence_readbacks_total", "counter", "Decode-metadata uploads read back and verified (the fence).",
           [("", m.fence_readbacks)])
    family("metadata_fence_readback_seconds_total", "counter", "Host time blocked in the fence's readbacks.",
           [("", m.fence_readback_seconds)])
    family("donation_clones_total", "counter", "Slot copies made by copy-on-donate.", [("", m.clones)])
    family("donation_clone_bytes_total", "counter", "Bytes those copies moved.", [("", m.clone_bytes)])
    family("requests_finished_total", "counter", "Finished choices by finish reason.",
           [(_labels(finish_reason=reason), n) for reason, n in m.finished.items()])
    family("requests_aborted_total", "counter", "Choices aborted (client gone) before they finished.",
           [("", m.finished["abort"])])
    return "\n".join(lines) + "\n"


def _family(lines: list[str]):
    def add(name: str, kind: str, help_text: str, samples: list[tuple[str, int]]) -> None:
        full = f"{PREFIX}_{name}"
        lines.extend([f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"])
        lines.extend(f"{full}{labels} {value}" for labels, value in samples)
    return add


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
