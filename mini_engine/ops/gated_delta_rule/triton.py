"""Triton kernels for the gated delta rule, held to ``reference.py`` (the specification).

Prefill (``chunk_gated_delta_rule_triton``) runs in three launches over a packed varlen batch:

1. ``_solve_chunk_kernel``, one program (one warp) per (chunk, value head), in 16-row blocks of the
   64-token chunk read straight from memory: the within-chunk cumulative log-decay ``gc`` (each block's
   cumsum plus the gates of the blocks before it); the ten blocks ``L_ij``, ``j <= i``, of the strictly-lower
   system ``L = beta_i (k_i k_j^T) exp(gc_i - gc_j)`` as [16, 16] dots (exp only where the entry is used);
   and ``X = (I + L)^-1``: each diagonal block by forward substitution, the six below by block substitution
   with small float32 dots. ``X`` goes to a scratch [T, Hv, 64] buffer (blocks above the diagonal and rows
   past the end are neither written nor read).
2. ``_wy_scores_kernel``, one program (four warps) per (chunk, value head), with whole-chunk dots: the
   causal scores ``aqk = scale * (q k^T) * exp(gc_i - gc_j)`` for ``i >= j``, and with ``X`` read back as
   a [64, 64] tile the UT transform ``w = X (k * beta * exp(gc))``, ``u = X (v * beta)``.
   Two launches because the halves want different shapes: [16, 16] tiles on four warps are replicated
   and every substitution step crosses warps, while the 64-row products want a warp group.
3. ``_state_output_kernel``, one program per (V tile, sequence, value head), walks its sequence's
   chunks in order with the state tile [K, BV] in registers::

       v_new = u - w S
       o     = scale * exp(gc) * (q S) + aqk v_new
       S     = exp(gc_last) * S + k^T (exp(gc_last - gc) * v_new)

   It writes the output, the state after every full chunk (the x64 boundary states) and the final
   state, reading the initial state from a tensor or from slot-pool rows, and writing the final
   state back into those pool rows in place.

Where the chunks and boundary states of a packed batch lie (lengths 130, 64, 1)::

    packed rows   | seq 0: rows 0..129         | seq 1: 130..193 | seq 2: 194 |
    chunks        | c0: 64 | c1: 64 | c2: 2    | c3: 64          | c4: 1      |
    boundary rows | b0     | b1     |          | b2              |            |
    first_boundary: seq 0 -> 0, seq 1 -> 2, seq 2 -> 3 (no full chunk: none of its own)

The decode kernels (one token per sequence, on states in the slot pool) are in ``triton_decode.py``.

Precision: states, decays and every accumulation are float32. With bf16/fp16 inputs the ``tl.dot``
operands (``k``, ``q``, ``X``, ``w``, ``u``, ``aqk``, the state, ``v_new``) are rounded to the input dtype,
as in flash-linear-attention, while the inverse's block products stay float32; with float32 inputs every
dot is 3xTF32 (``mini_engine.ops.precision``: float32's accuracy on the tensor cores; never plain TF32).
"""

from __future__ import annotations

import functools
from itertools import accumulate
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.device import row_indices, upload
from mini_engine.ops.gated_delta_rule.launch import LaunchConfig, check_head_sizes, check_pool, v_tiles
from mini_engine.ops.gated_delta_rule.reference import CHUNK, GdnResult, _check_inputs
from mini_engine.ops.precision import FP32_DOT

__all__ = ["LaunchConfig", "chunk_gated_delta_rule_triton"]

if CHUNK != 64:
    raise ImportError("the Triton kernels solve 64-row chunks as four 16-row blocks; CHUNK must be 64")

# ----------------------------------------------------------------------------- prepare (per chunk)


_FP32_DOT = tl.constexpr(FP32_DOT)


@triton.jit
def _dot(a, b):
    """Float32 operands multiply as ``FP32_DOT`` (3xTF32, never plain TF32); 16-bit ones accumulate in float32."""
    return tl.dot(a, b, input_precision=_FP32_DOT)


