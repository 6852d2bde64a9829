"""The host cost of launching the ledger's copy-and-digest kernel, each way it can be launched, side by side.

The ledger on a GPU is host-bound work: hundreds of launches a run, each a Python call. This times, per launch,
``copy_state_lanes`` (a ``StateCopier`` made for the call: its first launch goes through Triton's ``kernel[grid]``),
the engine's ``StateCopier`` (the compiled kernel from its second launch on) with a zeroed buffer of its own and into
rows already zeroed (``out=``: a batch's digest rows), Triton's ``kernel[grid]`` alone with the arguments ready, and
the compiled kernel's own launcher (``compiled[grid](*args)``: what is left once the JIT's binding, specialisation
and cache lookup are skipped), next to a few torch calls for scale. (Session 19 measured the first three rows before
``StateCopier``: ``copy_state_lanes`` with its zeroed buffer 40.7 us, into given rows 29.7.) Each is N launches timed on the
host (``perf_counter``), the device synchronised before and after; the tiny model's pools, so the device keeps up.
Usage: ``python benchmarks/triton_launch_cost.py [--launches N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

from mini_engine.device.cuda import CudaDevice
from mini_engine.engine.storage import StateStorage
from mini_engine.model.builtin import builtin_config
from mini_engine.ops.checksum import state_triton
from mini_engine.ops.checksum.reference import _LANE_OFFSETS, _MIX
from mini_engine.ops.checksum.triton import BLOCK, CHUNK


def per_launch_us(fn, launches: int) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(launches):
        fn()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed / launches * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launches", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5, help="rounds of every variant, interleaved; median kept")
    parser.add_argument("--out", default="benchmarks/triton_launch_cost.json")
    args = parser.parse_args()
    states = StateStorage(builtin_config("tiny-random"), 8, CudaDevice(), running=True)
    conv, rec, pending = states.conv, states.rec, states.pending
    layouts = states._layouts
    out = torch.zeros((2, 2), dtype=torch.int64, device="cuda")
    kernel = state_triton._copy_kernel
    conv_l, rec_l, pend_l = layouts
    chunks = [triton.cdiv(conv_l.row_words, CHUNK), triton.cdiv(rec_l.row_words, CHUNK),
              triton.cdiv(pend_l.row_words, CHUNK)]
    run_words = states.run_rows[0].numel()
    positional = [conv_l.words, rec_l.words, pend_l.words, 2, 1, out, states.run_rows, states.memo.lengths,
                  conv_l.slot_stride, conv_l.row_words, rec_l.slot_stride, rec_l.row_words, pend_l.slot_stride,
                  pend_l.outer_stride, pend_l.row_words, pend_l.outer, *chunks]
    constexprs = {"RUN_WORDS": run_words, "RUN_BLOCK": triton.next_power_of_2(run_words), "MEMO": True,
                  "RECURRENT": True, "MIX": _MIX, "LANE0": _LANE_OFFSETS[0], "LANE1": _LANE_OFFSETS[1], "CHUNK": CHUNK,
                  "BLOCK": BLOCK}
    grid = (chunks[0] + chunks[1],)
    compiled = kernel[grid](*positional, **constexprs)
    bound = dict(zip(kernel.arg_names, positional)) | constexprs
    ordered = [bound[name] for name in kernel.arg_names]
    launcher = compiled[(grid[0], 1, 1)]
    pinned = torch.zeros((2, 2), dtype=torch.int64, pin_memory=True)

    def event():
        torch.cuda.Event().record()

    copier = state_triton.StateCopier(conv=conv, rec=rec, pending=pending, layouts=layouts, run_rows=states.run_rows,
                                      memo=states.memo)
    variants = {
        "copy_state_lanes (a copier a call: kernel[grid])": lambda: state_triton.copy_state_lanes(
            conv=conv, rec=rec, pending=pending, dst=2, src=1, length=64, layouts=layouts, out=out,
            run_rows=states.run_rows, memo=states.memo),
        "StateCopier (zeroed buffer, compiled kernel)": lambda: copier(2, 1, 64),
        "StateCopier(out=) (compiled kernel)": lambda: copier(2, 1, 64, out=out),
        "kernel[grid](...) alone": lambda: kernel[grid](*positional, **constexprs),
        "compiled[grid](*args)": lambda: launcher(*ordered),
        "torch.zeros((2, 2)) on the GPU": lambda: torch.zeros((2, 2), dtype=torch.int64, device="cuda"),
        "tensor.fill_(-1)": lambda: out.fill_(-1),
        "pinned.copy_(device, non_blocking)": lambda: pinned.copy_(out, non_blocking=True),
        "torch.cuda.Event() + record()": event,
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, fn in variants.items():  # warm-up
        per_launch_us(fn, 50)
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(per_launch_us(fn, args.launches))
    rows = [{"variant": name, "us_per_launch": sorted(t)[len(t) // 2], "runs": t} for name, t in times.items()]
    print(f"{torch.cuda.get_device_name()}, triton {triton.__version__}, torch {torch.__version__}: host time a call, "
          f"median of {args.repeats} rounds of {args.launches}")
    for row in rows:
        low, high = min(row["runs"]), max(row["runs"])
        print(f"  {row['variant']:<52}{row['us_per_launch']:>8.2f} us   [{low:.2f}, {high:.2f}]")
    with open(args.out, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, handle,
                  indent=2)


if __name__ == "__main__":
    main()
