"""The small Triton kernels on CUDA against their torch equivalents, side by side in one process.

Slot checksum and batched slot copy (clone / restore) on Qwen3.5-0.8B-shaped linear state (18 GDN
layers: conv 6144 x 3, rec 16 x 128 x 128, float32), the conv1d decode update at batch 64, and paged
decode attention (context 4096, 8 query / 2 KV heads of 256, bf16, 64-token pages) at batch 1/32/64.
Bandwidth counts the bytes a kernel must move (read + write) against the H200's 4.17 TB/s copy
bandwidth; the measured torch copy of 1 GiB is printed beside it. Median of triton's do_bench
(L2 flushed between runs). Usage: ``python benchmarks/small_kernels.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from mini_engine.ops.attention.triton import paged_decode_attention
from mini_engine.ops.causal_conv1d import causal_conv1d_update as reference_conv_update
from mini_engine.ops.causal_conv1d.triton import causal_conv1d_update
from mini_engine.ops.checksum import slot_checksum as reference_checksum
from mini_engine.ops.checksum.triton import checksum_lanes
from mini_engine.ops.slot_copy import copy_slots as reference_copy_slots
from mini_engine.ops.slot_copy.triton import copy_slots

COPY_BANDWIDTH = 4.17e12  # bytes/s, H200 device-to-device copy (issue 9)
LAYERS, CONV, REC, PENDING_WIDTH = 18, (6144, 3), (16, 128, 128), 6176
DEVICE = "cuda"


def timed_us(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def row(kernel: str, variant: str, shape: str, time_us: float, bytes_moved: int | None) -> dict:
    rate = None if bytes_moved is None else bytes_moved / (time_us * 1e-6)
    return {"kernel": kernel, "variant": variant, "shape": shape, "time_us": time_us,
            "bytes": bytes_moved, "gb_s": None if rate is None else rate / 1e9,
            "of_copy_bandwidth": None if rate is None else rate / COPY_BANDWIDTH}


def torch_copy() -> list[dict]:
    src = torch.empty(1 << 28, dtype=torch.float32, device=DEVICE)
    dst = torch.empty_like(src)
    return [row("copy (baseline)", "torch copy_", "1 GiB", timed_us(lambda: dst.copy_(src)), 2 * src.nbytes)]


def state_pools(n_slots: int):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    conv = torch.randn(n_slots, LAYERS, *CONV, device=DEVICE, generator=gen)
    rec = torch.randn(n_slots, LAYERS, *REC, device=DEVICE, generator=gen)
    pending = torch.randn(n_slots, LAYERS, 63, PENDING_WIDTH, device=DEVICE, generator=gen)
    return conv, rec, pending


def checksums(rec: torch.Tensor) -> list[dict]:
    n = rec.shape[0]
    slots = torch.arange(n, dtype=torch.int32, device=DEVICE)
    triton_us = timed_us(lambda: checksum_lanes(pool=rec, slots=slots))
    reference_us = timed_us(lambda: reference_checksum(rec[1]))
    slot_bytes = rec[0].nbytes
    return [row("slot checksum", f"triton, {n} slots in one launch", f"rec slot {slot_bytes / 1e6:.1f} MB", triton_us,
                n * slot_bytes),
            row("slot checksum", "torch reference, one slot", f"rec slot {slot_bytes / 1e6:.1f} MB", reference_us,
                slot_bytes)]


def slot_copies(conv, rec, pending, n_pairs: int = 16, rows: int = 37) -> list[dict]:
    dst = torch.arange(n_pairs, dtype=torch.int32, device=DEVICE)
    src = dst + n_pairs
    counts = torch.full((n_pairs,), rows, device=DEVICE)
    moved = 2 * n_pairs * (conv[0].nbytes + rec[0].nbytes + pending[0, :, :rows].nbytes)

    def per_pair_loop():  # what StateStorage.copy_slot does today, pair by pair
        for d, s in zip(range(n_pairs), range(n_pairs, 2 * n_pairs)):
            conv[d].copy_(conv[s])
            rec[d].copy_(rec[s])
            pending[d, :, :rows].copy_(pending[s, :, :rows])

    shape = f"{n_pairs} pairs, conv+rec+{rows} pending rows"
    return [row("slot copy", "triton, one launch", shape,
                timed_us(lambda: copy_slots(pools=[conv, rec], dst=dst, src=src, pending=pending, rows=counts)), moved),
            row("slot copy", "torch index_copy reference", shape,
                timed_us(lambda: reference_copy_slots(pools=[conv, rec], dst=dst, src=src, pending=pending,
                                                      rows=counts)), moved),
            row("slot copy", "torch copy_ per pair", shape, timed_us(per_pair_loop), moved)]


def conv_update(conv: torch.Tensor, batch: int = 64) -> list[dict]:
    pool = conv[:, 0]  # one layer of the store: a strided [slots, C, W-1] view
    channels = pool.shape[1]
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(batch, channels, device=DEVICE, generator=gen).bfloat16()
    weight = torch.randn(channels, 4, device=DEVICE, generator=gen).bfloat16()
    slots = torch.randperm(pool.shape[0], device=DEVICE, generator=gen)[:batch].to(torch.int32)
    long_slots = slots.long()

    def torch_update():
        result = reference_conv_update(x=x, weight=weight, state=pool[long_slots])
        pool[long_slots] = result.final_state

    moved = 2 * batch * pool[0].nbytes + x.nbytes * 2
    shape = f"batch {batch}, C={channels}, W=4, bf16 x, fp32 slots"
    return [row("conv1d update", "triton, in place", shape,
                timed_us(lambda: causal_conv1d_update(x=x, weight=weight, conv_pool=pool, slot_indices=slots)), moved),
            row("conv1d update", "torch reference + scatter", shape, timed_us(torch_update), moved)]


def paged_decode(batch: int, context: int = 4096, hq: int = 8, hkv: int = 2, head_dim: int = 256,
                 page_size: int = 64) -> list[dict]:
    gen = torch.Generator(device=DEVICE).manual_seed(batch)
    pages_per_seq = context // page_size
    n_pages = batch * pages_per_seq + 7
    k_cache = torch.randn(n_pages, page_size, hkv, head_dim, device=DEVICE, generator=gen).bfloat16()
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(n_pages, device=DEVICE, generator=gen)[: batch * pages_per_seq]
    table = table.reshape(batch, pages_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    q = torch.randn(batch, hq, head_dim, device=DEVICE, generator=gen).bfloat16()

    def gathered():
        def one(cache):
            return cache[table.long()].reshape(batch, context, hkv, head_dim).transpose(1, 2)
        return one(k_cache), one(v_cache)

    k_dense, v_dense = (t.contiguous() for t in gathered())

    def sdpa(k, v):
        return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

    def triton_decode(split):
        return lambda: paged_decode_attention(q=q, k_cache=k_cache, v_cache=v_cache, page_table=table,
                                              seq_lens=lens, keys_per_split=split, max_seq_len=context)

    want = sdpa(k_dense, v_dense).float()

    def error(split):
        return ((triton_decode(split)().float() - want).norm() / want.norm()).item()

    moved = 2 * batch * context * hkv * head_dim * k_cache.element_size()
    shape = f"batch {batch}, ctx {context}, {hq}q/{hkv}kv x {head_dim}, bf16"
    rows = [{**row("paged decode", f"triton, keys_per_split={split}", shape, timed_us(triton_decode(split)), moved),
             "rel_error_vs_sdpa": error(split)} for split in (128, 256, 512, None)]
    rows.append(row("paged decode", "torch SDPA, KV already contiguous", shape,
                    timed_us(lambda: sdpa(k_dense, v_dense)), moved))
    rows.append(row("paged decode", "torch gather pages + SDPA", shape, timed_us(lambda: sdpa(*gathered())), moved))
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth reference {COPY_BANDWIDTH / 1e12:.2f} TB/s")
    print(f"{'kernel':<16}{'variant':<38}{'shape':<44}{'time':>11}{'GB/s':>9}{'of 4.17':>9}")
    for r in rows:
        rate = "" if r["gb_s"] is None else f"{r['gb_s']:.0f}"
        share = "" if r["of_copy_bandwidth"] is None else f"{100 * r['of_copy_bandwidth']:.0f}%"
        print(f"{r['kernel']:<16}{r['variant']:<38}{r['shape']:<44}{r['time_us']:>9.1f}us{rate:>9}{share:>9}")
    errors = [f"{r['shape'].split(',')[0]} {r['variant'].split(', ')[1]}: {r['rel_error_vs_sdpa']:.1e}"
              for r in rows if "rel_error_vs_sdpa" in r]
    print("paged decode, relative error vs SDPA (bf16): " + "; ".join(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/small_kernels.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("small_kernels.py needs a CUDA device")
    rows = torch_copy()
    conv, rec, pending = state_pools(n_slots=65)  # slot 0 + a batch of 64 distinct slots for the conv update
    rows += checksums(rec)
    rows += slot_copies(conv, rec, pending)
    rows += conv_update(conv)
    for batch in (1, 32, 64):
        rows += paged_decode(batch)
    print_table(rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "copy_bandwidth_reference": COPY_BANDWIDTH, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