@triton.jit
def _dot_acc(a, b, acc):
    """acc + a b, as ``_dot``."""
    return tl.dot(a, b, acc, input_precision=_FP32_DOT)


@triton.jit
def _block_rows(ptr, row0, B: tl.constexpr, n, row_stride, D: tl.constexpr):
    """Rows 16B .. 16B + 15 of the chunk as a [16, D] tile, zero past the sequence's end."""
    r = B * 16 + tl.arange(0, 16)
    return tl.load(ptr + (row0 + r)[:, None] * row_stride + tl.arange(0, D)[None, :], mask=(r < n)[:, None],
                   other=0.0)


@triton.jit
def _store_block_rows(ptr, row0, B: tl.constexpr, n, row_stride, value):
    r = B * 16 + tl.arange(0, 16)
    offsets = (row0 + r)[:, None] * row_stride + tl.arange(0, value.shape[1])[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=(r < n)[:, None])


@triton.jit
def _block_values(ptr, row0, B: tl.constexpr, n, row_stride):
    """One float32 value per row of block B (a gate, a beta), zero past the sequence's end."""
    r = B * 16 + tl.arange(0, 16)
    return tl.load(ptr + (row0 + r) * row_stride, mask=r < n, other=0.0).to(tl.float32)


@triton.jit
def _chunk_rows(ptr, row0, n, row_stride, D: tl.constexpr):
    """The chunk's 64 rows of one head as a [64, D] tile, zero past the sequence's end."""
    r = tl.arange(0, 64)
    return tl.load(ptr + (row0 + r)[:, None] * row_stride + tl.arange(0, D)[None, :], mask=(r < n)[:, None],
                   other=0.0)


@triton.jit
def _store_chunk_rows(ptr, row0, n, row_stride, D: tl.constexpr, value):
    r = tl.arange(0, 64)
    offsets = (row0 + r)[:, None] * row_stride + tl.arange(0, D)[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=(r < n)[:, None])


@triton.jit
def _system_block(kk, beta_i, gc_i, gc_j, DIAGONAL: tl.constexpr):
    """L_ij = beta_i k_i k_j^T exp(gc_i - gc_j); a diagonal block keeps its strictly-lower part only, and
    exp never sees the upper entries (their exponent may be positive: no inf * 0)."""
    r = tl.arange(0, 16)
    keep = (r[:, None] > r[None, :]) | (not DIAGONAL)
    decay = tl.exp(tl.where(keep, gc_i[:, None] - gc_j[None, :], 0.0))
    return tl.where(keep, kk * decay * beta_i[:, None], 0.0)


@triton.jit
def _invert_diagonal_blocks(l0, l1, l2, l3):
    """(I + l)^-1 of four strictly-lower [16, 16] blocks by forward substitution, the four chains in one loop.

    x = (I - m_14 e_14^T) ... (I - m_0 e_0^T), m_i column i of l: step i subtracts column i of l times
    row i of x (final by then) from x; a masked sum extracts each (exact: one nonzero term).
    """
    r = tl.arange(0, 16)
    x0 = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    x1, x2, x3 = x0, x0, x0
    for i in range(15):
        col, row = r[None, :] == i, r[:, None] == i
        x0 = x0 - tl.sum(tl.where(col, l0, 0.0), axis=1)[:, None] * tl.sum(tl.where(row, x0, 0.0), axis=0)[None, :]
        x1 = x1 - tl.sum(tl.where(col, l1, 0.0), axis=1)[:, None] * tl.sum(tl.where(row, x1, 0.0), axis=0)[None, :]
        x2 = x2 - tl.sum(tl.where(col, l2, 0.0), axis=1)[:, None] * tl.sum(tl.where(row, x2, 0.0), axis=0)[None, :]
        x3 = x3 - tl.sum(tl.where(col, l3, 0.0), axis=1)[:, None] * tl.sum(tl.where(row, x3, 0.0), axis=0)[None, :]
    return x0, x1, x2, x3


