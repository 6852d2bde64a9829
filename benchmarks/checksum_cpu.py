"""The slot checksum on a CPU: the reference's 32-bit arithmetic against the int64 form it replaced, one process.

On the sim and cpu devices the slot ledger's checksums are ``reference.slot_checksum`` on the host, inside
the engine's step: most of the ledger's cost on a CPU run (its host time was 18 % of
``engine_throughput.py``'s ledger run before this change). Two forms of the same formula, timed side by
side on the slot states the engine digests (the tiny model's and the 0.8B shape's, conv | rec | 31 pending
rows, float32):

- ``int64``: words widened to int64 and masked back below 2^32 after every product (the reference until
  2026-12-05, kept here as the baseline);
- ``int32``: the reference now: int32 bit patterns, wrapping products and sums, masked shifts.

Both must give the same digest (checked on every input). Median of ``--repeats`` runs each, interleaved;
prints a table (and the ratio) and writes JSON.

Usage: ``python benchmarks/checksum_cpu.py [--repeats N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mini_engine.device.sim import SimDevice
from mini_engine.engine.storage import StateStorage
from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.ops.checksum.reference import _LANE_OFFSETS, _MASK32, _MIX, slot_checksum


def int64_checksum(tensor: torch.Tensor) -> int:
    """The former reference: the same digest in int64 lanes held below 2^32 by masks."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() % 4:
        raw = torch.cat([raw, raw.new_zeros(-raw.numel() % 4)])
    words = raw.view(torch.int32).to(torch.int64) & _MASK32
    index = torch.arange(words.numel(), dtype=torch.int64)
    x = torch.stack([(index * offset) & _MASK32 for offset in _LANE_OFFSETS]) + words
    x &= _MASK32
    for _ in range(2):
        x ^= x >> 16
        x *= _MIX
        x &= _MASK32
    x ^= x >> 16
    high, low = (x.sum(dim=1) & _MASK32).tolist()
    return (high << 32) | low


def slot_state(model: str) -> tuple[str, torch.Tensor]:
    """A live slot's bytes as the ledger digests them (conv | rec | 31 pending rows), random, float32."""
    states = StateStorage(builtin_config(model), 1, SimDevice())
    for pool in (states.conv, states.rec, states.pending):
        pool.normal_()
    return model, states.slot_bytes(1, 64 + 31)


def seconds(fn, tensor: torch.Tensor) -> float:
    started = time.perf_counter()
    fn(tensor)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    forms = {"int64": int64_checksum, "int32": slot_checksum}
    rows = []
    for name, state in (slot_state("tiny-random"), slot_state(QWEN35_08B)):
        digests = {form: fn(state) for form, fn in forms.items()}  # warm (the lane steps are kept) and checked
        if len(set(digests.values())) != 1:
            raise SystemExit(f"{name}: the two forms disagree: {digests}")
        times = {form: [] for form in forms}
        for _ in range(args.repeats):
            for form, fn in forms.items():
                times[form].append(seconds(fn, state))
        medians = {form: statistics.median(t) for form, t in times.items()}
        rows.append({"model": name, "bytes": state.numel() * state.element_size(), "seconds": medians,
                     "ratio": medians["int64"] / medians["int32"]})
    print(f"slot checksum on this CPU ({torch.get_num_threads()} threads), median of {args.repeats}")
    print(f"{'slot state':<34}{'MB':>8}{'int64 ms':>11}{'int32 ms':>11}{'int64 / int32':>15}")
    for r in rows:
        print(f"{r['model']:<34}{r['bytes'] / 1e6:>8.2f}{r['seconds']['int64'] * 1e3:>11.2f}"
              f"{r['seconds']['int32'] * 1e3:>11.2f}{r['ratio']:>15.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "repeats": args.repeats, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
