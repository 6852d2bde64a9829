"""The host time of a decode step's ledger rows: one ``emit`` a row against the step's rows made together.

A decode step of B sequences gives the ledger 2B rows (each sequence's ``slot_write`` and ``decode_metadata``)
whose checksums are device values. Emitted a row at a time, each row carries ``DeviceDigest`` fields (one object
per field), is queued, checked for landing and resolved field by field at the flush. ``Instrumentation.emit_rows``
queues the step as one entry with one value (``DeviceDigests``, the step's 2B digests) and makes its rows only
once that has landed. Every way runs here on the same lanes with the same sink, the instrumentation's own host time
(``host_seconds``: emit and flush, the sink included) per row compared in one process; a host-valued ``emit`` a
row (no device values at all: the floor of building a row) is shown beside them. The lanes live on ``--device``
(on cuda, real events and the lanes copied to pinned host memory each step, as the runner does; on the CPU,
events that have passed). A fourth way queues the step together and flushes as a shadow flush does
(``flush(until=)``: ``FLUSH_CHUNK_ROWS`` rows at a time, the values of each chunk read back on their own; here
``until`` is never true, so every landed row still goes): with ``--flush-every N`` > 1 a flush holds N steps'
rows, and this way shows what reading them back a chunk at a time costs against once a flush.

Usage: ``python benchmarks/ledger_rows.py [--device cpu|cuda] [--batch B] [--steps N] [--flush-every N]
[--repeats R] [--out F]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from typing import NamedTuple

import torch

from mini_engine.engine.request import Request, SamplingParams
from mini_engine.engine.runner import BatchItem
from mini_engine.engine.step_ledger import decode_step_rows
from mini_engine.instrument import FLUSH_CHUNK_ROWS, Instrumentation
from mini_engine.ops.checksum.deferred import DeviceDigest, DeviceDigests, on_host


class Passed:
    """A CPU stand-in for a CUDA event that has completed."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class Step(NamedTuple):
    """A decode step's sequences: ``known`` (rid, slot, position after the step, staged page-table digest) each, and
    the same as the runner holds them: its decode items and the kept digests of their staged page tables."""

    known: list[tuple[str, int, int, int]]
    items: list[BatchItem]
    staged: dict[tuple[int, ...], int]


def step_rows(batch: int) -> Step:
    """A step of ``batch`` sequences."""
    known = [(f"r{b}", b + 1, 100 + b, 0x5EED + b) for b in range(batch)]
    items = [BatchItem(Request(rid, [0], SamplingParams()), position - 1, 1, None, slot, (slot, position), True, None)
             for rid, slot, position, _ in known]
    return Step(known, items, {it.pages: digest for it, (*_, digest) in zip(items, known)})


def per_row(events: Instrumentation, lanes: torch.Tensor, step: Step, event) -> None:
    """A row at a time, a ``DeviceDigest`` per device field (the runner's way before ``emit_rows``)."""
    n = len(step.known)
    for r, (rid, slot, position, staged) in enumerate(step.known):
        events.emit("slot_write", batch=1, rid=rid, slot=slot, role="live", position=position,
                    checksum=DeviceDigest(lanes, event, r))
        read = DeviceDigest(lanes, event, n + r)
        events.emit("decode_metadata", batch=1, rid=rid, read_checksum=read, staged_checksum=staged,
                    match=_Equals(lanes, event, n + r, staged))


class _Equals(DeviceDigest):
    """Whether the digest equals a host digest (the per-row way's match field)."""

    __slots__ = ("expected",)

    def __init__(self, lanes, event, row, expected) -> None:
        super().__init__(lanes, event, row)
        self.expected = expected

    def finish(self, read, first):
        return super().finish(read, first) == self.expected


def together(events: Instrumentation, lanes: torch.Tensor, step: Step, event) -> None:
    """The step's rows as one entry (the runner's ``_report_step``, its own row builder, which reads the items and
    their staged digests when the rows are made)."""
    events.emit_rows(2 * len(step.items), DeviceDigests(lanes, event),
                     decode_step_rows(1, step.items, step.staged.__getitem__))