@triton.jit
def _solve_chunk_kernel(k, g, beta, gcum, inverse, chunk_row0, chunk_rows, HK, HV,
                        K: tl.constexpr, BK: tl.constexpr):
    chunk, h = tl.program_id(0), tl.program_id(1)
    hk = h // (HV // HK)
    row0 = tl.load(chunk_row0 + chunk).to(tl.int64)
    n = tl.load(chunk_rows + chunk)
    k, g, beta, gcum, inverse = k + hk * K, g + h, beta + h, gcum + h, inverse + h * 64

    # cumulative log-decay: each block's own cumsum plus the gates of the blocks before it
    g0, g1 = _block_values(g, row0, 0, n, HV), _block_values(g, row0, 1, n, HV)
    g2, g3 = _block_values(g, row0, 2, n, HV), _block_values(g, row0, 3, n, HV)
    gc0 = tl.cumsum(g0, axis=0)
    gc1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    gc2 = tl.cumsum(g2, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0))
    gc3 = tl.cumsum(g3, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0))
    r = tl.arange(0, 16)
    tl.store(gcum + (row0 + r) * HV, gc0, mask=r < n)
    tl.store(gcum + (row0 + 16 + r) * HV, gc1, mask=r + 16 < n)
    tl.store(gcum + (row0 + 32 + r) * HV, gc2, mask=r + 32 < n)
    tl.store(gcum + (row0 + 48 + r) * HV, gc3, mask=r + 48 < n)

    # k_i k_j^T for j <= i, [16, 16] blocks accumulated over BK-column slices of k
    l00 = tl.zeros([16, 16], dtype=tl.float32)
    l10, l11, l20, l21, l22, l30, l31, l32, l33 = l00, l00, l00, l00, l00, l00, l00, l00, l00
    for c in tl.static_range(0, K, BK):
        k0, k1 = _block_rows(k + c, row0, 0, n, HK * K, BK), _block_rows(k + c, row0, 1, n, HK * K, BK)
        k2, k3 = _block_rows(k + c, row0, 2, n, HK * K, BK), _block_rows(k + c, row0, 3, n, HK * K, BK)
        t0, t1, t2, t3 = tl.trans(k0), tl.trans(k1), tl.trans(k2), tl.trans(k3)
        l00 = _dot_acc(k0, t0, l00)
        l10, l11 = _dot_acc(k1, t0, l10), _dot_acc(k1, t1, l11)
        l20, l21, l22 = _dot_acc(k2, t0, l20), _dot_acc(k2, t1, l21), _dot_acc(k2, t2, l22)
        l30, l31, l32, l33 = _dot_acc(k3, t0, l30), _dot_acc(k3, t1, l31), _dot_acc(k3, t2, l32), _dot_acc(k3, t3, l33)
    b0, b1 = _block_values(beta, row0, 0, n, HV), _block_values(beta, row0, 1, n, HV)
    b2, b3 = _block_values(beta, row0, 2, n, HV), _block_values(beta, row0, 3, n, HV)
    l00, l11 = _system_block(l00, b0, gc0, gc0, True), _system_block(l11, b1, gc1, gc1, True)
    l22, l33 = _system_block(l22, b2, gc2, gc2, True), _system_block(l33, b3, gc3, gc3, True)
    l10, l20, l21 = _system_block(l10, b1, gc1, gc0, False), _system_block(l20, b2, gc2, gc0, False), \
        _system_block(l21, b2, gc2, gc1, False)
    l30, l31, l32 = _system_block(l30, b3, gc3, gc0, False), _system_block(l31, b3, gc3, gc1, False), \
        _system_block(l32, b3, gc3, gc2, False)

    # X = (I + L)^-1 in blocks: diagonal ones by substitution, x_ij = -x_ii sum_{j <= m < i} l_im x_mj below
    x00, x11, x22, x33 = _invert_diagonal_blocks(l00, l11, l22, l33)
    x10 = -_dot(x11, _dot(l10, x00))
    x21 = -_dot(x22, _dot(l21, x11))
    x32 = -_dot(x33, _dot(l32, x22))
    x20 = -_dot(x22, _dot_acc(l21, x10, _dot(l20, x00)))
    x31 = -_dot(x33, _dot_acc(l32, x21, _dot(l31, x11)))
    x30 = -_dot(x33, _dot_acc(l32, x20, _dot_acc(l31, x10, _dot(l30, x00))))
    row_stride = HV * 64
    _store_block_rows(inverse, row0, 0, n, row_stride, x00)
    _store_block_rows(inverse, row0, 1, n, row_stride, x10)
    _store_block_rows(inverse + 16, row0, 1, n, row_stride, x11)
    _store_block_rows(inverse, row0, 2, n, row_stride, x20)
    _store_block_rows(inverse + 16, row0, 2, n, row_stride, x21)
    _store_block_rows(inverse + 32, row0, 2, n, row_stride, x22)
    _store_block_rows(inverse, row0, 3, n, row_stride, x30)
    _store_block_rows(inverse + 16, row0, 3, n, row_stride, x31)
    _store_block_rows(inverse + 32, row0, 3, n, row_stride, x32)
    _store_block_rows(inverse + 48, row0, 3, n, row_stride, x33)


