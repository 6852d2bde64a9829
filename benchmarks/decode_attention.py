"""The decode step's paged attention on the 0.8B shape, per kernel tile and split: what one layer's launch costs.

In a batch-1 decode step of the Qwen3.5-0.8B-shaped model attention grows with the context: 7 % of an H100's step at
68 tokens, 16 % from about 300 on (``decode_anatomy.py``, session 31), about 34 us a layer for under 1.2 MB of keys and
values. Side by side in one process, per situation (a batch, a context length, the page table's capacity) and per
candidate:

- ``tile``: keys per tile (``DecodeTile.block_k``), warps and pipeline stages of ``_decode_kernel``;
- ``split``: keys per split (``keys_per_split``: the grid spans the table's capacity in splits of this many
  positions, merged by a second launch when there is more than one), or ``whole`` (one pass per sequence).

The situations: the gpu_engine benchmark's (prompt 64 + 40 new tokens, a table of 11 pages: one split), the anatomy's
(500 keys of a 704-position table), and a server's (a 4,096-token table, contexts of 1,000 and 3,000 keys, batch 1 and
32). Every time is the launch **in a CUDA graph** (``gemm.graph_microseconds``), in bfloat16 (the engine's dtype),
gated and laid out for the output projection as the step calls it, over copies of the KV cache past the L2 (the step
streams 1.5 GB of weights between two visits of a layer's cache), every kernel a programmatic dependent launch where
the device has them (as ``decode_pdl`` runs it). Prints a table per situation (fastest first) and writes JSON. Needs
CUDA. Run with another tree's package first on ``PYTHONPATH`` to time its kernel in the same situations (its own tiles
permitting).

A launch's time here is not its cost in the engine's step, where the projections' gemms are its neighbours: rank
candidates with ``decode_anatomy.py --attention-tiles``. On an H200 (session 32) a kernel with a program per kv head
(a2a87c3, reverted) timed 2.8-6.3x faster than this one here, in every situation, and the engine decoded 14 % slower
with it (829 against 963 tok/s at batch 1); this kernel's own 21 us at 104 keys here was 11.5 us in an H100's step
(session 13's trace).

Usage: ``python benchmarks/decode_attention.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.compiler.errors import CompilationError
from triton.runtime.errors import OutOfResources

from mini_engine.model.builtin import QWEN35_08B, builtin_config
from mini_engine.ops import pdl
from mini_engine.ops.attention.triton import (
    DECODE_TILE,
    DEFAULT_KEYS_PER_SPLIT,
    DecodeTile,
    paged_decode_attention,
)
from mini_engine.ops.decode_rows.gemm import graph_microseconds, past_l2

PAGE = 16
ROWS = 64  # the step's padded rows (``inv.ROW_TILE``)
SITUATIONS = [  # (name, batch, keys per sequence, table capacity in positions)
    ("gpu_engine, batch 1", 1, 104, 176),
    ("anatomy, batch 1", 1, 500, 704),
    ("server, batch 1", 1, 1000, 4096),
    ("server, batch 1, long", 1, 3000, 4096),
    ("gpu_engine, batch 32", 32, 104, 176),
    ("server, batch 32", 32, 1000, 4096),
]
TILES = [DecodeTile(k, w, s) for k, w, s in itertools.product((16, 32, 64), (4, 8), (1, 2))]
SPLITS = (None, 64, 128, 256)
DTYPE = torch.bfloat16


def situation(batch: int, keys: int, capacity: int) -> dict:
    """The tensors one layer's decode attention reads, on the GPU: a query and gate per sequence, page tables of
    ``capacity`` positions (distinct pages per sequence), and enough copies of the layer's KV pages to pass the L2."""
    config = builtin_config(QWEN35_08B)
    hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    width = capacity // PAGE
    gen = torch.Generator(device="cuda").manual_seed(0)
    pages = batch * width + 1
    caches = [(torch.randn(pages, PAGE, hkv, d, device="cuda", generator=gen).to(DTYPE),
               torch.randn(pages, PAGE, hkv, d, device="cuda", generator=gen).to(DTYPE))]
    caches += [(k.clone(), v.clone()) for k, v in caches * (past_l2(caches[0][0]) // 2)]
    qkv = torch.randn(ROWS, hq * 2 * d, device="cuda", generator=gen).to(DTYPE)
    return {"q": torch.randn(batch, hq, d, device="cuda", generator=gen).to(DTYPE),
            "gate": qkv[:batch].unflatten(1, (hq, 2 * d))[..., d:],
            "table": torch.arange(1, 1 + batch * width, dtype=torch.int32, device="cuda").reshape(batch, width),
            "lens": torch.full((batch,), keys, dtype=torch.long, device="cuda"), "caches": caches}


def time_one(s: dict, tile: DecodeTile, split: int | None) -> float:
    """Microseconds of one layer's launch(es) in a graph, the mean over the cache copies."""
    def call(k, v):
        paged_decode_attention(q=s["q"], k_cache=k, v_cache=v, page_table=s["table"], seq_lens=s["lens"],
                               keys_per_split=split, gate=s["gate"], rows=ROWS, out_dtype=torch.bfloat16, tile=tile)

    with pdl.launches(pdl.supported("cuda") is None):
        return graph_microseconds([lambda k=k, v=v: call(k, v) for k, v in s["caches"]]) / len(s["caches"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default-only", action="store_true",
                        help="time the package's default tile and split alone (another tree's kernel, as a baseline)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    candidates = ([(DECODE_TILE, DEFAULT_KEYS_PER_SPLIT)] if args.default_only
                  else list(itertools.product(TILES, SPLITS)))
    results = []
    for name, batch, keys, capacity in SITUATIONS:
        s = situation(batch, keys, capacity)
        rows = []
        for tile, split in candidates:
            try:
                rows.append({"tile": tile._asdict(), "split": split, "us": time_one(s, tile, split)})
            except (OutOfResources, CompilationError) as error:  # a tile this device cannot run: named, not fatal
                print(f"{name} {tile} split {split}: {type(error).__name__}: {str(error)[:160]}")
        rows.sort(key=lambda r: r["us"])
        default = next(r for r in rows
                       if DecodeTile(**r["tile"]) == DECODE_TILE and r["split"] == DEFAULT_KEYS_PER_SPLIT)
        print(f"{name}: {keys} keys, a table of {capacity} positions; the default (tile {tuple(DECODE_TILE)}, "
              f"split {DEFAULT_KEYS_PER_SPLIT}) {default['us']:.2f} us")
        for r in rows[:6]:
            print(f"   tile {tuple(r['tile'].values())!s:<12} split {r['split'] or 'whole'!s:>5}  {r['us']:7.2f} us  "
                  f"{default['us'] / r['us']:5.2f}x")
        results.append({"situation": name, "batch": batch, "keys": keys, "capacity": capacity, "rows": rows})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "pdl": pdl.supported("cuda") is None,
                       "dtype": str(DTYPE), "default": {"tile": DECODE_TILE._asdict(), "split": DEFAULT_KEYS_PER_SPLIT},
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
