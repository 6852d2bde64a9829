"""Triton paged attention, held to ``attention_with_prefix`` (``reference.py``) on the gathered pages.

Paged layout (one attention layer; views of a bigger store with any strides are fine)::

    k_cache, v_cache   [n_pages, page_size, Hkv, D]
    page_table         [B, max_pages] int32: page_table[b, p // page_size] holds position p of sequence b
    seq_lens           [B]: keys of sequence b, positions 0 .. seq_lens[b] - 1, all already in pages

New keys are written into their pages first (``write_kv_pages``), then attention reads every key
through the page table, so prefill and decode see the same rows:

- ``paged_prefill_attention``: each sequence's ``n_q`` new queries are its last ``n_q`` positions
  (a cached prefix of ``seq_lens[b] - n_q`` keys, then its own); causal; GQA (query head ``h``
  reads kv head ``h // (Hq // Hkv)``).
- ``paged_decode_attention``: one query per sequence at position ``seq_lens[b] - 1``, one program
  per query head, its scores and output as matrix-vector sums over key tiles of ``DECODE_TILE.block_k``;
  split over the keys (flash decoding) in chunks of ``keys_per_split`` positions, merged by
  log-sum-exp in a second launch.

Both keep an fp32 online softmax over key tiles from position 0 (prefill: ``BLOCK_N``, in the
reference's order of operations). A split's boundaries are absolute positions (multiples of
``keys_per_split``), so a row's result depends on its sequence only, never on the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.device import upload
from mini_engine.ops import pdl
from mini_engine.ops.decode_rows.triton import _sigmoid  # sigmoid_mul's: the gated output keeps its bits
from mini_engine.ops.precision import dot_precision

__all__ = ["DECODE_TILE", "DecodeTile", "paged_decode_attention", "paged_prefill_attention", "write_kv_pages"]

BLOCK_N = 64  # keys per tile: the reference's TILE
# The decode's split and tile, ranked inside the engine's own batch-1 step (``decode_anatomy.py --attention-tiles``,
# the 0.8B shape in bfloat16 on an H100, session 34): a split of 64 keys walked as one tile of 64 by 8 warps took the
# step from 1235.5 to 1160.6 us over contexts of 68-371 tokens (attention alone: 154 us -> 79), where 256-key splits
# walked in tiles of 32 by 4 warps in 2 stages (sessions 3-33) spent a program's time on its split's serial walk;
# ``gpu_engine.py`` at batch 1 (contexts 64-104): 836.2, 839.8 -> 849.5, 852.7 tok/s (ABBA processes).
DEFAULT_KEYS_PER_SPLIT = 64


class DecodeTile(NamedTuple):
    """The decode kernel's launch: keys per tile ([block_k, D] of k and of v per step), warps, pipeline stages."""

    block_k: int = 64
    num_warps: int = 8
    num_stages: int = 1


DECODE_TILE = DecodeTile()


