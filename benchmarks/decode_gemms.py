"""The decode step's projections at batch 1, per weight shape of the 0.8B model: what each gemm streams.

A batch-1 decode step reads every weight once; at 4.17 TB/s the 0.8B model's 1.0 GB (bfloat16, byte
vocabulary) is 240 us, and the step's 97 gemms took 655 us in one CUDA graph on the H200 (session 11:
cuBLAS on the 64-row tiles that keep a row's bits independent of the batch). Side by side in one process,
per shape (and summed over a step, times the layers that have it):

- ``cublas-64``: ``inv.linear`` on the step's 64 padded rows (the engine's default);
- ``cublas-16``: one cuBLAS gemm of 16 rows (what a 16-row tile would cost: as batch-invariant as 64 rows
  if every call has 16);
- ``cublas-1``: one row, cuBLAS's matrix-vector path (a bound, not a candidate: its arithmetic differs
  from the tiles');
- ``triton``: the decode gemm (``ops/decode_rows/gemm.py``) on 1 live row of 64, the fastest of its
  configurations; ``swapped``: its swapped tile (weight @ x.T), the weight loaded by address; ``tma``: the
  swapped tile with the weight through a tensor descriptor (Hopper's TMA); ``tma+pdl``: the same launched as
  programmatic dependent launches (each gemm's launch overlaps the one before; in a graph a kernel's own fixed
  cost was about 3 us on an H100, session 12); ``tma+pdl+pf``: those asking the L2 for their weight rows before
  their wait, their first two pipeline stages or all of it (``GemmConfig.prefetch``: the next gemm's bytes start
  coming while the one before still runs; not among the engine's candidates: all of it was faster here, slower
  in the engine's step, session 21; the first two stages slower there too, session 22). The swapped splits run
  also with their parts added by each tile's last program in the same launch (``fused_sum``; "k/4+" in the
  table), not by a second launch, which costs a kernel's fixed cost. Which configuration won is printed.

Every time is a gemm **in a CUDA graph**, as a graphed decode step runs it: one shape's gemm captured once per
copy of its weight (copies past the L2, so the weight comes from memory; ``gemm.past_l2``) and replayed, the
median replay divided by the copies (``gemm.graph_microseconds``). Timed alone between two events, a 10 us gemm
carries the events' own few microseconds, unevenly between candidates (session 11: 1.4-2.7x over). Then the
whole step: its gemms, each on its own weight (1 GB) in the step's order, in one graph, per candidate with
each shape's fastest configuration, and with the package's table (the engine's default: each shape's choice
timed alone, which session 21 found can lose in the step). Prints a table, writes JSON. Needs CUDA.

Usage: ``python benchmarks/decode_gemms.py [--vocab N] [--wide] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from mini_engine.model import HybridModel
from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.model.config import LINEAR
from mini_engine.ops import invariant as inv
from mini_engine.ops.decode_rows import gemm as gemm_ops
from mini_engine.ops.decode_rows import tuned

COPY_BANDWIDTH = 4.17e12  # bytes/s, the H200's device copy (issue 9)
DEVICE = "cuda"
TRITON_FAMILIES = ("triton", "swapped", "tma", "tma+pdl", "tma+pdl+pf")
CANDIDATES = ("cublas-64", "cublas-16", "cublas-1", *TRITON_FAMILIES)
SHARED_BYTES = 232_448  # the H200's shared memory per block: a TMA pipeline's stages must fit


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


def wide_configs(n_out: int, n_in: int) -> list[gemm_ops.GemmConfig]:
    """The engine's candidates (``gemm_ops.configs``) and a wider grid of the swapped tile: K blocks of 128 or 256,
    K in 1, 2 or 4 parts whatever the width (more programs in flight per SM); the weight by address on 64 weight
    rows, by descriptor on 16-128 (the narrow tiles over all of K) in 4 pipeline stages, or 3 where 4 do not fit.
    (Session 11's wider grid of the unswapped tile found nothing faster in a graph than its own candidates; session
    12's 3-stage pipelines gained 1-3 % where 4 fit.)"""
    fits = [(k, split) for k in (128, 256) for split in (1, 2, 4) if n_in % (k * split) == 0]
    grid = [gemm_ops.GemmConfig(64, k, split_k=split, swap=True) for k, split in fits]
    for n in (16, 32, 64, 128):
        for k, split in fits:
            stages = 4 if 4 * (n + gemm_ops.BLOCK_M) * k * 2 <= SHARED_BYTES else 3
            if n >= 64 or split == 1:
                grid.append(gemm_ops.GemmConfig(n, k, num_stages=stages, split_k=split, swap=True, tma=True))
    return list(dict.fromkeys(gemm_ops.configs(n_out, n_in) + grid))


def family(config: gemm_ops.GemmConfig) -> str:
    if config.pdl:
        return "tma+pdl+pf" if config.prefetch else "tma+pdl"
    return "tma" if config.tma else "swapped" if config.swap else "triton"


def measure(shape: tuple[int, int], wide: bool = False) -> dict:
    """Per candidate, microseconds of one gemm of ``shape`` in a graph; the Triton families the fastest of their
    configurations (all of them timed: ``configs``)."""
    n_out, n_in = shape
    weight = torch.randn(n_out, n_in, device=DEVICE, dtype=torch.bfloat16) * n_in**-0.5
    copies = [weight] + [weight.clone() for _ in range(gemm_ops.past_l2(weight) - 1)]
    padded = torch.zeros(inv.ROW_TILE, n_in, device=DEVICE, dtype=torch.bfloat16)
    padded[:1].normal_()

    def in_graph(gemm) -> float:
        return gemm_ops.graph_microseconds([lambda w=w: gemm(w) for w in copies]) / len(copies)

    times = {"cublas-64": in_graph(lambda w: inv.linear(padded, w)),
             "cublas-16": in_graph(lambda w: padded[:16] @ w.T),
             "cublas-1": in_graph(lambda w: padded[:1] @ w.T)}
    configs = {}
    candidates = wide_configs(n_out, n_in) if wide else gemm_ops.configs(n_out, n_in)  # TMA tiles with PDL included
    if wide:  # every TMA tile of the wider grid also as a dependent launch
        candidates += [c._replace(pdl=True) for c in candidates if c.tma]
    # (not the engine's candidates) asking for each row's first two pipeline stages, or its whole part
    candidates += [c._replace(prefetch=columns) for c in candidates if c.pdl for columns in (2 * c.block_k, n_in)]
    candidates += [c._replace(fused_sum=True) for c in candidates if c.swap and c.split_k > 1]
    for config in dict.fromkeys(candidates):
        try:
            configs[config] = in_graph(lambda w, c=config: gemm_ops.linear(padded, w, rows=1, config=c))
        except (OutOfResources, CompilationError) as error:  # one this device cannot run: named, not fatal
            print(f"{shape} {config}: {type(error).__name__}: {str(error)[:200]}")
    best = {}
    for name in TRITON_FAMILIES:
        timed = {c: t for c, t in configs.items() if family(c) == name}
        if timed:
            best[name] = min(timed, key=timed.get)
            times[name] = timed[best[name]]
    return {"shape": list(shape), "weight_bytes": weight.numel() * 2, "us": times,
            "configs": {name: config._asdict() for name, config in best.items()},
            "all_configs": [{**c._asdict(), "us": t} for c, t in configs.items()]}


def step_in_graph(rows: list[dict], repeats: int = 20) -> dict:
    """Microseconds of a whole step's gemms per candidate, captured in one CUDA graph (each gemm its own weight,
    per layer its shapes in turn, the head last; a Triton family with each shape's fastest configuration in
    ``rows``) and replayed: the median of ``repeats`` replays."""
    counts = {tuple(r["shape"]): r["per_step"] for r in rows}
    order = list(counts)  # the step's own order (``step_weights``): a layer's shapes, then the head
    layers = max(counts[shape] for shape in order[:-1])
    sequence = [shape for layer in range(layers) for shape in order[:-1] if layer < counts[shape]] + [order[-1]]
    weights = [torch.randn(n_out, n_in, device=DEVICE, dtype=torch.bfloat16) * n_in**-0.5 for n_out, n_in in sequence]
    padded = {n_in: torch.zeros(inv.ROW_TILE, n_in, device=DEVICE, dtype=torch.bfloat16) for _, n_in in sequence}
    for x in padded.values():
        x[:1].normal_()
    gemms = {"cublas-64": lambda w: inv.linear(padded[w.shape[1]], w),
             "cublas-16": lambda w: padded[w.shape[1]][:16] @ w.T,
             "cublas-1": lambda w: padded[w.shape[1]][:1] @ w.T}
    for name in TRITON_FAMILIES:
        if all(name in r["configs"] for r in rows):
            best = {tuple(r["shape"]): gemm_ops.GemmConfig(**r["configs"][name]) for r in rows}
            gemms[name] = lambda w, best=best: gemm_ops.linear(padded[w.shape[1]], w, rows=1,
                                                                config=best[tuple(w.shape)])
    # the engine's default, the package's table for this GPU (cuBLAS where it names none): each shape's choice
    # timed alone, as the tuner ranks them, is not the step's (session 21: faster alone, slower in the step)
    chosen = {tuple(w.shape): tuned.tuned(w) for w in weights}
    gemms["table"] = lambda w: (inv.linear(padded[w.shape[1]], w) if chosen[tuple(w.shape)] is None else
                                gemm_ops.linear(padded[w.shape[1]], w, rows=1, config=chosen[tuple(w.shape)]))
    out = {name: gemm_ops.graph_microseconds([lambda w=w, g=gemm: g(w) for w in weights], repeats)
           for name, gemm in gemms.items()}
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
    present = [c for c in CANDIDATES if all(c in r["us"] for r in rows)]
    print(f"{torch.cuda.get_device_name()}, bfloat16 weights, batch 1, each gemm in a CUDA graph (TB/s of the "
          f"weight's bytes; copy bandwidth {COPY_BANDWIDTH / 1e12:.2f} TB/s)")
    print(f"{'weight [out, in]':<18}{'x step':>7}" + "".join(f"{c:>18}" for c in present) + "   fastest configurations")
    for r in rows:
        cells = "".join(f"{r['us'][c]:>8.1f} us {r['weight_bytes'] / (r['us'][c] * 1e-6) / 1e12:>4.2f}"
                        for c in present)
        print(f"{tuple(r['shape'])!s:<18}{r['per_step']:>7}{cells}   "
              + "; ".join(f"{name} {label(c)}" for name, c in r["configs"].items()))
    totals = {c: sum(r["us"][c] * r["per_step"] for r in rows) for c in present}
    weights = sum(r["weight_bytes"] * r["per_step"] for r in rows)
    invariant = [c for c in present if c != "cublas-1"]
    best = sum(min(r["us"][c] for c in invariant) * r["per_step"] for r in rows)
    print(f"{'a step, summed':<25}" + "".join(f"{totals[c]:>8.0f} us {weights / (totals[c] * 1e-6) / 1e12:>4.2f}"
                                              for c in present))
    graph = step_in_graph(rows)
    graph_us = graph["us"]
    print(f"{'a step in one graph':<25}" + "".join(
        f"{graph_us[c]:>8.0f} us {weights / (graph_us[c] * 1e-6) / 1e12:>4.2f}" if c in graph_us else f"{'-':>18}"
        for c in present) + f"   ({graph['gemms']} gemms, each on its own weight)")
    print(f"{'the package table in one graph':<25}{graph_us['table']:>8.0f} us "
          f"{weights / (graph_us['table'] * 1e-6) / 1e12:>4.2f}   (decode_gemm=\"tuned\" on this GPU: the engine's "
          "default)")
    print(f"the step's {weights / 1e9:.2f} GB at the copy bandwidth: {weights / COPY_BANDWIDTH * 1e6:.0f} us; the "
          f"fastest batch-invariant candidate per shape, summed: {best:.0f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "vocab": args.vocab, "rows": rows,
                       "step_us": totals, "best_invariant_step_us": best, "step_weight_bytes": weights,
                       "in_graph": graph}, f, indent=2)


def label(config: dict) -> str:
    """A configuration in a table cell: block_n x block_k, warps, stages, K parts (+: added in the same launch)."""
    return (f"{config['block_n']}x{config['block_k']} w{config['num_warps']} s{config['num_stages']}"
            f" k/{config['split_k']}{'+' if config.get('fused_sum') else ''}"
            f"{' pf' + str(config['prefetch']) if config.get('prefetch') else ''}")

if __name__ == "__main__":
    main()
