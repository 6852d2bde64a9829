"""Cost of exactness on CPU: the tiny model with batch-invariant tiled linears vs plain torch matmuls.

Both variants run side by side in one process (this machine is noisy: read the ratios). Prints a
table and writes JSON. Usage: ``python benchmarks/model_speed.py [--threads N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from contextlib import contextmanager

import torch

from mini_engine.model import build_builtin
from mini_engine.ops import invariant


@contextmanager
def plain_linear():
    """Swap the tiled linear for one plain matmul (NOT batch-invariant: for comparison only)."""
    tiled = invariant.linear
    invariant.linear = lambda x, w: x @ w.t()
    try:
        yield
    finally:
        invariant.linear = tiled


def timed(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def workloads(model):
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1024,), generator=gen)
    decode_states = [model([torch.randint(0, 256, (100 + 7 * i,), generator=gen)], [model.new_state()])[0].state
                     for i in range(8)]
    return {
        "prefill 1024 tokens": (lambda: model([prompt], [model.new_state()]), 1024),
        "decode step, batch 1": (lambda: model([torch.tensor([5])], decode_states[:1]), 1),
        "decode step, batch 8": (lambda: model([torch.tensor([5])] * 8, decode_states), 8),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/model_speed.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = build_builtin()
    rows = []
    for name, (fn, tokens) in workloads(model).items():
        exact = timed(fn, args.repeats)
        with plain_linear():
            plain = timed(fn, args.repeats)
        rows.append({"workload": name, "exact_s": exact, "plain_s": plain, "exact_over_plain": exact / plain,
                     "exact_tokens_per_s": tokens / exact})
    print(f"tiny-random, {args.threads} thread(s), torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print(f"{'workload':<24}{'exact':>10}{'plain':>10}{'ratio':>8}{'tok/s (exact)':>15}")
    for r in rows:
        print(f"{r['workload']:<24}{r['exact_s'] * 1e3:>8.1f}ms{r['plain_s'] * 1e3:>8.1f}ms"
              f"{r['exact_over_plain']:>8.2f}{r['exact_tokens_per_s']:>15.0f}")
    with open(args.out, "w") as handle:
        json.dump({"threads": args.threads, "torch": torch.__version__, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