@triton.jit
def _key_tile(cache_ptr, table_row, pos, pos_ok, kv_head, d, d_ok,
              stride_p, stride_s, stride_h, PAGE: tl.constexpr):
    """Rows ``pos`` [BLOCK_N] of one kv head through a page-table row -> [BLOCK_N, BLOCK_D]."""
    page = tl.load(table_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
    row = page * stride_p + (pos % PAGE) * stride_s + kv_head * stride_h
    return tl.load(cache_ptr + row[:, None] + d[None, :], mask=pos_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _attend(q, k_ptr, v_ptr, table_row, kv_head, key_lo, key_hi, n_keys, query_pos, scale, d, d_ok,
            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
            PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
            DOT_PRECISION: tl.constexpr):
    """Online softmax of ``q`` [BLOCK_M, BLOCK_D] over keys [key_lo, key_hi), row r seeing keys <= query_pos[r].

    Returns (acc, running max, denominator): the unnormalised output and its softmax statistics.
    """
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for first in range(key_lo, key_hi, BLOCK_N):
        pos = first + tl.arange(0, BLOCK_N)
        pos_ok = pos < n_keys
        k = _key_tile(k_ptr, table_row, pos, pos_ok, kv_head, d, d_ok, stride_kp, stride_ks, stride_kh, PAGE)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        visible = (pos[None, :] <= query_pos[:, None]) & pos_ok[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))  # finite: every row sees key_lo
        rescale = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        denom = denom * rescale + tl.sum(probs, 1)
        v = _key_tile(v_ptr, table_row, pos, pos_ok, kv_head, d, d_ok, stride_vp, stride_vs, stride_vh, PAGE)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max
    return acc, running_max, denom


@triton.jit(do_not_specialize=["stride_tb"])  # the page table's width varies by call: one compile for all
def _prefill_kernel(q_ptr, k_ptr, v_ptr, table_ptr, cu_q_ptr, lens_ptr, out_ptr, scale, head_dim,
                    stride_qt, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                    stride_tb, stride_ot, stride_oh,
                    PAGE: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """BLOCK_M queries of one sequence and one query head."""
    block, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq)
    n_q = tl.load(cu_q_ptr + seq + 1) - q_start
    if block * BLOCK_M >= n_q:
        return
    n_keys = tl.load(lens_ptr + seq)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q
    query_pos = n_keys - n_q + rows  # padding rows see every key, like the reference's: no empty softmax
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    token = (q_start + rows).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    key_hi = tl.minimum(n_keys, n_keys - n_q + (block + 1) * BLOCK_M)
    acc, _, denom = _attend(q, k_ptr, v_ptr, table_ptr + seq.to(tl.int64) * stride_tb, head // GROUP, 0, key_hi,
                            n_keys, query_pos, scale, d, d_ok,
                            stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                            PAGE, BLOCK_M, BLOCK_N, BLOCK_D, DOT_PRECISION)
    out = acc / denom[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


# One compile for every batch size: the lengths are an index row at an offset of the batch.
@triton.jit(do_not_specialize=["batch"], do_not_specialize_on_alignment=["lens_ptr"])
def _decode_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, part_ptr, lse_ptr, gate_ptr, batch, scale,
                   head_dim, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
                   stride_tb, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_gb,
                   stride_gh, KEYS_PER_SPLIT: tl.constexpr, SPLIT: tl.constexpr, PAGE: tl.constexpr,
                   GROUP: tl.constexpr, GATED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                   PDL: tl.constexpr = False):
    """One query head of one sequence over one split of its keys, in tiles of BLOCK_K keys.

    A single query row is a matrix-vector product: the scores are a row-wise sum of ``k * q`` and the
    output a column-wise sum of ``p * v`` on the CUDA cores (a tensor-core dot would pad the one row
    to 16 and, in fp32, spill its tiles). GATED: the grid also spans the padding rows past the batch."""
    pdl.begin(PDL)
    seq, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if seq >= batch:  # a padding row (GATED): zeros, written here or by the merge
        if not SPLIT:
            _store_output(out_ptr, seq.to(tl.int64), head, tl.zeros([BLOCK_D], dtype=tl.float32), gate_ptr,
                          stride_ob, stride_oh, stride_gb, stride_gh, head_dim, BLOCK_D, False)
        return
    n_keys = tl.load(lens_ptr + seq)
    key_lo = split * KEYS_PER_SPLIT
    if SPLIT:
        if key_lo >= n_keys:  # past the sequence's end: the merge reads only the splits its keys fill
            return
    key_hi = tl.minimum(n_keys, key_lo + KEYS_PER_SPLIT)
    kv_head = head // GROUP
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    seq64 = seq.to(tl.int64)
    table_row = table_ptr + seq64 * stride_tb
    q = tl.load(q_ptr + seq64 * stride_qb + head * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32) * scale
    running_max = tl.full([], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for first in range(key_lo, key_hi, BLOCK_K):
        pos = first + tl.arange(0, BLOCK_K)
        pos_ok = pos < key_hi
        k = _key_tile(k_ptr, table_row, pos, pos_ok, kv_head, d, d_ok, stride_kp, stride_ks, stride_kh, PAGE)
        scores = tl.where(pos_ok, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 0))  # finite: the tile holds key ``first``
        rescale = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max)
        denom = denom * rescale + tl.sum(probs, 0)
        v = _key_tile(v_ptr, table_row, pos, pos_ok, kv_head, d, d_ok, stride_vp, stride_vs, stride_vh, PAGE)
        acc = acc * rescale + tl.sum(probs[:, None] * v.to(tl.float32), 0)
        running_max = new_max
    out = acc / tl.where(denom > 0, denom, 1.0)
    if SPLIT:
        tl.store(part_ptr + seq64 * stride_pb + head * stride_ph + split * stride_ps + d, out, mask=d_ok)
        lse = tl.where(denom > 0, running_max + tl.log(tl.where(denom > 0, denom, 1.0)), float("-inf"))
        tl.store(lse_ptr + seq64 * stride_lb + head * stride_lh + split, lse)
    else:
        _store_output(out_ptr, seq64, head, out, gate_ptr, stride_ob, stride_oh, stride_gb, stride_gh, head_dim,
                      BLOCK_D, GATED)


