"""Triton compiles per workload on a GPU: once the first workload has run, a new one should compile nothing.

Triton compiles a kernel once per combination of its constexprs and of what it specialises: an int
argument's being 1 or a multiple of 16, a pointer's 16-byte alignment. A value that follows the batch
(a token count, a table's width, a table's offset) makes new batch layouts compile mid-run, seconds
each. This runs ``engine_throughput.py``'s hit-heavy workload under ``--seeds`` different seeds (other
prompts, other batch layouts), with and without the ledger, on one model, and prints the variants
each run added per kernel, and its time. CUDA only (the interpreter compiles nothing).

Usage: ``python benchmarks/triton_compiles.py [--seeds 3] [--shape 0.8b|tiny] [--dtype bfloat16|float32]
[--out FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import warnings

import torch
from engine_throughput import LEDGER, MODES, _serve, workload
from triton.runtime.jit import JITFunction

from mini_engine.engine import Engine, EngineConfig
from mini_engine.model import build_builtin
from mini_engine.model.builtin import QWEN35_08B


def compiled() -> dict[str, int]:
    """Compiled variants per Triton kernel in this process (module.kernel -> count)."""
    counts = {}
    with warnings.catch_warnings():  # isinstance on every live object touches deprecated torch aliases
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, JITFunction)]
    for obj in objects:
        n = sum(len(cache[0]) for cache in obj.device_caches.values())
        if n:
            counts[f"{obj.fn.__module__.removeprefix('mini_engine.ops.')}.{obj.fn.__name__}"] = n
    return counts


def run(model, mode: str, seed: int, dtype: str) -> float:
    options = dict(MODES[mode])
    ledger = options.pop(LEDGER, False)
    engine = Engine(EngineConfig(**options, device="cuda", dtype=dtype, num_pages=48 * 15 + 64, max_running=16,
                                 num_slots=64), model=model, sink=(lambda row: None) if ledger else None)
    started = time.perf_counter()
    _serve(engine, workload(seed=seed), max_tokens=64)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--shape", choices=("0.8b", "tiny"), default="0.8b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", default="benchmarks/triton_compiles.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (the interpreter compiles nothing)")
    model = build_builtin(QWEN35_08B if args.shape == "0.8b" else "tiny-random").cuda()
    model = model.cast_projections(getattr(torch, args.dtype))
    rows, before = [], compiled()
    for seed in range(args.seeds):
        for mode in ("copy, overlap", "copy, overlap, ledger"):
            seconds = run(model, mode, seed, args.dtype)
            now = compiled()
            new = {k: n - before.get(k, 0) for k, n in now.items() if n != before.get(k, 0)}
            before = now
            rows.append({"seed": seed, "mode": mode, "seconds": seconds, "new_variants": new})
            print(f"seed {seed}, {mode}: {seconds:.2f} s, {sum(new.values())} new variants "
                  f"{dict(sorted(new.items()))}", flush=True)
    with open(args.out, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "shape": args.shape, "dtype": args.dtype,
                   "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
