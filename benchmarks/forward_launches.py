"""Host launches of one model forward: Triton kernel launches and computing aten ops, counted (not timed).

On a GPU a prefill forward is host-bound once its kernels are fast: its time is the host's dispatch of
every launch. This counts them on the CPU, where the count is the same as on a GPU: the Triton kernels
run in the interpreter (``TRITON_INTERPRET=1``, set here), each launch counted once and its insides
left out, and torch.profiler lists the top-level aten ops, of which the ones that compute (not views,
not allocations, not dtype or device no-ops) are each a dispatch, and a device launch unless they work
on host tensors (offsets, positions: a few per layer). Counts are
deterministic: no repeats, no spread.

Usage: ``python benchmarks/forward_launches.py [--lengths 200 30 30 30] [--kernels triton reference]
[--snapshots all|last] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from mini_engine.model import build_builtin  # noqa: E402

# aten ops that launch nothing on a device: views, allocations, conversions that are no-ops here
NOT_LAUNCHES = frozenset(
    "aten::" + name for name in (
        "view", "reshape", "slice", "select", "split", "split_with_sizes", "t", "transpose", "as_strided", "unsqueeze",
        "squeeze", "chunk", "detach", "detach_", "alias", "expand", "unbind", "lift_fresh", "empty", "empty_like",
        "new_empty", "empty_strided", "to", "_to_copy", "contiguous", "resolve_conj", "resolve_neg", "item",
        "is_nonzero", "_local_scalar_dense", "numpy_T", "permute"))


def count(model, prompts: list[torch.Tensor], kernels: str, snapshots: str) -> dict:
    launches: collections.Counter = collections.Counter()
    run = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        with record_function("triton-kernel"):  # its insides are the interpreter's, not the forward's
            return run(self, *args, **kwargs)

    extra = {} if snapshots == "all" else {"snapshots": snapshots}  # (the default; older trees lack the option)
    InterpretedFunction.run = counted
    try:
        model(prompts, [model.new_state() for _ in prompts], kernels=kernels, **extra)  # warm: compiles nothing,
        launches.clear()                                                                  # but fills caches
        states = [model.new_state() for _ in prompts]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(prompts, states, kernels=kernels, **extra)
    finally:
        InterpretedFunction.run = run
    aten: collections.Counter = collections.Counter()

    def walk(event) -> None:
        if event.name == "triton-kernel":
            return
        if event.name.startswith("aten::"):
            aten[event.name] += 1  # a top-level op: what it calls inside is its own business
            return
        for child in event.cpu_children:
            walk(child)

    for event in prof.events():
        if event.cpu_parent is None:
            walk(event)
    computing = {name: n for name, n in aten.items() if name not in NOT_LAUNCHES}
    return {"kernels": kernels, "triton": sum(launches.values()), "aten": sum(computing.values()),
            "launches": sum(launches.values()) + sum(computing.values()), "triton_by_kernel": dict(launches),
            "aten_by_op": dict(sorted(computing.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 30, 30, 30], help="prompt tokens per sequence")
    parser.add_argument("--kernels", nargs="+", choices=("triton", "reference"), default=["triton", "reference"])
    parser.add_argument("--snapshots", choices=("all", "last"), default="last")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = build_builtin()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in args.lengths]
    rows = [count(model, prompts, kernels, args.snapshots) for kernels in args.kernels]
    print(f"{model.config.name} ({len(model.model.layers)} layers), one forward of {len(prompts)} sequences "
          f"{args.lengths}, snapshots={args.snapshots}")
    print(f"{'kernels':<11}{'Triton':>8}{'aten':>8}{'launches':>10}   most frequent aten ops")
    for r in rows:
        top = ", ".join(f"{name[6:]} {n}" for name, n in list(r["aten_by_op"].items())[:5])
        print(f"{r['kernels']:<11}{r['triton']:>8}{r['aten']:>8}{r['launches']:>10}   {top}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"model": model.config.name, "lengths": args.lengths, "snapshots": args.snapshots,
                       "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