def host_rows(events: Instrumentation, lanes: torch.Tensor, step: Step, event) -> None:
    """Host values, a row at a time: no device value to wait for or read back (the floor)."""
    for rid, slot, position, staged in step.known:
        events.emit("slot_write", batch=1, rid=rid, slot=slot, role="live", position=position, checksum=staged)
        events.emit("decode_metadata", batch=1, rid=rid, read_checksum=staged, staged_checksum=staged, match=True)


def never() -> bool:
    """A shadow flush's ``until`` on a device that never finishes first: every landed row goes, a chunk at a time."""
    return False


# name -> (the step's rows queued, the flush's ``until``)
WAYS = {"one emit a row": (per_row, None), "emit_rows (the step together)": (together, None),
        "emit_rows, flushed in chunks": (together, never), "host values, one emit a row": (host_rows, None)}


def run(way, until, device: str, batch: int, steps: int, flush_every: int) -> tuple[float, list[dict]]:
    """The instrumentation's host seconds per row over ``steps`` steps, flushed every ``flush_every`` (with
    ``until``), and the rows the sink got."""
    rows: list[dict] = []
    events = Instrumentation(rows.append)
    step = step_rows(batch)
    lanes = torch.randint(0, 1 << 31, (2 * batch, 2), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int64).to(device)
    gc.collect()
    gc.disable()  # as timeit does: a collection inside one way's run is noise, not that way's cost
    try:
        for _ in range(steps):
            # as the runner copies the step graph's outputs to the host each step (``on_host``)
            step_lanes, event = on_host(lanes) if device == "cuda" else (lanes.clone(), Passed())
            way(events, step_lanes, step, event)
            events.step += 1
            if events.step % flush_every == 0:
                events.flush(until=until)
        events.flush(wait=True)
    finally:
        gc.enable()
    return events.host_seconds / len(rows), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--flush-every", type=int, default=1, help="steps between flushes (the engine's periodic "
                        "flush: LEDGER_FLUSH_STEPS = 8; its shadow flush: each step)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/ledger_rows.json")
    args = parser.parse_args()
    if args.flush_every < 1:
        parser.error(f"--flush-every must be at least 1 (steps between flushes); got {args.flush_every}")
    for way, until in WAYS.values():  # warm-up, discarded
        run(way, until, args.device, args.batch, 10, args.flush_every)
    seconds: dict[str, list[float]] = {name: [] for name in WAYS}
    made = {}
    for _ in range(args.repeats):  # interleaved: drift on a noisy machine hits every way alike
        for name, (way, until) in WAYS.items():
            per, made[name] = run(way, until, args.device, args.batch, args.steps, args.flush_every)
            seconds[name].append(per)
    first = made["one emit a row"]
    for name in ("emit_rows (the step together)", "emit_rows, flushed in chunks"):
        if made[name] != first:
            raise SystemExit(f"{name!r} made different rows from one emit a row")
    base = statistics.median(seconds["one emit a row"])
    results = {"device": args.device, "batch": args.batch, "steps": args.steps, "flush_every": args.flush_every,
               "chunk_rows": FLUSH_CHUNK_ROWS, "repeats": args.repeats,
               "rows_a_run": len(first), "ways": {}}
    print(f"a decode step's ledger rows, batch {args.batch}, {args.steps} steps ({len(first)} rows), flushed every "
          f"{args.flush_every} (chunks of {FLUSH_CHUNK_ROWS} rows), {args.device}; median of {args.repeats} "
          "interleaved runs")
    print(f"{'way':34} {'us a row':>9} {'[min, max]':>16} {'vs one emit a row':>18}")
    for name, values in seconds.items():
        median = statistics.median(values)
        results["ways"][name] = {"seconds_a_row": median, "all": values, "vs_one_emit_a_row": median / base}
        print(f"{name:34} {median * 1e6:9.2f} [{min(values) * 1e6:6.2f}, {max(values) * 1e6:6.2f}] "
              f"{median / base:18.3f}")
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
