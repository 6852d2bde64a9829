"""Host launches of one model forward or one decode step: Triton kernel launches and computing aten ops, counted
(not timed).

On a GPU a prefill forward is host-bound once its kernels are fast: its time is the host's dispatch of
every launch. A CUDA-graphed decode step replays its launches without the host, but each still costs
the device a few microseconds at batch 1, where its kernels are tiny. This counts them on the CPU,
where the count is the same as on a GPU: the Triton kernels
run in the interpreter (``TRITON_INTERPRET=1``, set here), each launch counted once and its insides
left out, and torch.profiler lists the top-level aten ops, of which the ones that compute (not views,
not allocations, not dtype or device no-ops) are each a dispatch, and a device launch unless they work
on host tensors (offsets, positions: a few per layer). Counts are
deterministic: no repeats, no spread.

``--step forward`` counts ``HybridModel.forward`` on prompts of ``--lengths``; ``--step decode`` counts one
``model.decode.decode_step`` of ``--batch`` sequences on the engine's pools (what a decode graph replays).

``--step prefill-op`` counts what the engine's device op for a batch of prefill chunks launches
(``ModelRunner._forward_model``): each item's state read from its slot and its prefix's KV from its pages, the
forward, and the results written back (slots, pages, the track snapshot, the sampled token); items of
``--lengths`` new tokens after prefixes of ``--prefix`` tokens (64-multiples), ``--kernels`` the prefill's.

``--shape 0.8b`` (decode and prefill-op) counts ``gpu_engine.py``'s Qwen3.5-0.8B-shaped model.

Usage: ``python benchmarks/forward_launches.py [--step forward|decode|prefill-op] [--lengths 200 30 30 30]
[--prefix 0 64 128 0] [--batch 4] [--gdn split fused] [--shape tiny|0.8b] [--kernels triton reference]
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


from mini_engine.constants import GDN_STEPS  # noqa: E402
from mini_engine.model import build_builtin  # noqa: E402
from mini_engine.model.builtin import QWEN35_08B  # noqa: E402

# aten ops that launch nothing on a device: views, allocations, conversions that are no-ops here
NOT_LAUNCHES = frozenset(
    "aten::" + name for name in (
        "view", "reshape", "slice", "select", "split", "split_with_sizes", "t", "transpose", "as_strided", "unsqueeze",
        "squeeze", "unflatten", "chunk", "detach", "detach_", "alias", "expand", "unbind", "lift_fresh", "empty",
        "empty_like", "new_empty", "empty_strided", "to", "_to_copy", "contiguous", "resolve_conj", "resolve_neg",
        "item", "is_nonzero", "_local_scalar_dense", "numpy_T", "permute"))


def census(setup, run) -> dict:
    """Triton launches and computing aten ops of ``run(setup())``: run once to warm (it compiles nothing but fills
    caches), then counted on fresh inputs; ``setup`` is not counted."""
    launches: collections.Counter = collections.Counter()
    interpret = InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        with record_function("triton-kernel"):  # its insides are the interpreter's, not the step's
            return interpret(self, *args, **kwargs)

    InterpretedFunction.run = counted
    try:
        run(setup())
        launches.clear()
        inputs = setup()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run(inputs)
    finally:
        InterpretedFunction.run = interpret
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
    return {"triton": sum(launches.values()), "aten": sum(computing.values()),
            "launches": sum(launches.values()) + sum(computing.values()), "triton_by_kernel": dict(launches),
            "aten_by_op": dict(sorted(computing.items(), key=lambda kv: -kv[1]))}


def count(model, prompts: list[torch.Tensor], kernels: str, snapshots: str) -> dict:
    """One forward of ``prompts`` from empty states."""
    extra = {} if snapshots == "all" else {"snapshots": snapshots}  # (the default; older trees lack the option)
    return {"kernels": kernels, **census(lambda: [model.new_state() for _ in prompts],
                                         lambda states: model(prompts, states, kernels=kernels, **extra))}


def count_decode(model, batch: int, gdn: str = "split") -> dict:
    """One decode step of ``batch`` sequences at position 0 of fresh slots, on the pools an engine keeps (the
    launches do not depend on what the slots hold)."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.storage import KVStorage, StateStorage
    from mini_engine.model.decode import DecodeModel, Pools, decode_step

    page_size, pages = 16, 4
    fused, device = DecodeModel(model, gdn=gdn), SimDevice()
    slots = list(range(1, batch + 1))
    table = torch.arange(batch * pages, dtype=torch.int32).reshape(batch, pages) + 1

    def setup() -> Pools:
        states = StateStorage(model.config, batch + 1, device, running=True)
        kv = KVStorage(model.config, batch * pages + 1, page_size, device)
        return Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows)

    tokens = torch.zeros(batch, dtype=torch.long)
    return {"kernels": f"decode step, gdn={gdn}",
            **census(setup, lambda pools: decode_step(fused, pools, tokens, slots, [0] * batch, table))}