@triton.jit
def _store_output(out_ptr, row, head, out, gate_ptr, stride_ob, stride_oh, stride_gb, stride_gh, head_dim,
                  BLOCK_D: tl.constexpr, GATED: tl.constexpr):
    """A head's output row, times ``sigmoid(gate)`` when GATED (``decode_rows.sigmoid_mul``'s arithmetic)."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    if GATED:
        gate = tl.load(gate_ptr + row * stride_gb + head * stride_gh + d, mask=d_ok, other=0.0).to(tl.float32)
        out = out * _sigmoid(gate)
    tl.store(out_ptr + row * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


@triton.jit(do_not_specialize=["batch"])
def _merge_splits_kernel(part_ptr, lse_ptr, lens_ptr, out_ptr, gate_ptr, batch, grid_splits, head_dim,
                         stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, stride_gb,
                         stride_gh, KEYS_PER_SPLIT: tl.constexpr, GATED: tl.constexpr, BLOCK_S: tl.constexpr,
                         BLOCK_D: tl.constexpr, PDL: tl.constexpr = False):
    """out = sum_s exp(lse_s - max) * part_s / sum_s exp(lse_s - max) over the splits the sequence's keys fill (the
    rest of the grid's splits wrote nothing): a short sequence costs a pass or two whatever the table's capacity."""
    pdl.begin(PDL)
    seq, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if seq >= batch:  # a padding row (GATED)
        _store_output(out_ptr, seq, head, tl.zeros([BLOCK_D], dtype=tl.float32), gate_ptr, stride_ob, stride_oh,
                      stride_gb, stride_gh, head_dim, BLOCK_D, False)
        return
    n_splits = tl.minimum(tl.cdiv(tl.load(lens_ptr + seq), KEYS_PER_SPLIT), grid_splits)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    parts = part_ptr + seq * stride_pb + head * stride_ph + d
    lses = lse_ptr + seq * stride_lb + head * stride_lh
    s = tl.arange(0, BLOCK_S)
    all_lse = tl.load(lses + s, mask=s < n_splits, other=float("-inf"))
    max_lse = tl.max(all_lse, 0)  # finite: split 0 holds key 0
    weight_sum = tl.sum(tl.exp(all_lse - max_lse), 0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for split in range(n_splits):
        weight = tl.exp(tl.load(lses + split) - max_lse)
        acc += weight * tl.load(parts + split * stride_ps, mask=d_ok, other=0.0)
    _store_output(out_ptr, seq, head, acc / weight_sum, gate_ptr, stride_ob, stride_oh, stride_gb, stride_gh,
                  head_dim, BLOCK_D, GATED)


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache, v_cache, slot_ptr, n_heads, head_dim,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kp, stride_ks, stride_kch, stride_vp, stride_vs, stride_vch,
                     PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Row i of k/v [N, Hkv, D] into position ``slot % PAGE`` of page ``slot // PAGE``."""
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + i).to(tl.int64)
    page, offset = slot // PAGE, slot % PAGE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < head_dim)
    k = tl.load(k_ptr + i * stride_kt + h * stride_kh + d, mask=mask)
    tl.store(k_cache + page * stride_kp + offset * stride_ks + h * stride_kch + d, k.to(k_cache.dtype.element_ty),
             mask=mask)
    v = tl.load(v_ptr + i * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(v_cache + page * stride_vp + offset * stride_vs + h * stride_vch + d, v.to(v_cache.dtype.element_ty),
             mask=mask)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, head_dim: int, hq: int | None = None,
                 dtype: torch.dtype | None = None) -> None:
    if dtype is not None and not dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(f"q and the caches must share one dtype; got {dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache and v_cache must both be [n_pages, page_size, Hkv, {head_dim}]; got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("k_cache and v_cache need a contiguous last (head_dim) dimension")
    if hq is not None and hq % k_cache.shape[2]:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={k_cache.shape[2]}")


def _check_table(page_table: torch.Tensor, seq_lens: torch.Tensor, batch: int) -> None:
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32 [{batch}, max_pages]; got {page_table.dtype} "
                         f"{tuple(page_table.shape)}")
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be [{batch}]; got {tuple(seq_lens.shape)}")