@triton.jit
def _wy_scores_kernel(q, k, v, beta, gcum, inverse, w, u, aqk, chunk_row0, chunk_rows, scale, HK, HV,
                      K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    chunk, h = tl.program_id(0), tl.program_id(1)
    hk = h // (HV // HK)
    row0 = tl.load(chunk_row0 + chunk).to(tl.int64)
    n = tl.load(chunk_rows + chunk)
    r = tl.arange(0, 64)
    gc = tl.load(gcum + (row0 + r) * HV + h, mask=r < n, other=0.0)
    betas = tl.load(beta + (row0 + r) * HV + h, mask=r < n, other=0.0).to(tl.float32)
    causal = r[:, None] >= r[None, :]
    k_c = _chunk_rows(k + hk * K, row0, n, HK * K, K)
    q_c = _chunk_rows(q + hk * K, row0, n, HK * K, K)
    decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0))
    scores = tl.where(causal, _dot(q_c, tl.trans(k_c)) * decay, 0.0) * scale
    _store_chunk_rows(aqk + h * 64, row0, n, HV * 64, 64, scores)
    x = tl.load(inverse + h * 64 + (row0 + r)[:, None] * (HV * 64) + r[None, :], mask=(r < n)[:, None] & causal,
                other=0.0)
    k_scale = betas * tl.exp(gc)
    for c in tl.static_range(0, K, BK):
        k_gated = (_chunk_rows(k + hk * K + c, row0, n, HK * K, BK) * k_scale[:, None]).to(x.dtype)
        _store_chunk_rows(w + h * K + c, row0, n, HV * K, BK, _dot(x, k_gated))
    for c in tl.static_range(0, V, BV):
        v_beta = (_chunk_rows(v + h * V + c, row0, n, HV * V, BV) * betas[:, None]).to(x.dtype)
        _store_chunk_rows(u + h * V + c, row0, n, HV * V, BV, _dot(x, v_beta))


# ----------------------------------------------------------------------------- state walk (per sequence)


@triton.jit
def _chunk_step(state, q, k, w, u, aqk, gcum, out, rows, valid, last_row, cols, scale, HK, HV,
                K: tl.constexpr, V: tl.constexpr):
    """Output rows of one chunk from the state at its start; returns the state at its end."""
    r = tl.arange(0, 64)
    kk = tl.arange(0, K)
    gc = tl.load(gcum + rows * HV, mask=valid, other=0.0)
    gc_last = tl.load(gcum + last_row * HV)
    w_c = tl.load(w + rows[:, None] * (HV * K) + kk[None, :], mask=valid[:, None], other=0.0)
    u_c = tl.load(u + rows[:, None] * (HV * V) + cols[None, :], mask=valid[:, None], other=0.0)
    state_in = state.to(w_c.dtype)
    v_new = u_c.to(tl.float32) - _dot(w_c, state_in)
    q_c = tl.load(q + rows[:, None] * (HK * K) + kk[None, :], mask=valid[:, None], other=0.0)
    a_c = tl.load(aqk + rows[:, None] * (HV * 64) + r[None, :], mask=valid[:, None], other=0.0)
    o = _dot(q_c, state_in) * (scale * tl.exp(gc))[:, None] + _dot(a_c, v_new.to(a_c.dtype))
    tl.store(out + rows[:, None] * (HV * V) + cols[None, :], o.to(out.dtype.element_ty), mask=valid[:, None])
    k_c = tl.load(k + rows[:, None] * (HK * K) + kk[None, :], mask=valid[:, None], other=0.0)
    v_decayed = tl.where(valid[:, None], v_new * tl.exp(gc_last - gc)[:, None], 0.0)
    return state * tl.exp(gc_last) + _dot(tl.trans(k_c), v_decayed.to(k_c.dtype))


