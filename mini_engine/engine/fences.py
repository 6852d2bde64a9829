"""Per-slot fences: every op that touches a slot waits for the other streams' last ops on that slot.

This is the barrier set of the hybrid cache (the admission and donation barriers of the first
seed), made precise. Slots are shared by ops on two streams — forwards on the compute stream,
donation clones on the copy stream — so each slot remembers, per stream, the event recorded after
the last op that touched it. ``before(stream, slots)`` queues the waits an op needs; ``after``
records its own event. Waits on events the device has already passed are skipped: clean steps pay
nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mini_engine.device import Device, Event, Stream

__all__ = ["SlotFences"]


class SlotFences:
    def __init__(self, device: Device) -> None:
        self.device = device
        self._last: dict[int, dict[str, Event]] = defaultdict(dict)
        self.waits = 0

    def before(self, stream: Stream, slots: Iterable[int]) -> None:
        """Order the next op on ``stream`` after every other stream's last op on ``slots``. Mutates (queues waits)."""
        for event in self.outstanding(stream, slots):
            self.device.wait_event(stream, event)
            self.waits += 1

    def outstanding(self, stream: Stream, slots: Iterable[int]) -> list[Event]:
        """The other streams' incomplete last-op events on ``slots`` (what ``before`` would wait for). Pure."""
        pending = {}
        for slot in slots:
            for name, event in self._last[slot].items():
                if name != stream.name and not self.device.is_complete(event):
                    pending[id(event)] = event
        return list(pending.values())

    def after(self, stream: Stream, slots: Iterable[int]) -> Event:
        """Record that the op just queued on ``stream`` touched ``slots``; returns its event. Mutates."""
        event = self.device.new_event()
        self.device.record(event, stream)
        for slot in slots:
            self._last[slot][stream.name] = event
        return event

    def forget(self, slot: int) -> bool:
        """Drop what is known of the ops on ``slot`` (the fault free_unfenced=on: as if they had all
        completed). Returns whether any was still in flight. Mutates."""
        pending = any(not self.device.is_complete(e) for e in self._last[slot].values())
        self._last.pop(slot, None)
        return pending
