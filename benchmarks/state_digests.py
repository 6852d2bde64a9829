"""The ledger's decode-step state digests, tracked (the memo) against read back whole, in one process.

A decode step's ledger digests the state each live slot was left with. Read back, that is every byte of
the slot every step (conv, a 64-token chunk's rec, up to 63 pending rows); tracked (``EngineConfig.
state_digests="tracked"``, ``mini_engine.ops.checksum.memo``), conv and the step's new row, rec once a chunk.
Here a batch of slots of a model's shape goes through ``--steps`` simulated decode steps (conv rewritten, a row
appended, rec rewritten when a token completes its chunk; the slots' lengths staggered over the chunk) and
each step's digests are taken both ways from the same bytes, checked equal, and timed: on the sim the host
computation (``StateStorage.checksums`` against ``step_checksums``), on cuda the device time of the launches
(CUDA events). Interleaved repeats; the median of each; prints a table and writes JSON.

Usage: ``python benchmarks/state_digests.py [--device sim|cuda] [--batch B] [--steps N] [--repeats R] [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mini_engine.constants import SNAPSHOT_ALIGN
from mini_engine.device import make_device
from mini_engine.engine.storage import StateStorage
from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.ops.checksum.deferred import DeviceDigest


class Slots:
    """A batch of live slots of one model's shape, advanced by simulated decode steps."""

    def __init__(self, model: str, batch: int, device: str, seed: int = 0) -> None:
        self.states = StateStorage(builtin_config(model), batch, make_device(device), tracked=True)
        torch.manual_seed(seed)
        for pool in (self.states.conv, self.states.rec, self.states.pending):
            pool.normal_()
        self.slots = list(range(1, batch + 1))
        # staggered over a chunk, so that a step's batch holds few rows and many alike
        self.lengths = [SNAPSHOT_ALIGN + (i * 37) % SNAPSHOT_ALIGN for i in range(batch)]

    def step(self) -> None:
        """Each slot's writes by a decode step: conv, then its row or (completing its chunk) rec."""
        states = self.states
        for i, slot in enumerate(self.slots):
            n = self.lengths[i]
            states.conv[slot].normal_()
            if n % SNAPSHOT_ALIGN == SNAPSHOT_ALIGN - 1:
                states.rec[slot].normal_()
            else:
                states.pending[slot, :, n % SNAPSHOT_ALIGN].normal_()
            self.lengths[i] = n + 1

    def digests(self, mode: str) -> tuple[list[int], float]:
        """(the step's digests, the seconds they took: the host's on the sim, the device's on cuda)."""
        take = self.states.checksums if mode == "readback" else self.states.step_checksums
        if not self.states.conv.is_cuda:
            started = time.perf_counter()
            got = take(self.slots, self.lengths)
            return got, time.perf_counter() - started
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        got = take(self.slots, self.lengths)
        end.record()
        end.synchronize()
        return DeviceDigest.resolve_all(got), start.elapsed_time(end) / 1e3


def measure(model: str, args) -> dict:
    slots = Slots(model, args.batch, args.device)
    slots.digests("tracked")  # the memo's first digests read whole states; compiles on cuda
    slots.digests("readback")
    times: dict[str, list[float]] = {"readback": [], "tracked": []}
    for _ in range(args.repeats):
        total = dict.fromkeys(times, 0.0)
        for _ in range(args.steps):
            slots.step()
            got = {}
            for mode in times:
                got[mode], seconds = slots.digests(mode)
                total[mode] += seconds
            if got["readback"] != got["tracked"]:
                raise SystemExit(f"{model}: the tracked digests differ from the read-back ones at {slots.lengths}")
        for mode in times:
            times[mode].append(total[mode] / args.steps)
    states = slots.states
    row_bytes = states.pending[0, :, 0].nbytes
    return {"model": model, "state_mb": states.nbytes(SNAPSHOT_ALIGN + 31) / 1e6, "row_kb": row_bytes / 1e3,
            "seconds_per_step": {mode: statistics.median(t) for mode, t in times.items()},
            "ratio": statistics.median(r / t for r, t in zip(times["readback"], times["tracked"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("sim", "cuda"), default="sim")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=64, help="decode steps a repeat (64: a chunk of each slot)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny-random", QWEN35_08B])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [measure(model, args) for model in args.models]
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"the sim ({torch.get_num_threads()} threads)"
    print(f"a decode step's state digests, {args.batch} slots, {args.steps} steps a repeat, median of "
          f"{args.repeats}, on {where}; digests checked equal every step")
    print(f"{'model':<34}{'state MB':>10}{'read back ms':>14}{'tracked ms':>12}{'read back / tracked':>21}")
    for r in rows:
        t = r["seconds_per_step"]
        print(f"{r['model']:<34}{r['state_mb']:>10.2f}{t['readback'] * 1e3:>14.3f}{t['tracked'] * 1e3:>12.3f}"
              f"{r['ratio']:>21.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": where, "batch": args.batch, "steps": args.steps, "repeats": args.repeats,
                       "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