@triton.jit
def _state_output_kernel(q, k, w, u, aqk, gcum, out, seq_row0, seq_len, seq_first_boundary,
                         init, init_rows, init_slot_stride, final, boundary, scale, HK, HV,
                         K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                         HAS_INIT: tl.constexpr, WRITE_BACK: tl.constexpr):
    vt, s, h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
    hk = h // (HV // HK)
    row0 = tl.load(seq_row0 + s).to(tl.int64)
    n = tl.load(seq_len + s)
    first_boundary = tl.load(seq_first_boundary + s).to(tl.int64)
    slot = tl.load(init_rows + s).to(tl.int64)
    kk = tl.arange(0, K)
    cols = vt * BV + tl.arange(0, BV)
    tile = (h * K + kk[:, None]).to(tl.int64) * V + cols[None, :]
    state_size = HV * K * V
    if HAS_INIT:
        state = tl.load(init + slot * init_slot_stride + tile).to(tl.float32)
    else:
        state = tl.zeros([K, BV], dtype=tl.float32)
    q, k = q + hk * K, k + hk * K
    w, u, aqk, gcum, out = w + h * K, u + h * V, aqk + h * 64, gcum + h, out + h * V
    whole_tile = (kk[:, None] < K) & (cols[None, :] < V)
    for c in range(0, tl.cdiv(n, 64)):
        start = c * 64
        rows = row0 + start + tl.arange(0, 64)
        valid = start + tl.arange(0, 64) < n
        last_row = row0 + tl.minimum(n, start + 64) - 1
        state = _chunk_step(state, q, k, w, u, aqk, gcum, out, rows, valid, last_row, cols, scale, HK, HV,
                            K, V)
        tl.store(boundary + (first_boundary + c) * state_size + tile, state, mask=whole_tile & (start + 64 <= n))
    tl.store(final + s * state_size + tile, state)
    if WRITE_BACK:
        tl.store(init + slot * init_slot_stride + tile, state.to(init.dtype.element_ty))


