"""The host cost of a step's small transfers, each way they can be made, side by side in one process.

A 0.8B run makes some 3,000 uploads (each prefill layer its rows and slots; the decode step its inputs), a pinned
results mirror a batch and, with the ledger on CUDA, a digest block a forward with a restore and one every sixteen
clones. Each took an allocation of its own: pinned host memory through torch's caching host allocator (``upload``'s
``pin_memory()``, ``torch.zeros(pin_memory=True)``) and, for a digest block, zeroed device rows made on its stream.
The alternative timed here cuts them from allocations made once in a while: ``PinnedArena`` below (views of one
pinned allocation, in order, never the same bytes twice; an arena used up is dropped, and torch's allocator recycles
its block once the copies through it have run) and the engine's ``landing.DigestArena``. Each old way against its
arena's, per call (``perf_counter`` over N calls, median of 5 rounds), with the GPU idle and with it busy behind a
long kernel (the engine's case: copies queued, events pending, which the allocator polls on every allocation).

Measured on an H200's host (session 29, ``results/pinned_transfers_h200_pass27.txt``): a digest block 25.0 us of its
own against 5.0 cut from an arena (idle; 25.3 against 9.3 busy), so the engine cuts them (``DigestArena``); but the
caching host allocator is quick (a pinned results mirror 2.4 us, the arena's view 5.4) and an upload is mostly its
copy's launch (39.0 us against the arena's 34.4 idle, 41.4 against 48.9 busy), so the engine's uploads and results
mirrors keep their own allocations and ``PinnedArena`` lives here, as the alternative measured (those numbers were
taken with it in the engine, 4c7bd4e, behind a lock; the bookkeeping is the same). Profiles of sessions 13-15 put
14-22 us on a ``pin_memory()`` call, their overhead included; timed alone it is a small part of an upload.
Usage: ``python benchmarks/pinned_transfers.py [--calls N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mini_engine.device.cuda import CudaDevice
from mini_engine.engine.landing import DigestArena, Landing
from mini_engine.ops.checksum.deferred import DigestRows


class PinnedArena:
    """Views of pinned host memory cut in order from arenas of ``nbytes`` (the alternative measured; module
    docstring): each on a 64-byte boundary, never the same bytes twice."""

    def __init__(self, nbytes: int = 1 << 20) -> None:
        self.nbytes, self._arena, self._used = nbytes, None, nbytes

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = dtype.itemsize
        for size in shape:
            nbytes *= size
        if self._used + nbytes > self.nbytes:
            self._arena, self._used = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True), 0
        start, self._used = self._used, self._used + (nbytes + 63) // 64 * 64
        return self._arena[start: start + nbytes].view(dtype).view(shape)

    def stage(self, host: torch.Tensor) -> torch.Tensor:
        staged = self.empty(tuple(host.shape), host.dtype)
        staged.copy_(host)
        return staged


def per_call_us(fn, calls: int, busy: torch.cuda.Stream | None, rounds: int = 5) -> list[float]:
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        if busy is not None:
            with torch.cuda.stream(busy):
                torch.cuda._sleep(400_000_000)  # ~0.2 s: longer than the round
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - started) / calls * 1e6)
    torch.cuda.synchronize()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/pinned_transfers.json")
    args = parser.parse_args()
    device = CudaDevice()
    stream = device.stream("compute")
    handle = device._handle(stream)
    index = torch.tensor([[3, 17, 29, 41], [130, 131, 170, 2]], dtype=torch.int32)  # a step's slots and lengths
    arena, pinned = DigestArena(device, stream), PinnedArena()

    def own_block() -> DigestRows:  # session 28's digest_block
        return DigestRows(device.zeros((16, 2), dtype=torch.long, stream=stream),
                          torch.zeros((16, 2), dtype=torch.long, pin_memory=True), Landing(device))

    def uploaded(old: bool):
        def call():
            with torch.cuda.stream(handle):
                (index.pin_memory() if old else pinned.stage(index)).to("cuda", non_blocking=True)
        return call

    pairs = [  # (what, the old way, the arena's)
        ("upload of a [2, 4] int32 (pinned copy + non-blocking copy)", uploaded(True), uploaded(False)),
        ("a batch's pinned results mirror [80, 2] int64",
         lambda: torch.zeros((80, 2), dtype=torch.long, pin_memory=True), lambda: pinned.empty((80, 2), torch.long)),
        ("a digest block of 16 rows (device rows + host mirror)", own_block, lambda: arena.block(16)),
    ]
    rows = []
    for busy in (None, torch.cuda.Stream()):
        for what, old, new in pairs:
            for way, fn in (("own allocation", old), ("arena", new)):
                per_call_us(fn, 100, busy, rounds=1)  # warm: first allocations, the arena's first cut
                samples = per_call_us(fn, args.calls, busy)
                rows.append({"what": what, "way": way, "gpu": "busy" if busy is not None else "idle",
                             "us": statistics.median(samples), "min": min(samples), "max": max(samples)})
    print(f"{torch.cuda.get_device_name()}, host us a call, median of 5 rounds of {args.calls} [lowest, highest]")
    print(f"{'transfer':<58}{'gpu':>5}{'own allocation':>22}{'arena':>22}{'ratio':>7}")
    for i in range(0, len(rows), 2):
        old, new = rows[i], rows[i + 1]
        print(f"{old['what']:<58}{old['gpu']:>5}"
              + "".join(f"{r['us']:>8.2f} [{r['min']:.2f}, {r['max']:.2f}]" for r in (old, new))
              + f"{old['us'] / new['us']:>7.1f}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "calls": args.calls, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
