"""A decode step's host page table: the runner's numpy fill against the torch fill it replaced, per batch size.

Every engine step builds the page table of its decode items on the host (``ModelRunner._decode_table``: row r the
pages of the r-th decode item, zero-padded to the table's width) before the resident metadata compares it with what
the device holds. It filled a row with a tensor made from the item's page list and a torch slice assignment, a few
microseconds each: at batch 32 the largest part of the step's host time in an H100 host's cProfile (session 31,
``results/decode_anatomy_host_profile_h100_pass28.txt``). It now fills a numpy array and wraps it. Both are timed
here side by side in one process on items of ``--context`` tokens (16-token pages) in a table as wide as
``--max-context`` allows, median of ``--repeats`` rounds of ``--calls`` calls; each checks the other's table first.
Then both inside a decoding engine's own steps (``--engine-batch``; the sim device), where the model's work between
steps leaves the fill colder caches. Prints a table, writes JSON. Host only: no device.

Usage: ``python benchmarks/decode_table.py [--batches 1 8 32 64] [--context 600] [--max-context 4096]
[--engine-batch 32] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from types import SimpleNamespace

import torch

from mini_engine.engine.runner import ModelRunner

PAGE = 16


def torch_fill(table_shape: tuple[int, int], items) -> torch.Tensor:
    """The fill before session 31: a tensor and a slice assignment a row."""
    table = torch.zeros(table_shape, dtype=torch.int32)
    for row, it in enumerate(i for i in items if i.tokens is None):
        table[row, : len(it.pages)] = torch.tensor(it.pages, dtype=torch.int32)
    return table


def microseconds(fill, calls: int, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fill()
        times.append((time.perf_counter() - started) * 1e6 / calls)
    return statistics.median(times), max(times) / min(times) - 1


def in_engine(batch: int, rounds: int, steps: int) -> dict:
    """Both fills inside a decoding engine's steps (the sim device, tiny-random, ``batch`` sequences of 64-token
    prompts): the runner's fill swapped for each in turn, ``steps`` steps a round, ``rounds`` rounds each, alternating;
    us a call, median of the rounds. Between fills the host runs the sim's model on the same core, so the fills meet
    colder caches than in the loop above: what a step pays."""
    from gpu_engine import prompts  # a sibling script: benchmarks/ is on sys.path

    from mini_engine.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(device="sim", model="tiny-random", max_running=batch, num_slots=3 * batch + 8,
                                 num_pages=batch * 48 + 64, max_context=64 + 2 * rounds * steps + 96, overlap=True))
    ids = [engine.submit(p, SamplingParams(max_tokens=2 * rounds * steps + 16)) for p in prompts(batch, 64)]
    while min(engine.poll(r)[0] for r in ids) < 4:
        engine.step()
    runner, ours = engine.runner, engine.runner._decode_table
    fills = {"numpy_us": ours, "torch_us": lambda items: torch_fill(runner.metadata.table_shape, items)}
    times: dict[str, list[float]] = {name: [] for name in fills}
    for _ in range(rounds):
        for name, fill in fills.items():
            spent = []

            def timed(items, fill=fill, spent=spent):
                started = time.perf_counter()
                table = fill(items)
                spent.append(time.perf_counter() - started)
                return table

            runner._decode_table = timed
            for _ in range(steps):
                engine.step()
            times[name].append(statistics.median(spent) * 1e6)
    runner._decode_table = ours
    out = {name: statistics.median(values) for name, values in times.items()}
    return {"batch": batch, **out, "speedup": out["torch_us"] / out["numpy_us"], "rounds": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=600, help="tokens of each decoding sequence (about)")
    parser.add_argument("--max-context", type=int, default=4096, help="the engine's max_context: the table's width")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine-batch", type=int, default=32, help="the in-engine comparison's batch (0: none)")
    parser.add_argument("--out", default="benchmarks/decode_table.json")
    args = parser.parse_args()
    rnd = random.Random(0)
    width = -(-args.max_context // PAGE)
    rows = []
    for batch in args.batches:
        items = [SimpleNamespace(tokens=None, pages=[rnd.randrange(100_000) for _ in range(
            min(width, -(-rnd.randint(args.context // 2, args.context * 3 // 2) // PAGE)))]) for _ in range(batch)]
        runner = SimpleNamespace(metadata=SimpleNamespace(table_shape=(batch, width)))
        ours = functools.partial(ModelRunner._decode_table, runner, items)  # the runner's own method, unbound
        before = functools.partial(torch_fill, (batch, width), items)
        if not torch.equal(ours(), before()):
            raise SystemExit(f"decode_table.py: the two fills disagree at batch {batch}")
        (numpy_us, numpy_spread), (torch_us, torch_spread) = (microseconds(f, args.calls, args.repeats)
                                                              for f in (ours, before))
        rows.append({"batch": batch, "width": width, "numpy_us": numpy_us, "numpy_spread": numpy_spread,
                     "torch_us": torch_us, "torch_spread": torch_spread, "speedup": torch_us / numpy_us})
    print(f"host us a step's page table, {args.context} tokens a sequence (about), {width} pages wide; median of "
          f"{args.repeats} x {args.calls}")
    print(f"{'batch':>5}{'numpy (now)':>13}{'spread':>8}{'torch (before)':>16}{'spread':>8}{'before / now':>14}")
    for r in rows:
        print(f"{r['batch']:>5}{r['numpy_us']:>13.1f}{r['numpy_spread']:>8.1%}{r['torch_us']:>16.1f}"
              f"{r['torch_spread']:>8.1%}{r['speedup']:>13.1f}x")
    engine = in_engine(args.engine_batch, rounds=3, steps=10) if args.engine_batch else None
    if engine:
        print(f"inside an engine's steps (sim, tiny-random, batch {engine['batch']}): numpy {engine['numpy_us']:.1f} "
              f"us, torch {engine['torch_us']:.1f} us a step, {engine['speedup']:.1f}x")
    with open(args.out, "w") as f:
        json.dump({"context": args.context, "max_context": args.max_context, "calls": args.calls,
                   "repeats": args.repeats, "rows": rows, "in_engine": engine}, f, indent=2)


if __name__ == "__main__":
    main()
