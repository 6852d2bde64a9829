"""Measure the decode gemm's choices on this GPU and write them to the table ``decode_gemm="tuned"`` reads.

For each model and dtype, every weight the Triton decode step multiplies (its fused projections and the head,
as ``DecodeModel`` builds them) is ranked by ``gemm.rank_by_batch`` (cuBLAS and the Triton configurations, timed in a
CUDA graph as a step runs them, at each of ``--batches`` live rows), and the fastest by the batches' summed times
goes into the table under this GPU's name (``torch.cuda.get_device_name``), merged with what the table already holds
for other GPUs, with each batch's times beside it. One choice serves every batch (a row's bits must not depend on
its batch), so ``--batches`` weighs them: ``--batches 1`` ranks for one sequence's decode alone. The models are
built with random weights on the GPU: only their shapes matter. A weight whose output the residual's norm reads (a
mixer's output or the MLP's down projection: ``DecodeModel.deltas``) has its splits timed without their second launch,
as the step runs them (the norm adds the parts); a shape is ranked once, in the first role it is met in. Prints one
line per weight.

    python scripts/tune_decode_gemms.py [--models NAME ...] [--vocab N ...] [--dtypes bfloat16 float16]
                                        [--batches B ...] [--out FILE]
                                        (default: batches 1 32, the package's table, mini_engine/ops/decode_rows)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_engine.model import HybridModel
from mini_engine.model.builtin import (
    BUILTIN_MODELS,
    QWEN35_08B,
    QWEN35_VOCAB,
    builtin_config,
)
from mini_engine.model.decode import DecodeModel
from mini_engine.ops import invariant as inv
from mini_engine.ops.decode_rows import gemm, tuned


def weights(name: str, vocab: int | None, dtype: torch.dtype) -> list[tuple[torch.Tensor, bool]]:
    """The decode step's 16-bit weights of the built-in model ``name`` (with ``vocab`` ids), on the GPU, each with
    whether the residual's norm adds its split's parts (``DecodeModel.deltas``: its splits are timed without their
    second launch)."""
    config = builtin_config(name)
    if vocab is not None:
        config = dataclasses.replace(config, vocab_size=vocab)
    decoder = DecodeModel(HybridModel(config).eval().cuda().cast_projections(dtype))
    deltas = {id(weight) for weight in decoder.deltas()}
    return [(weight, id(weight) in deltas) for weight in decoder.projections()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(BUILTIN_MODELS), default=["tiny-random", QWEN35_08B])
    parser.add_argument("--vocab", type=int, nargs="*", default=[QWEN35_VOCAB],
                        help=f"also {QWEN35_08B}'s head at these vocabularies (default: Qwen3.5's, {QWEN35_VOCAB})")
    parser.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float16"), default=["bfloat16", "float16"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32],
                        help="the live rows each candidate is timed at; the choice is the fastest by their sum")
    parser.add_argument("--out", type=Path, default=tuned.TABLE)
    args = parser.parse_args()
    if any(not 1 <= b <= inv.ROW_TILE for b in args.batches) or len(set(args.batches)) != len(args.batches):
        parser.error(f"--batches: distinct live-row counts from 1 to {inv.ROW_TILE} (the padded input's rows); got "
                     f"{args.batches}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: the table holds timings measured on one")
    device = torch.cuda.get_device_name()
    table = tuned.load(args.out)
    done = set()
    builds = [(name, None) for name in args.models] + [(QWEN35_08B, v) for v in args.vocab]
    batches = tuple(args.batches)
    print(f"{device}: weight, choice, its us and cuBLAS's (summed over batches {' + '.join(map(str, batches))}), "
          f"then at each batch its us, cuBLAS's and the fastest candidate's")
    for dtype in (getattr(torch, d) for d in args.dtypes):
        for name, vocab in builds:
            for weight, delta in weights(name, vocab, dtype):
                key = tuned.entry_key(weight.dtype, tuple(weight.shape))
                if key in done:
                    continue
                done.add(key)
                entry = tuned.record(table, device, weight, gemm.rank_by_batch(weight, batches=batches,
                                                                               unsummed=delta))
                each = "  ".join(f"b{b}: {e['us']:.2f} {e['cublas_us']:.2f} {e['fastest_us']:.2f}"
                                 for b, e in entry["by_batch"].items())
                print(f"  {key:<24} {json.dumps(entry['config']):<110} {entry['us']:>9.2f} {entry['cublas_us']:>9.2f}"
                      f"  {each}", flush=True)
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