def _tuning(block_d: int, element_size: int) -> dict:
    """Warps and pipeline depth: two K/V tiles per stage must fit in shared memory (~160 KiB of it)."""
    tile_bytes = BLOCK_N * block_d * element_size
    return {"num_warps": 8 if block_d >= 128 else 4, "num_stages": max(1, min(3, (160 << 10) // (2 * tile_bytes)))}


def write_kv_pages(*, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Write rows ``k``/``v`` [N, Hkv, D] into their pages; mutates the caches.

    ``slot_mapping`` [N] (int32/int64): ``page * page_size + offset`` of each row, where position p
    of sequence b has page ``page_table[b, p // page_size]`` and offset ``p % page_size``. Rows
    must name distinct slots.
    """
    _check_cache(k_cache, v_cache, k.shape[-1])
    if k.dim() != 3 or k.shape != v.shape or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k and v must both be [N, {k_cache.shape[2]}, {k_cache.shape[3]}]; got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.shape != (k.shape[0],) or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError(f"slot_mapping must be [{k.shape[0]}] and k, v contiguous in head_dim")
    if not k.shape[0]:
        return
    _write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping, k.shape[1], k.shape[2], k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
        PAGE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(k.shape[1]),
        BLOCK_D=triton.next_power_of_2(k.shape[2]))


def paged_prefill_attention(*, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            page_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                            max_seqlen_q: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention of packed new queries q [Tq, Hq, D] (offsets ``cu_seqlens_q``) over their pages.

    Sequence b's queries are positions ``seq_lens[b] - n_q .. seq_lens[b] - 1``; their keys must
    already be in the pages. ``max_seqlen_q`` (host int) bounds the queries of one sequence.
    Returns [Tq, Hq, D] in q's dtype; equals ``attention_with_prefix`` on ``gather_pages``.
    """
    hq, head_dim = q.shape[1], q.shape[2]
    _check_cache(k_cache, v_cache, head_dim, hq, q.dtype)
    batch = cu_seqlens_q.numel() - 1
    _check_table(page_table, seq_lens, batch)
    if q.stride(2) != 1:
        raise ValueError("q needs a contiguous last (head_dim) dimension")
    out = torch.empty_like(q)
    if not q.shape[0] or not batch:
        return out
    scale = head_dim**-0.5 if scale is None else scale
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m = 64 if block_d * q.element_size() <= 512 else 32
    grid = (triton.cdiv(max_seqlen_q, block_m), batch, hq)
    _prefill_kernel[grid](
        q, k_cache, v_cache, page_table, upload(cu_seqlens_q, q.device), upload(seq_lens, q.device), out, scale, head_dim,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], page_table.stride(0),
        out.stride(0), out.stride(1),
        PAGE=k_cache.shape[1], GROUP=hq // k_cache.shape[2], BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(q.dtype), **_tuning(block_d, k_cache.element_size()))
    return out


def paged_decode_attention(*, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                           keys_per_split: int | None = DEFAULT_KEYS_PER_SPLIT, max_seq_len: int | None = None,
                           gate: torch.Tensor | None = None, rows: int | None = None,
                           out_dtype: torch.dtype | None = None, tile: DecodeTile = DECODE_TILE) -> torch.Tensor:
    """One query per sequence, q [B, Hq, D] at position ``seq_lens[b] - 1`` (>= 0), over its pages.

    ``keys_per_split``: positions per split (a multiple of 64), or None for one pass per sequence.
    ``max_seq_len`` (host int) bounds ``seq_lens`` to size the split grid; default: the page
    table's capacity. Returns [B, Hq, D] in q's dtype.

    With ``gate`` [B, Hq, D] (any row and head strides; a view of the fused projection) the same launches apply a
    gated attention's output gate and lay the result out for the next projection: returns
    ``out * sigmoid(gate)`` as [``rows``, Hq * D] in ``out_dtype``, the rows past B zero (``sigmoid_mul``'s bits).
    ``tile``: the kernel's key tile and launch (``benchmarks/decode_attention.py`` times them).
    """
    batch, hq, head_dim = q.shape
    _check_cache(k_cache, v_cache, head_dim, hq, q.dtype)
    _check_table(page_table, seq_lens, batch)
    if keys_per_split is not None and (keys_per_split < BLOCK_N or keys_per_split % BLOCK_N):
        raise ValueError(f"keys_per_split={keys_per_split} must be None or a positive multiple of {BLOCK_N}")
    if q.stride(2) != 1:
        raise ValueError("q needs a contiguous last (head_dim) dimension")
    gated = gate is not None
    if gated and (tuple(gate.shape) != (batch, hq, head_dim) or gate.stride(2) != 1 or rows is None or rows < batch
                  or out_dtype is None):
        raise ValueError(f"gate must be [{batch}, {hq}, {head_dim}] with a contiguous last dimension, with rows >= "
                         f"{batch} and out_dtype; got {tuple(gate.shape)} strides {gate.stride()}, rows={rows}, "
                         f"out_dtype={out_dtype}")
    if not gated and (rows is not None or out_dtype is not None):
        raise ValueError("rows and out_dtype lay out a gated output: pass them with gate")
    out = q.new_empty(rows, hq * head_dim, dtype=out_dtype) if gated else torch.empty_like(q)
    grid_rows = rows if gated else batch
    if not grid_rows:
        return out
    scale = head_dim**-0.5 if scale is None else scale
    capacity = page_table.shape[1] * k_cache.shape[1] if max_seq_len is None else max_seq_len
    span = triton.cdiv(max(capacity, 1), BLOCK_N) * BLOCK_N if keys_per_split is None else keys_per_split
    n_splits = triton.cdiv(max(capacity, 1), span)
    group = hq // k_cache.shape[2]
    split = n_splits > 1
    part = q.new_empty((batch, hq, n_splits, head_dim), dtype=torch.float32) if split else out
    lse = q.new_empty((batch, hq, n_splits), dtype=torch.float32) if split else out
    block_d = max(16, triton.next_power_of_2(head_dim))
    lens = upload(seq_lens, q.device)
    out_strides = (out.stride(0), head_dim) if gated else (out.stride(0), out.stride(1))
    part_strides = (*part.stride()[:3], *lse.stride()[:2]) if split else (0,) * 5  # unused without splits
    gate_args = (gate, gate.stride(0), gate.stride(1)) if gated else (out, 0, 0)
    _decode_kernel[(grid_rows, hq, n_splits)](
        q, k_cache, v_cache, page_table, lens, out, part, lse, gate_args[0], batch, scale, head_dim,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], page_table.stride(0),
        *out_strides, *part_strides, *gate_args[1:],
        KEYS_PER_SPLIT=span, SPLIT=split, PAGE=k_cache.shape[1], GROUP=group, GATED=gated, BLOCK_K=tile.block_k,
        BLOCK_D=block_d, num_warps=tile.num_warps, num_stages=tile.num_stages, **pdl.options())
    if split:
        _merge_splits_kernel[(grid_rows, hq)](
            part, lse, lens, out, gate_args[0], batch, n_splits, head_dim, *part_strides, *out_strides,
            *gate_args[1:], KEYS_PER_SPLIT=span, GATED=gated,
            BLOCK_S=triton.next_power_of_2(n_splits), BLOCK_D=block_d, **pdl.options())
    return out