# ----------------------------------------------------------------------------- host side


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _default_walk_config(heads: int, v_dim: int, device: torch.device, dtype: torch.dtype) -> LaunchConfig:
    """The widest V tile that still gives one sequence of ``heads`` value heads about one program per SM (the
    walk is sequential per tile). By the shape alone, never the batch: the tile changes the dots' shapes, and
    nothing promises every shape the same bits, so a sequence in a pack gets what it gets alone.

    16-bit inputs: V tiles of at most 32 with three pipeline stages (measured on the H200, 1 x 16384 and
    16 x 1024 bf16: 32/4 warps/3 stages beat 64/8/2 and 32/4/2 by 10-20 %). float32 inputs keep two stages:
    three need more shared memory than the H200 has (262,664 bytes asked, 232,448 there)."""
    if device.type != "cuda":
        return LaunchConfig(block_v=min(64, v_dim))
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    *wider, narrowest = walk_configs(dtype)
    for config in wider:
        if config.block_v <= v_dim and heads * (v_dim // config.block_v) >= sms * 3 // 4:
            return config
    return narrowest


def walk_configs(dtype: torch.dtype) -> list[LaunchConfig]:
    """Every configuration ``_default_walk_config`` picks from on a GPU for inputs of ``dtype``, widest first."""
    wide = dtype == torch.float32
    stages = 2 if wide else 3
    return [*(LaunchConfig(block_v=block_v, num_warps=num_warps, num_stages=stages)
              for block_v, num_warps in ((64, 8), (32, 4)) if wide or block_v <= 32),
            LaunchConfig(block_v=16, num_stages=stages)]


class _ChunkPlan(NamedTuple):
    """Where each chunk starts and how many of its 64 rows are real; where each sequence's boundary states go."""

    chunk_row0: list[int]
    chunk_rows: list[int]
    seq_first_boundary: list[int]
    full_chunks: list[int]


def _plan_chunks(starts: list[int], lengths: list[int]) -> _ChunkPlan:
    chunk_row0 = [lo + c for lo, n in zip(starts, lengths) for c in range(0, n, CHUNK)]
    chunk_rows = [min(CHUNK, n - c) for n in lengths for c in range(0, n, CHUNK)]
    full = [n // CHUNK for n in lengths]
    return _ChunkPlan(chunk_row0, chunk_rows, [0, *accumulate(full)][:-1], full)


_TABLE_ALIGN = 4  # int32s: every table starts 16 bytes into the upload, as Triton's pointer specialisation wants


@functools.lru_cache(maxsize=64)
def _chunk_tables(cu_seqlens: tuple[int, ...], device: torch.device) -> tuple[_ChunkPlan, tuple[torch.Tensor, ...]]:
    """The plan of a packed batch and its int32 tables on the device (chunk_row0, chunk_rows, seq_row0, seq_len,
    seq_first_boundary), uploaded once per batch layout (every layer of a forward, and every decode step of one
    batch size, reuses them; kernels only read them). Each table starts on a 16-byte boundary: a pointer's
    alignment is part of a Triton kernel's compile key, so any layout reuses the compiled kernels."""
    starts, lengths = list(cu_seqlens[:-1]), [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])]
    plan = _plan_chunks(starts, lengths)
    parts = (plan.chunk_row0, plan.chunk_rows, starts, lengths, plan.seq_first_boundary)
    widths = [-(-len(p) // _TABLE_ALIGN) * _TABLE_ALIGN for p in parts]
    tables = upload(torch.tensor([v for p, w in zip(parts, widths) for v in (*p, *[0] * (w - len(p)))],
                                 dtype=torch.int32), device)
    return plan, tuple(t[: len(p)] for t, p in zip(tables.split(widths), parts))


class _Prepared(NamedTuple):
    """What the prepare kernels leave for the walk, per packed row and value head."""

    gcum: torch.Tensor  # [T, Hv] float32, cumulative log-decay within the row's chunk
    w: torch.Tensor  # [T, Hv, K]
    u: torch.Tensor  # [T, Hv, V]
    aqk: torch.Tensor  # [T, Hv, 64], scaled causal scores within the chunk


def _prepare_chunks(q, k, v, g, beta, chunk_row0, chunk_rows, scale: float) -> _Prepared:
    total, hk, k_dim = q.shape
    hv, v_dim = v.shape[1], v.shape[2]
    prepared = _Prepared(torch.empty(total, hv, device=q.device, dtype=torch.float32),
                         q.new_empty(total, hv, k_dim), q.new_empty(total, hv, v_dim), q.new_empty(total, hv, CHUNK))
    if chunk_row0.numel():
        grid = (chunk_row0.numel(), hv)
        inverse = q.new_empty(total, hv, CHUNK)  # X of each chunk's rows; blocks above the diagonal stay unwritten
        _solve_chunk_kernel[grid](k, g, beta, prepared.gcum, inverse, chunk_row0, chunk_rows, hk, hv, K=k_dim,
                                  BK=min(k_dim, 64), num_warps=1)
        _wy_scores_kernel[grid](q, k, v, beta, prepared.gcum, inverse, prepared.w, prepared.u, prepared.aqk,
                                chunk_row0, chunk_rows, scale, hk, hv, K=k_dim, V=v_dim, BK=min(k_dim, 64),
                                BV=min(v_dim, 64), num_warps=4)
    return prepared


def _initial_source(initial_state, state_pool, state_indices, n_seq: int, state_shape: tuple, device):
    """(tensor to read initial states from, its row per sequence) or (None, None) for zero states."""
    if state_pool is not None:
        if initial_state is not None:
            raise ValueError("give initial_state or state_pool (with state_indices), not both")
        check_pool(state_pool, state_indices, n_seq, state_shape)
        return state_pool, upload(state_indices.to(torch.int32), device)
    if initial_state is not None:  # read in place when each sequence's state is contiguous (rows may be strided)
        _, _, k_dim, v_dim = initial_state.shape
        whole = initial_state.stride()[1:] == (k_dim * v_dim, v_dim, 1)
        return (initial_state if whole else initial_state.contiguous()), row_indices(n_seq, device)
    return None, None


def _boundary_buffer(boundary_out, rows: int, state_shape: tuple, device) -> torch.Tensor:
    shape = (rows, *state_shape)
    if boundary_out is None:
        return torch.empty(shape, device=device, dtype=torch.float32)
    if tuple(boundary_out.shape) != shape or boundary_out.dtype != torch.float32 or not boundary_out.is_contiguous():
        raise ValueError(f"boundary_out must be a contiguous float32 tensor of shape {shape} (one row per full "
                         f"chunk); got {tuple(boundary_out.shape)} {boundary_out.dtype}")
    return boundary_out


def chunk_gated_delta_rule_triton(
    *, q, k, v, g, beta, cu_seqlens, initial_state=None, scale: float | None = None,
    state_pool=None, state_indices=None, boundary_out=None, config: LaunchConfig | None = None,
) -> GdnResult:
    """Chunked prefill of a packed varlen batch; same contract and result as ``reference.chunk_gated_delta_rule``.

    The initial states come from ``initial_state`` [B, Hv, K, V], or from rows ``state_indices`` [B]
    of ``state_pool`` [slots, Hv, K, V] (distinct rows), which then receive the final states in place.
    ``boundary_out``, if given, is a float32 [sum(len // 64), Hv, K, V] tensor that receives the
    boundary states, sequence after sequence; the returned ``boundary_states`` are views into it.
    ``output`` has v's dtype; the states are float32. ``cu_seqlens`` is read on the host: keep it
    there (a device tensor costs a synchronisation).
    """
    state_shape = _check_inputs(q, k, v, g, beta, cu_seqlens, initial_state)
    n_seq, hv, k_dim, v_dim = state_shape
    check_head_sizes(k_dim, v_dim, q.dtype)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    config = config or _default_walk_config(hv, v_dim, q.device, q.dtype)
    scale = k_dim**-0.5 if scale is None else scale
    plan, (chunk_row0, chunk_rows, seq_row0, seq_len, seq_first_boundary) = _chunk_tables(
        tuple(cu_seqlens.tolist()), q.device)
    source, source_rows = _initial_source(initial_state, state_pool, state_indices, n_seq, state_shape[1:], q.device)
    boundary = _boundary_buffer(boundary_out, sum(plan.full_chunks), state_shape[1:], q.device)
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    prepared = _prepare_chunks(q, k, v, g, beta, chunk_row0, chunk_rows, scale)
    final = torch.empty(state_shape, device=q.device, dtype=torch.float32)
    out = torch.empty_like(v)
    init, init_rows = (final, seq_len) if source is None else (source, source_rows)  # (unread placeholders)
    if n_seq:
        _state_output_kernel[(v_tiles(config, v_dim), n_seq, hv)](
            q, k, prepared.w, prepared.u, prepared.aqk, prepared.gcum, out, seq_row0, seq_len, seq_first_boundary,
            init, init_rows, init.stride(0), final, boundary if boundary.numel() else final, scale,
            q.shape[1], hv, K=k_dim, V=v_dim, BV=config.block_v, HAS_INIT=source is not None,
            WRITE_BACK=state_pool is not None, num_warps=config.num_warps, num_stages=config.num_stages)
    firsts = plan.seq_first_boundary
    return GdnResult(out, final, [boundary[f : f + n] for f, n in zip(firsts, plan.full_chunks)])
