"""The decode step's projections at batch 1, per weight shape of the 0.8B model: what each gemm streams.

A batch-1 decode step reads every weight once; at 4.17 TB/s the 0.8B model's 1.0 GB (bfloat16, byte
vocabulary) is 240 us, and the step's 97 gemms took 660 us on the H200 (pass 3: cuBLAS on the 64-row
tiles that keep a row's bits independent of the batch). Side by side in one process, per shape (and
summed over a step, times the layers that have it):

- ``cublas-64``: ``inv.linear`` on the step's 64 padded rows (the engine's default);
- ``cublas-16``: one cuBLAS gemm of 16 rows (what a 16-row tile would cost: as batch-invariant as 64 rows
  if every call has 16);
- ``cublas-1``: one row, cuBLAS's matrix-vector path (a bound, not a candidate: its arithmetic differs
  from the tiles');
- ``triton``: the decode gemm (``ops/decode_rows/gemm.py``) on 1 live row of 64, the fastest of its
  configurations (which one is printed).

Median of triton's ``do_bench`` (the L2 cleared before each run: the weight comes from memory, as in a
step). TB/s counts the weight's bytes. A kernel timed alone between two events carries the events' own
few microseconds, which a 10 us gemm cannot hide; so each candidate is also timed **in a graph**: a whole
step's gemms, each on its own weight (1 GB, far past the L2) in the step's order, captured in one CUDA graph
and replayed, as the engine's decode step runs them. That total, against the summed ``do_bench`` medians,
says how much of a lone kernel's time is the measurement's. Prints a table, writes JSON. Needs CUDA.

Usage: ``python benchmarks/decode_gemms.py [--vocab N] [--wide] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from triton.testing import do_bench

from mini_engine.model import HybridModel
from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.model.config import LINEAR
from mini_engine.ops import invariant as inv
from mini_engine.ops.decode_rows import gemm as gemm_ops

COPY_BANDWIDTH = 4.17e12  # bytes/s, the H200's device copy (issue 9)
DEVICE = "cuda"
CANDIDATES = ("cublas-64", "cublas-16", "cublas-1", "triton")


def step_weights(vocab: int | None) -> dict[tuple[int, int], int]:
    """(out, in) -> how many of a decode step's gemms multiply a weight of that shape (the step's own list)."""
    config = builtin_config(QWEN35_08B)
    config = config if vocab is None else dataclasses.replace(config, vocab_size=vocab)
    with torch.device("meta"):
        model = HybridModel(config)
    counts: dict[tuple[int, int], int] = {}
    for layer in model.model.layers:
        mixer = layer.linear_attn if layer.layer_type == LINEAR else layer.self_attn
        fused = mixer.in_proj.parts if layer.layer_type == LINEAR else mixer.qkv.parts
        out = (mixer.out_proj if layer.layer_type == LINEAR else mixer.o_proj).weight
        shapes = [(sum(p.weight.shape[0] for p in fused), config.hidden_size), tuple(out.shape),
                  (2 * config.intermediate_size, config.hidden_size), tuple(layer.mlp.down_proj.weight.shape)]
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
    head = (config.vocab_size, config.hidden_size)
    counts[head] = counts.get(head, 0) + 1
    return counts


def microseconds(fn) -> float:
    return do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3


def wide_configs(n_out: int, n_in: int) -> list[gemm_ops.GemmConfig]:
    """The engine's candidates (``gemm_ops.configs``) and a wider grid: column blocks of 32-128, K blocks of 128
    or 256, 4 or 8 warps, K in 1, 2 or 4 parts whatever the width (more programs in flight per SM)."""
    grid = [gemm_ops.GemmConfig(n, k, num_warps=w, split_k=split) for n in (32, 64, 128) for k in (128, 256)
            for w in (4, 8) for split in (1, 2, 4) if n_in % (k * split) == 0]
    return list(dict.fromkeys(gemm_ops.configs(n_out, n_in) + grid))


def measure(shape: tuple[int, int], wide: bool = False) -> dict:
    n_out, n_in = shape
    weight = torch.randn(n_out, n_in, device=DEVICE, dtype=torch.bfloat16) * n_in**-0.5
    padded = torch.zeros(inv.ROW_TILE, n_in, device=DEVICE, dtype=torch.bfloat16)
    padded[:1].normal_()
    times = {"cublas-64": microseconds(lambda: inv.linear(padded, weight)),
             "cublas-16": microseconds(lambda: padded[:16] @ weight.T),
             "cublas-1": microseconds(lambda: padded[:1] @ weight.T)}
    triton_times = {config: microseconds(lambda c=config: gemm_ops.linear(padded, weight, rows=1, config=c))
                    for config in (wide_configs if wide else gemm_ops.configs)(n_out, n_in)}
    best = min(triton_times, key=triton_times.get)
    times["triton"] = triton_times[best]
    return {"shape": list(shape), "weight_bytes": weight.numel() * 2, "us": times, "triton_config": best._asdict()}


def in_graph(rows: list[dict], repeats: int = 20) -> dict:
    """Microseconds of a whole step's gemms per candidate, captured in one CUDA graph (each gemm its own weight,
    per layer its shapes in turn, the head last; Triton with each shape's fastest configuration in ``rows``) and
    replayed: the median of ``repeats`` replays."""
    counts = {tuple(r["shape"]): r["per_step"] for r in rows}
    order = list(counts)  # the step's own order (``step_weights``): a layer's shapes, then the head
    layers = max(counts[shape] for shape in order[:-1])
    sequence = [shape for layer in range(layers) for shape in order[:-1] if layer < counts[shape]] + [order[-1]]
    weights = [torch.randn(n_out, n_in, device=DEVICE, dtype=torch.bfloat16) * n_in**-0.5 for n_out, n_in in sequence]
    padded = {n_in: torch.zeros(inv.ROW_TILE, n_in, device=DEVICE, dtype=torch.bfloat16) for _, n_in in sequence}
    for x in padded.values():
        x[:1].normal_()
    best_config = {tuple(r["shape"]): gemm_ops.GemmConfig(**r["triton_config"]) for r in rows}
    gemms = {"cublas-64": lambda w: inv.linear(padded[w.shape[1]], w),
             "cublas-16": lambda w: padded[w.shape[1]][:16] @ w.T,
             "cublas-1": lambda w: padded[w.shape[1]][:1] @ w.T,
             "triton": lambda w: gemm_ops.linear(padded[w.shape[1]], w, rows=1, config=best_config[tuple(w.shape)])}
    out = {}
    for name, gemm in gemms.items():
        for w in weights:  # compile and warm outside the capture
            gemm(w)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in weights:
                gemm(w)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        out[name] = sorted(times)[len(times) // 2]
        del graph
    return {"gemms": len(sequence), "weight_bytes": sum(w.numel() * 2 for w in weights), "us": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=None, help="the head's ids (default the byte tokenizer's)")
    parser.add_argument("--wide", action="store_true", help="search a wider grid of Triton configurations than the "
                                                                "engine's own candidates (``wide_configs``)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    counts = step_weights(args.vocab)
    rows = [{**measure(shape, args.wide), "per_step": n} for shape, n in counts.items()]
    print(f"{torch.cuda.get_device_name()}, bfloat16 weights, batch 1 (TB/s of the weight's bytes; "
          f"copy bandwidth {COPY_BANDWIDTH / 1e12:.2f} TB/s)")
    print(f"{'weight [out, in]':<18}{'x step':>7}" + "".join(f"{c:>20}" for c in CANDIDATES) + "   triton config")
    for r in rows:
        cells = "".join(f"{r['us'][c]:>9.1f} us {r['weight_bytes'] / (r['us'][c] * 1e-6) / 1e12:>4.2f}"
                        for c in CANDIDATES)
        print(f"{tuple(r['shape'])!s:<18}{r['per_step']:>7}{cells}   {r['triton_config']}")
    totals = {c: sum(r["us"][c] * r["per_step"] for r in rows) for c in CANDIDATES}
    weights = sum(r["weight_bytes"] * r["per_step"] for r in rows)
    best = sum(min(r["us"][c] for c in ("cublas-64", "cublas-16", "triton")) * r["per_step"] for r in rows)
    print(f"{'a step':<25}" + "".join(f"{totals[c]:>9.0f} us {weights / (totals[c] * 1e-6) / 1e12:>4.2f}"
                                      for c in CANDIDATES))
    print(f"the step's {weights / 1e9:.2f} GB at the copy bandwidth: {weights / COPY_BANDWIDTH * 1e6:.0f} us; the "
          f"fastest batch-invariant candidate per shape: {best:.0f} us")
    graph = in_graph(rows)
    graph_us = graph["us"]
    print(f"{'in one graph':<25}" + "".join(f"{graph_us[c]:>9.0f} us {weights / (graph_us[c] * 1e-6) / 1e12:>4.2f}"
                                           for c in CANDIDATES)
          + f"   ({graph['gemms']} gemms on their own weights, replayed: the step's gemms as the engine runs them)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "vocab": args.vocab, "rows": rows,
                       "step_us": totals, "best_invariant_step_us": best, "step_weight_bytes": weights,
                       "in_graph": graph}, f, indent=2)


if __name__ == "__main__":
    main()