def count_prefill_op(model, prefixes: list[int], lengths: list[int], kernels: str) -> dict:
    """One prefill op of the engine's runner: item i feeds ``lengths[i]`` tokens after ``prefixes[i]`` cached ones
    (its state in live slot i + 1, its pages its own), samples after its last token and writes its track snapshot
    when it ends past a 64-boundary. The slots and pages hold zeros: the launches do not depend on them."""
    from mini_engine.device.base import Event
    from mini_engine.engine import Engine, EngineConfig
    from mini_engine.engine.request import Commit, Request, SamplingParams
    from mini_engine.engine.runner import Batch, BatchItem

    config = EngineConfig(device="sim", prefill_kernels=kernels, decode_kernels="reference", page_size=16)
    engine = Engine(config, model=model)
    gen = torch.Generator().manual_seed(0)
    items, first_page = [], 1
    for i, (start, n) in enumerate(zip(prefixes, lengths)):
        end = start + n
        pages = tuple(range(first_page, first_page + -(-end // config.page_size)))
        first_page += len(pages)
        prompt = torch.randint(0, model.config.vocab_size, (end,), generator=gen)
        track = Commit(end // 64 * 64, len(lengths) + 1 + i) if end // 64 > start // 64 else None
        items.append(BatchItem(Request(f"r{i}", prompt.tolist(), SamplingParams()), start, n, prompt[start:],
                               i + 1, pages, True, track))

    def setup() -> Batch:
        results = [torch.zeros(len(items), 2, dtype=torch.long) for _ in range(2)]
        return Batch(0, items, *results, Event(0))

    indices = list(range(len(items)))
    return {"kernels": kernels, **census(setup, lambda batch: engine.runner._forward_model(
        batch, indices, {i: list(it.pages) for i, it in enumerate(items)}))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=("forward", "decode", "prefill-op"), default="forward")
    parser.add_argument("--lengths", type=int, nargs="+", default=[200, 30, 30, 30], help="prompt tokens per sequence")
    parser.add_argument("--prefix", type=int, nargs="+", default=None,
                        help="--step prefill-op: cached tokens before each sequence's new ones (64-multiples; "
                             "default 0)")
    parser.add_argument("--batch", type=int, default=4, help="--step decode: sequences in the step")
    parser.add_argument("--shape", choices=("tiny", "0.8b"), default="tiny",
                        help="--step decode or prefill-op: the built-in tiny model or the 0.8B shape of gpu_engine.py")
    parser.add_argument("--gdn", nargs="+", choices=GDN_STEPS, default=["split"],
                        help="--step decode: the GDN layers in three launches or one (DecodeModel(gdn=...))")
    parser.add_argument("--kernels", nargs="+", choices=("triton", "reference"), default=["triton", "reference"])
    parser.add_argument("--snapshots", choices=("all", "last"), default="last")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.shape == "0.8b" and args.step == "forward":
        parser.error("--shape 0.8b: with --step decode or prefill-op (short items: a long forward of it takes the "
                     "interpreter too long)")
    model = build_builtin() if args.shape == "tiny" else build_builtin(QWEN35_08B)
    prefixes = args.prefix or [0] * len(args.lengths)
    if len(prefixes) != len(args.lengths) or any(p % 64 or p < 0 for p in prefixes):
        parser.error(f"--prefix: one non-negative 64-multiple per --lengths entry; got {prefixes}")
    if args.step == "decode":
        rows = [count_decode(model, args.batch, gdn) for gdn in args.gdn]
        what = f"one decode step of {args.batch} sequences"
    elif args.step == "prefill-op":
        rows = [count_prefill_op(model, prefixes, args.lengths, kernels) for kernels in args.kernels]
        what = f"the engine's prefill op: {args.lengths} new tokens after prefixes of {prefixes}"
    else:
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen) for n in args.lengths]
        rows = [count(model, prompts, kernels, args.snapshots) for kernels in args.kernels]
        what = f"one forward of {len(prompts)} sequences {args.lengths}, snapshots={args.snapshots}"
    print(f"{model.config.name} ({len(model.model.layers)} layers), {what}")
    print(f"{'kernels':<24}{'Triton':>8}{'aten':>8}{'launches':>10}   most frequent")
    for r in rows:
        top = sorted([*r["triton_by_kernel"].items(), *((name[6:], n) for name, n in r["aten_by_op"].items())],
                     key=lambda kv: -kv[1])[:6]
        print(f"{r['kernels']:<24}{r['triton']:>8}{r['aten']:>8}{r['launches']:>10}   "
              + ", ".join(f"{name} {n}" for name, n in top))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"model": model.config.name, "layers": len(model.model.layers), "step": args.step,
                       "lengths": args.lengths, "prefix": prefixes, "batch": args.batch, "snapshots": args.snapshots,
                       "rows": rows},
                      handle, indent=2)


if __name__ == "__main__":
    main()
