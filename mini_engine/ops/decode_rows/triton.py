"""Triton kernels for the per-row pieces of a decode step, held to ``reference.py``.

Each replaces a chain of small torch ops (a norm is five, a RoPE fifteen) by one launch over the
batch's rows, so a CUDA-graphed decode step costs about a dozen launches per layer. Every kernel
reads a row's inputs and writes that row's outputs only, in float32: a sequence's result does not
depend on the rest of the batch. Rows past the batch in a padded output are written as zeros.

The step's gemm for 16-bit weights is ``gemm.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from mini_engine.ops import pdl
from mini_engine.ops.causal_conv1d.triton import _activate, _tap, _window

__all__ = ["Parts", "add_rms_norm", "conv_gdn_rows", "gated_rms_norm", "gdn_rows", "qk_norm_rope", "sigmoid_mul",
           "silu_mul"]

_SOFTPLUS_THRESHOLD = 20.0  # as torch and ``inv.softplus``


class Parts(NamedTuple):
    """A split gemm's output before its K parts are added (``gemm.linear(unsummed=True)``): what reads it adds them."""

    sums: torch.Tensor  # [split, rows, cols] float32: part k's partial products
    dtype: torch.dtype  # the dtype their sum is rounded to (the gemm's output dtype)


_TRITON_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit(do_not_specialize=["live"])  # one compile for every batch size
def _add_rms_norm_kernel(x, delta, weight, out, n_cols, x_stride, delta_stride, part_stride, out_stride, eps, live,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PARTS: tl.constexpr = 0,
                         PART_DTYPE: tl.constexpr = tl.float32, PDL: tl.constexpr = False):
    """Row ``row``; rows from ``live`` on are padding: their output is zeros, and nothing of theirs is read. With
    PARTS > 0 ``delta`` is a split gemm's float32 K parts (``part_stride`` apart), added here as the gemm's own sum
    adds them (``gemm._sum_parts_kernel``: in order 0, 1, ..., rounded to PART_DTYPE), so the same bits."""
    pdl.begin(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    if row >= live:
        tl.store(out + row * out_stride + cols, tl.zeros([BLOCK], out.dtype.element_ty), mask=ok)
        return
    value = tl.load(x + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        change = tl.load(delta + row * delta_stride + cols, mask=ok, other=0.0)
        if PARTS > 0:
            for part in tl.static_range(1, PARTS):
                change += tl.load(delta + part * part_stride + row * delta_stride + cols, mask=ok, other=0.0)
            change = change.to(PART_DTYPE)
        value += change.to(tl.float32)
        tl.store(x + row * x_stride + cols, value, mask=ok)
    normed = value * tl.rsqrt(tl.sum(value * value, axis=0) / n_cols + eps)
    scale = 1.0 + tl.load(weight + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + row * out_stride + cols, (normed * scale).to(out.dtype.element_ty), mask=ok)


@triton.jit
def _l2_normalize(value):
    return value * tl.rsqrt(tl.sum(value * value, axis=0) + 1e-6)


@triton.jit
def _softplus(x, threshold):
    """log(1 + exp(x)), accurate for small exp(x) too (log(u) * e / (u - 1), u = 1 + e: Goldberg's log1p)."""
    e = tl.exp(tl.minimum(x, threshold))
    u = 1.0 + e
    exact = u == 1.0
    small = tl.where(exact, e, tl.log(u) * e / tl.where(exact, 1.0, u - 1.0))
    return tl.where(x > threshold, x, small)


@triton.jit
def _key_head_row(q, k, j, dst, kept, KEY_DIM, DK: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Key head j's part of a prepared row: q and k (its conv outputs, float32 [DK]) L2-normalised."""
    kk = tl.arange(0, DK)
    q = _l2_normalize(q)
    k = _l2_normalize(k)
    tl.store(dst + j * DK + kk, q)
    tl.store(dst + KEY_DIM + j * DK + kk, k)
    if HAS_PENDING:
        tl.store(kept + j * DK + kk, q)
        tl.store(kept + KEY_DIM + j * DK + kk, k)


@triton.jit
def _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                    DV: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Value head h's part of row r: v (its conv outputs, float32 [DV]) as is, g and beta from its gate inputs."""
    vv = tl.arange(0, DV)
    x = tl.load(a + r * ab_stride + h).to(tl.float32) + tl.load(dt_bias + h).to(tl.float32)
    g = -tl.exp(tl.load(A_log + h).to(tl.float32)) * _softplus(x, threshold)
    beta = _sigmoid(tl.load(b + r * ab_stride + h).to(tl.float32))
    gates = 2 * KEY_DIM + VALUE_DIM
    tl.store(dst + 2 * KEY_DIM + h * DV + vv, v)
    tl.store(dst + gates + h, g)
    tl.store(dst + gates + HV + h, beta)
    if HAS_PENDING:
        tl.store(kept + 2 * KEY_DIM + h * DV + vv, v)
        tl.store(kept + gates + h, g)
        tl.store(kept + gates + HV + h, beta)


@triton.jit
def _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH,
                 HAS_PENDING: tl.constexpr):
    """Where row r goes: its row of ``out``, and its pending row (``out``'s again when there is none)."""
    dst = out + r * WIDTH
    kept = dst
    if HAS_PENDING:  # the same row also joins its slot's pending rows
        slot = tl.load(pending_slots + r).to(tl.int64)
        kept = pending + slot * pending_slot_stride + tl.load(pending_rows + r).to(tl.int64) * WIDTH
    return dst, kept


@triton.jit
def _gdn_rows_kernel(conv, conv_stride, a, b, ab_stride, A_log, dt_bias, out, pending, pending_slot_stride,
                     pending_slots, pending_rows, HK, HV, KEY_DIM, VALUE_DIM, WIDTH, threshold,
                     DK: tl.constexpr, DV: tl.constexpr, HAS_PENDING: tl.constexpr):
    """Program (row, j): j < HK normalises key head j's q and k; j >= HK copies value head j - HK and its gates."""
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    src = conv + r * conv_stride
    dst, kept = _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH, HAS_PENDING)
    if j < HK:
        kk = tl.arange(0, DK)
        q = tl.load(src + j * DK + kk).to(tl.float32)
        k = tl.load(src + KEY_DIM + j * DK + kk).to(tl.float32)
        _key_head_row(q, k, j, dst, kept, KEY_DIM, DK, HAS_PENDING)
    else:
        h = j - HK
        v = tl.load(src + 2 * KEY_DIM + h * DV + tl.arange(0, DV)).to(tl.float32)
        _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                        DV, HAS_PENDING)


