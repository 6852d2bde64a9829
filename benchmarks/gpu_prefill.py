"""Prefill on one GPU: the engine's prompt throughput with the Triton kernels against the references.

``EngineConfig.prefill_kernels`` picks how ``HybridModel.forward`` runs the causal conv, the chunked gated
delta rule, attention and the projections (``mini_engine.model.kernels``). The variants: ``reference``,
``triton``, and ``triton-tiled-gemm`` (the Triton sequence ops with the reference projections, cuBLAS in
64-row tiles: what ``triton`` was before its one-launch gemm). Two measurements per variant, side by side
in one process, on the Qwen3.5-0.8B-shaped model of ``gpu_engine.py`` with bfloat16 projections:

- ``forward``: one ``HybridModel.forward`` over a batch of fresh prompts, synchronised: the model alone.
- ``engine``: the engine serving the same prompts with one new token each (time to first token of the
  batch), in ``--chunks`` tokens per prefill forward (``EngineConfig.prefill_chunk``).

Each row is the median of ``--repeats`` timed runs after one warm-up (kernel compiles), with the spread
(max/min - 1); prompt tokens/s, and each Triton row against the reference row of the same shape.
``--device sim --shape tiny`` runs the same on the CPU (the Triton rows under ``TRITON_INTERPRET=1``, slow:
a smoke test of the script, not a measurement). Prints a table, writes JSON.

Usage: ``python benchmarks/gpu_prefill.py [--shapes 1x2048 8x512] [--chunks 128 1024] [--repeats 3]
[--device cuda|sim] [--shape 0.8b|tiny] [--dtype bfloat16|float32] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

import torch
from gpu_engine import (
    prompts,  # a sibling script: benchmarks/ is on sys.path when run as a script
)

from mini_engine.engine import Engine, EngineConfig, SamplingParams
from mini_engine.model import HybridModel, build_builtin
from mini_engine.model import kernels as model_kernels
from mini_engine.model.builtin import QWEN35_08B
from mini_engine.ops.linear import linear as reference_linear

VARIANTS = {"reference": "reference", "triton": "triton", "triton-tiled-gemm": "triton"}  # -> prefill_kernels


@contextmanager
def variant(name: str):
    """``triton-tiled-gemm``: the forward's projections through the reference while inside."""
    saved = model_kernels.linear
    if name == "triton-tiled-gemm":
        model_kernels.linear = lambda kernels, x, weight: reference_linear(x, weight)
    try:
        yield VARIANTS[name]
    finally:
        model_kernels.linear = saved


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def forward_seconds(model: HybridModel, batch: int, length: int, kernels: str, device: str) -> float:
    tokens = [torch.tensor(p) for p in prompts(batch, length)]
    states = [model.new_state() for _ in tokens]
    _sync(device)
    started = time.perf_counter()
    model(tokens, states, kernels=kernels)
    _sync(device)
    return time.perf_counter() - started


def engine_seconds(model: HybridModel, batch: int, length: int, kernels: str, chunk: int, args) -> float:
    config = EngineConfig(device=args.device, dtype=args.dtype, prefill_kernels=kernels, prefill_chunk=chunk,
                          max_running=batch, num_slots=3 * batch + 8, num_pages=batch * (-(-(length + 8) // 16)) + 64,
                          max_context=length + 64, threads=None)
    engine = Engine(config, model=model)
    _sync(args.device)
    started = time.perf_counter()
    ids = [engine.submit(p, SamplingParams(max_tokens=1)) for p in prompts(batch, length)]
    engine.run()
    _sync(args.device)
    elapsed = time.perf_counter() - started
    assert all(len(engine.result(r).output_ids) == 1 for r in ids)
    return elapsed


def timed(run, name: str, repeats: int) -> dict:
    with variant(name):
        run()  # warm-up: compiles
        seconds = [run() for _ in range(repeats)]
    return {"seconds": statistics.median(seconds), "spread": max(seconds) / min(seconds) - 1, "runs": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1x2048", "8x512"], help="BATCHxPROMPT_TOKENS")
    parser.add_argument("--chunks", type=int, nargs="+", default=[128, 1024], help="engine prefill_chunk values")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    parser.add_argument("--shape", choices=("0.8b", "tiny"), default="0.8b")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--kernels", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--profile", default=None, help="write torch.profiler's tables of one forward per shape "
                                                           "and variant here (after the timings)")
    parser.add_argument("--out", default="benchmarks/gpu_prefill.json")
    args = parser.parse_args()
    try:
        shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes]
    except ValueError:
        parser.error(f"--shapes takes BATCHxTOKENS values such as 8x512; got {args.shapes}")
    model = build_builtin(QWEN35_08B if args.shape == "0.8b" else "tiny-random")
    model = model.to("cuda" if args.device == "cuda" else "cpu").cast_projections(getattr(torch, args.dtype))
    rows = []
    for batch, length in shapes:
        for name in args.kernels:
            kernels = VARIANTS[name]
            rows.append({"what": "forward", "batch": batch, "tokens": length, "kernels": name, "chunk": None,
                         **timed(lambda: forward_seconds(model, batch, length, kernels, args.device), name,
                                 args.repeats)})
            for chunk in args.chunks:
                rows.append({"what": "engine", "batch": batch, "tokens": length, "kernels": name, "chunk": chunk,
                             **timed(lambda: engine_seconds(model, batch, length, kernels, chunk, args), name,
                                     args.repeats)})
            print(f"  {batch}x{length} {name}: done", flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (sim)"
    print(f"{device}; {model.config.name}; {args.dtype} projections; median of {args.repeats} after a warm-up")
    print(f"{'what':<9}{'batch x tokens':>15}{'chunk':>7}{'kernels':>19}{'seconds':>10}{'prompt tok/s':>14}"
          f"{'spread':>8}{'vs reference':>14}")
    for r in rows:
        base = next((b for b in rows if b["kernels"] == "reference" and
                     (b["what"], b["batch"], b["tokens"], b["chunk"]) == (r["what"], r["batch"], r["tokens"], r["chunk"])),
                    None)
        r["speedup"] = None if base is None else base["seconds"] / r["seconds"]
        chunk = "-" if r["chunk"] is None else r["chunk"]
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        print(f"{r['what']:<9}{r['batch']:>8} x {r['tokens']:<4}{chunk:>7}{r['kernels']:>19}{r['seconds']:>10.4f}"
              f"{r['batch'] * r['tokens'] / r['seconds']:>14.0f}{r['spread']:>8.1%}{speedup:>14}")
    with open(args.out, "w") as handle:
        json.dump({"device": device, "model": model.config.name, "dtype": args.dtype, "repeats": args.repeats,
                   "rows": rows}, handle, indent=2)
    if args.profile:
        profile(model, shapes, args)


def profile(model: HybridModel, shapes: list[tuple[int, int]], args) -> None:
    """torch.profiler's tables (by self CPU and by self device time) of one forward per shape and variant."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with open(args.profile, "w") as f:
        for batch, length in shapes:
            for name in args.kernels:
                with variant(name) as kernels, torch_profile(activities=activities) as prof:
                    seconds = forward_seconds(model, batch, length, kernels, args.device)
                averages = prof.key_averages()
                f.write(f"== forward {batch}x{length}, {name}: {seconds:.4f} s under the profiler\n")
                f.write(averages.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
                if args.device == "cuda":
                    f.write(averages.table(sort_by="self_cuda_time_total", row_limit=25) + "\n")


if __name__ == "__main__":
    main()