@triton.jit
def _conv_window(x_row, w, w_stride, state_row, state_stride, c, WIDTH: tl.constexpr, BLOCK_W: tl.constexpr):
    """The decode conv of channels ``c`` through ``causal_conv1d``'s own tap and window helpers (its update kernel's
    arithmetic): returns (the SiLU output rounded to x's dtype, in float32; the new state, the window's last W - 1
    columns [C, BLOCK_W])."""
    every = c >= 0
    first = tl.zeros_like(c)  # window position of the single output's tap 0
    acc = _tap(0, x_row, 0, 1, 0, first, state_row, state_stride, 1, c, every, every, w, w_stride, 1, WIDTH, True)
    for i in tl.static_range(1, WIDTH):
        acc += _tap(i, x_row, 0, 1, 0, first, state_row, state_stride, 1, c, every, every, w, w_stride, 1, WIDTH, True)
    out = _activate(acc, True).to(x_row.dtype.element_ty).to(tl.float32)
    j = tl.arange(0, BLOCK_W)[None, :]
    tail = _window(x_row, 0, 1, 0, 1 + j, state_row, state_stride, 1, c[:, None], j < WIDTH - 1, WIDTH, True)
    return out, tail


@triton.jit(do_not_specialize_on_alignment=["pending_slots"])  # an index row at an offset of the batch
def _conv_gdn_rows_kernel(x, x_stride, w, w_stride, pool, slot_stride, state_stride, slots, a, b, ab_stride, A_log,
                          dt_bias, out, pending, pending_slot_stride, pending_slots, pending_rows, HK, HV, KEY_DIM,
                          VALUE_DIM, WIDTH, threshold, CONV_W: tl.constexpr, BLOCK_W: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, HAS_PENDING: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, j): the conv of key head j's q and k channels (j < HK) or of value head j - HK's channels, its
    slot's conv state advanced in place, and that head's part of the prepared row (``_gdn_rows_kernel``'s)."""
    pdl.begin(PDL)
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    x_row = x + r * x_stride
    state_row = pool + tl.load(slots + r).to(tl.int64) * slot_stride
    dst, kept = _row_targets(out, pending, pending_slot_stride, pending_slots, pending_rows, r, WIDTH, HAS_PENDING)
    cols = tl.arange(0, BLOCK_W)[None, :]
    keep = cols < CONV_W - 1
    state_type = pool.dtype.element_ty
    if j < HK:
        cq = j * DK + tl.arange(0, DK)
        ck = KEY_DIM + cq
        q, q_state = _conv_window(x_row, w, w_stride, state_row, state_stride, cq, CONV_W, BLOCK_W)
        k, k_state = _conv_window(x_row, w, w_stride, state_row, state_stride, ck, CONV_W, BLOCK_W)
        tl.debug_barrier()  # the whole old window is read before any of it is overwritten
        tl.store(state_row + cq[:, None] * state_stride + cols, q_state.to(state_type), mask=keep)
        tl.store(state_row + ck[:, None] * state_stride + cols, k_state.to(state_type), mask=keep)
        _key_head_row(q, k, j, dst, kept, KEY_DIM, DK, HAS_PENDING)
    else:
        h = j - HK
        cv = 2 * KEY_DIM + h * DV + tl.arange(0, DV)
        v, v_state = _conv_window(x_row, w, w_stride, state_row, state_stride, cv, CONV_W, BLOCK_W)
        tl.debug_barrier()
        tl.store(state_row + cv[:, None] * state_stride + cols, v_state.to(state_type), mask=keep)
        _value_head_row(v, h, r, a, b, ab_stride, A_log, dt_bias, dst, kept, KEY_DIM, VALUE_DIM, HV, threshold,
                        DV, HAS_PENDING)


@triton.jit(do_not_specialize=["batch"])  # one compile for every batch size
def _gated_rms_norm_kernel(core, z, z_stride, weight, out, out_stride, batch, HV, eps,
                           DV: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, value head); a padding row (past the batch) loads zeros and so stores zeros."""
    pdl.begin(PDL)
    r, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < DV
    live = ok & (r < batch)
    c = tl.load(core + (r * HV + h) * DV + cols, mask=live, other=0.0).to(tl.float32)
    gate = tl.load(z + r * z_stride + h * DV + cols, mask=live, other=0.0).to(tl.float32)
    w = tl.load(weight + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + h * DV + cols, _gated_norm(c, gate, w, eps, DV).to(out.dtype.element_ty), mask=ok)


@triton.jit
def _gated_norm(c, gate, w, eps, DV: tl.constexpr):
    """A value head's ``w * rmsnorm(c) * silu(gate)`` over its DV channels (lanes past DV hold zeros)."""
    normed = c * tl.rsqrt(tl.sum(c * c, axis=0) / DV + eps)
    return w * normed * (gate * _sigmoid(gate))


@triton.jit
def _page_offsets(kv_rows, r, h, d, page_stride, HKV, D: tl.constexpr, PAGE: tl.constexpr):
    """Element offsets of kv head h, channels d, at row r's cache position ``kv_rows[r]`` (page * PAGE + offset) of a
    [pages, PAGE, HKV, D] cache contiguous below the page."""
    kv_row = tl.load(kv_rows + r).to(tl.int64)
    return (kv_row // PAGE) * page_stride + ((kv_row % PAGE) * HKV + h) * D + d


@triton.jit(do_not_specialize_on_alignment=["positions"])  # an index row at an offset of the batch
def _qk_norm_rope_kernel(qkv, qkv_stride, positions, q_weight, k_weight, inv_freq, q_out, k_out, v_out, HQ, HKV,
                         eps, k_cache, v_cache, kv_rows, page_stride, D: tl.constexpr, ROTARY: tl.constexpr,
                         BLOCK_D: tl.constexpr, PAGE: tl.constexpr, TO_PAGES: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, j): j < HQ is query head j, else kv head j - HQ (its key normed and rotated, its value copied;
    with TO_PAGES both also stored at the row's position ``kv_rows[r]`` of the paged caches, as ``write_kv_pages``)."""
    pdl.begin(PDL)
    r, j = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    row = qkv + r * qkv_stride
    if j < HQ:
        src, weight, dst = row + j * 2 * D, q_weight, q_out + (r * HQ + j) * D
    else:
        h = j - HQ
        src, weight, dst = row + HQ * 2 * D + h * D, k_weight, k_out + (r * HKV + h) * D
        value = tl.load(src + HKV * D + d, mask=ok).to(tl.float32)
        tl.store(v_out + (r * HKV + h) * D + d, value, mask=ok)
        if TO_PAGES:
            tl.store(v_cache + _page_offsets(kv_rows, r, h, d, page_stride, HKV, D, PAGE),
                     value.to(v_cache.dtype.element_ty), mask=ok)
    x = tl.load(src + d, mask=ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * inv_rms * (1.0 + tl.load(weight + d, mask=ok, other=0.0).to(tl.float32))
    half: tl.constexpr = ROTARY // 2
    rotated = d < ROTARY
    partner = tl.where(d < half, d + half, d - half)
    xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
    yp = xp * inv_rms * (1.0 + tl.load(weight + partner, mask=rotated, other=0.0).to(tl.float32))
    angle = tl.load(positions + r).to(tl.float32) * tl.load(inv_freq + d % half, mask=rotated, other=0.0)
    turned = y * tl.cos(angle) + tl.where(d < half, -yp, yp) * tl.sin(angle)
    result = tl.where(rotated, turned, y)
    tl.store(dst + d, result, mask=ok)
    if TO_PAGES:
        if j >= HQ:
            tl.store(k_cache + _page_offsets(kv_rows, r, j - HQ, d, page_stride, HKV, D, PAGE),
                     result.to(k_cache.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["batch"])  # one compile for every batch size
def _sigmoid_mul_kernel(attn, qkv, qkv_stride, out, out_stride, batch, HQ, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (row, query head); a padding row loads zeros and so stores zeros."""
    r, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    live = ok & (r < batch)
    a = tl.load(attn + (r * HQ + h) * D + d, mask=live, other=0.0).to(tl.float32)
    gate = tl.load(qkv + r * qkv_stride + h * 2 * D + D + d, mask=live, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + h * D + d, (a * _sigmoid(gate)).to(out.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["live"])  # one compile for every batch size
def _silu_mul_kernel(gate_up, in_stride, out, out_stride, n_cols, live, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Row r's column block; rows from ``live`` on are padding: zeros, nothing read."""
    pdl.begin(PDL)
    r, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    if r >= live:
        tl.store(out + r * out_stride + cols, tl.zeros([BLOCK], out.dtype.element_ty), mask=ok)
        return
    gate = tl.load(gate_up + r * in_stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up + r * in_stride + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out + r * out_stride + cols, (gate * _sigmoid(gate) * up).to(out.dtype.element_ty), mask=ok)


def _rows_of(t: torch.Tensor, name: str, cols: int) -> None:
    """``t`` must be [rows, >= cols] with unit column stride (a row may be a slice of a wider fused output)."""
    if t.dim() != 2 or t.shape[1] < cols or t.stride(1) != 1:
        raise ValueError(f"{name} must be [rows, {cols}] with contiguous columns; got {tuple(t.shape)}, "
                         f"strides {t.stride()}")


def add_rms_norm(*, x: torch.Tensor, delta: torch.Tensor | Parts | None, weight: torch.Tensor, eps: float,
                 out_dtype: torch.dtype, live: int | None = None) -> torch.Tensor:
    """As the reference. ``live``: the rows before it are the batch's, the rest padding (default: all live); a
    padding row's output is zeros and its x and delta are neither read nor written (a decode step keeps them
    zero). ``delta`` may be a split gemm's K parts not yet added (``Parts``): they are added here, in the order and
    to the dtype the gemm's own second launch would (``gemm.linear(unsummed=True)``), so x gets the same bits."""
    rows, cols = x.shape
    _rows_of(x, "x", cols)
    if x.dtype != torch.float32:
        raise ValueError(f"x (the residual stream) must be float32; got {x.dtype}")
    parts = delta if isinstance(delta, Parts) else None
    if parts is not None:
        delta = parts.sums
        if delta.dim() != 3 or delta.dtype != torch.float32 or delta.stride(2) != 1:
            raise ValueError(f"a delta's parts must be float32 [split, {rows}, {cols}], contiguous along a row; got "
                             f"{delta.dtype} {tuple(delta.shape)}")
    if delta is not None and tuple(delta.shape[-2:]) != (rows, cols):
        raise ValueError(f"delta must be [{rows}, {cols}] like x; got {tuple(delta.shape)}")
    out = x.new_empty(rows, cols, dtype=out_dtype)
    if rows:
        split = {} if parts is None else {"PARTS": delta.shape[0], "PART_DTYPE": _TRITON_DTYPES[parts.dtype]}
        _add_rms_norm_kernel[(rows,)](x, x if delta is None else delta, weight, out, cols, x.stride(0),
                                      0 if delta is None else delta.stride(-2), 0 if parts is None else delta.stride(0),
                                      out.stride(0), eps, rows if live is None else live, HAS_DELTA=delta is not None,
                                      BLOCK=triton.next_power_of_2(cols), **split, **pdl.options())
    return out



def _gdn_rows_setup(conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: int, heads: tuple[int, int],
                    head_dims: tuple[int, int], pending_pool, pending_slots, pending_rows) -> tuple:
    """The rows' output, the pending arguments a kernel takes, and whether there are pending rows to store."""
    (hk, hv), (dk, dv) = heads, head_dims
    width = 2 * hk * dk + hv * dv + 2 * hv
    if a.stride() != b.stride() or a.shape[0] < batch or b.shape[0] < batch:
        raise ValueError("a and b must be [>= B, Hv] slices of one fused output (the same strides)")
    out = conv.new_empty(batch, width, dtype=torch.float32)
    if pending_pool is None:
        return out, (out, 0, out, out), False
    if pending_pool.shape[2] != width or pending_pool.stride()[1:] != (width, 1):
        raise ValueError(f"pending_pool must be [slots, 63, {width}] with contiguous rows; got "
                         f"{tuple(pending_pool.shape)}, strides {pending_pool.stride()}")
    return out, (pending_pool, pending_pool.stride(0), pending_slots, pending_rows), True


def gdn_rows(*, conv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
             heads: tuple[int, int], head_dims: tuple[int, int], pending_pool: torch.Tensor | None = None,
             pending_slots: torch.Tensor | None = None, pending_rows: torch.Tensor | None = None) -> torch.Tensor:
    """As the reference; with ``pending_pool`` [slots, 63, width] also stores row b at
    ``pending_pool[pending_slots[b], pending_rows[b]]``."""
    (hk, hv), (dk, dv) = heads, head_dims
    batch = conv.shape[0]
    key_dim, value_dim = hk * dk, hv * dv
    _rows_of(conv, "conv", 2 * key_dim + value_dim)
    out, pending, has_pending = _gdn_rows_setup(conv, a, b, batch, heads, head_dims, pending_pool, pending_slots,
                                          pending_rows)
    if batch:
        _gdn_rows_kernel[(batch, hk + hv)](
            conv, conv.stride(0), a, b, a.stride(0), A_log, dt_bias, out, *pending, hk, hv, key_dim, value_dim,
            out.shape[1], _SOFTPLUS_THRESHOLD, DK=dk, DV=dv, HAS_PENDING=has_pending)
    return out


def check_decode_conv(x: torch.Tensor, conv_weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor,
                      channels: int) -> int:
    """A decode step's conv inputs (``conv_gdn_rows``'), checked; returns the conv's width W."""
    _rows_of(x, "x", channels)
    window = conv_weight.shape[1]
    if conv_weight.shape[0] != channels or window < 2 or conv_weight.stride(1) != 1:
        raise ValueError(f"conv_weight must be [{channels}, W >= 2] with contiguous taps; got "
                         f"{tuple(conv_weight.shape)}, strides {conv_weight.stride()}")
    if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != (channels, window - 1) or conv_pool.stride(2) != 1:
        raise ValueError(f"conv_pool must be [slots, {channels}, {window - 1}] with contiguous columns; got "
                         f"{tuple(conv_pool.shape)}, strides {conv_pool.stride()}")
    if tuple(slots.shape) != (x.shape[0],):
        raise ValueError(f"slots must be [{x.shape[0]}]; got {tuple(slots.shape)}")
    return window


def conv_gdn_rows(*, x: torch.Tensor, conv_weight: torch.Tensor, conv_pool: torch.Tensor, slots: torch.Tensor,
                  a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, heads: tuple[int, int],
                  head_dims: tuple[int, int], pending_pool: torch.Tensor | None = None,
                  pending_slots: torch.Tensor | None = None, pending_rows: torch.Tensor | None = None) -> torch.Tensor:
    """The decode step's conv and prepared rows in one launch: ``causal_conv1d_update(x=x, weight=conv_weight,
    conv_pool=conv_pool, slot_indices=slots, activation="silu")`` (each slot's conv state advanced in place), then
    ``gdn_rows`` of its output (the same arithmetic and bits; the conv output never goes to memory).
    x [B, 2*Hk*K + Hv*V] (a column slice of the fused projection); conv_weight [C, W]; conv_pool [slots, C, W - 1]
    with unit column stride; ``slots`` [B] distinct."""
    (hk, hv), (dk, dv) = heads, head_dims
    key_dim, value_dim = hk * dk, hv * dv
    batch = x.shape[0]
    window = check_decode_conv(x, conv_weight, conv_pool, slots, 2 * key_dim + value_dim)
    out, pending, has_pending = _gdn_rows_setup(x, a, b, batch, heads, head_dims, pending_pool, pending_slots,
                                                pending_rows)
    if batch:
        _conv_gdn_rows_kernel[(batch, hk + hv)](
            x, x.stride(0), conv_weight, conv_weight.stride(0), conv_pool, conv_pool.stride(0), conv_pool.stride(1),
            slots, a, b, a.stride(0), A_log, dt_bias, out, *pending, hk, hv, key_dim, value_dim, out.shape[1],
            _SOFTPLUS_THRESHOLD, CONV_W=window, BLOCK_W=triton.next_power_of_2(window - 1), DK=dk, DV=dv,
            HAS_PENDING=has_pending, **pdl.options())
    return out


def gated_rms_norm(*, core: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, rows: int,
                   out_dtype: torch.dtype) -> torch.Tensor:
    batch, hv, dv = core.shape
    _rows_of(z, "z", hv * dv)
    out = z.new_empty(rows, hv * dv, dtype=out_dtype)
    if rows:
        _gated_rms_norm_kernel[(rows, hv)](core.contiguous(), z, z.stride(0), weight, out, out.stride(0), batch, hv,
                                           eps, DV=dv, BLOCK=triton.next_power_of_2(dv), **pdl.options())
    return out


def qk_norm_rope(*, qkv: torch.Tensor, batch: int, positions: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, inv_freq: torch.Tensor, eps: float, heads: tuple[int, int],
                 head_dim: int, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None,
                 kv_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """As the reference; with ``k_cache``, ``v_cache`` [pages, page_size, Hkv, D] and ``kv_rows`` [batch] (``page *
    page_size + offset``, distinct) also writes each row's key and value into the caches in the same launch:
    ``write_kv_pages(k_cache=..., v_cache=..., k=k, v=v, slot_mapping=kv_rows)``'s bits."""
    hq, hkv = heads
    _rows_of(qkv, "qkv", (2 * hq + 2 * hkv) * head_dim)
    rotary = 2 * inv_freq.shape[0]
    if not 0 < rotary <= head_dim:
        raise ValueError(f"the rotary width 2 * len(inv_freq) = {rotary} must be in (0, head_dim={head_dim}]")
    to_pages = k_cache is not None
    if to_pages != (v_cache is not None) or to_pages != (kv_rows is not None):
        raise ValueError("k_cache, v_cache and kv_rows go together: pass all three or none")
    if to_pages and (k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (hkv, head_dim)
                     or k_cache.stride() != v_cache.stride() or k_cache.stride()[1:] != (hkv * head_dim, head_dim, 1)
                     or tuple(kv_rows.shape) != (batch,)):
        raise ValueError(f"k_cache and v_cache must be [pages, page_size, {hkv}, {head_dim}] alike, contiguous below "
                         f"the page, and kv_rows [{batch}]; got {tuple(k_cache.shape)} strides {k_cache.stride()}, "
                         f"{tuple(v_cache.shape)} strides {v_cache.stride()}, kv_rows {tuple(kv_rows.shape)}")
    q = qkv.new_empty(batch, hq, head_dim, dtype=torch.float32)
    k, v = (qkv.new_empty(batch, hkv, head_dim, dtype=torch.float32) for _ in range(2))
    if batch:
        caches = (k_cache, v_cache, kv_rows, k_cache.stride(0), k_cache.shape[1]) if to_pages else (q, q, q, 0, 1)
        _qk_norm_rope_kernel[(batch, hq + hkv)](qkv, qkv.stride(0), positions, q_weight, k_weight, inv_freq, q, k, v,
                                                hq, hkv, eps, *caches[:4], D=head_dim, ROTARY=rotary,
                                                BLOCK_D=triton.next_power_of_2(head_dim), PAGE=caches[4],
                                                TO_PAGES=to_pages, **pdl.options())
    return q, k, v


def sigmoid_mul(*, attn: torch.Tensor, qkv: torch.Tensor, heads: int, head_dim: int, rows: int,
                out_dtype: torch.dtype) -> torch.Tensor:
    batch = attn.shape[0]
    _rows_of(qkv, "qkv", 2 * heads * head_dim)
    out = attn.new_empty(rows, heads * head_dim, dtype=out_dtype)
    if rows:
        _sigmoid_mul_kernel[(rows, heads)](attn.contiguous(), qkv, qkv.stride(0), out, out.stride(0), batch, heads,
                                           D=head_dim, BLOCK_D=triton.next_power_of_2(head_dim))
    return out


def silu_mul(*, gate_up: torch.Tensor, out_dtype: torch.dtype, live: int | None = None) -> torch.Tensor:
    """``SiLU(gate) * up`` of ``gate_up`` [rows, 2n] (gate | up: the MLP's fused projection, ``FusedProjection``);
    rows from ``live`` on are padding (default: none): zeros, not read."""
    rows, width = gate_up.shape
    _rows_of(gate_up, "gate_up", width)
    n_cols = width // 2
    out = gate_up.new_empty(rows, n_cols, dtype=out_dtype)
    block = min(1024, triton.next_power_of_2(n_cols))
    if rows:
        _silu_mul_kernel[(rows, triton.cdiv(n_cols, block))](gate_up, gate_up.stride(0), out, out.stride(0), n_cols,
                                                              rows if live is None else live, BLOCK=block,
                                                              **pdl.options())
    return out
